package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/websocket"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PortForward reaches port of the pod through CRI PortForward, as
// `kubectl port-forward` does through kubelet: it asks for a streaming
// URL, connects to containerd's streaming server over a websocket
// (Kubernetes' port-forward protocol: channel 0 carries the data, channel
// 1 errors, each opening with the port as two little-endian bytes), sends
// req, and returns what the pod sent until the server closed the stream.
// Text on the error channel is returned as an error.
func (c *CRI) PortForward(ctx context.Context, podID string, port int, req string) (string, error) {
	resp, err := c.RuntimeServiceClient.PortForward(ctx, &runtime.PortForwardRequest{PodSandboxId: podID, Port: []int32{int32(port)}})
	if err != nil {
		return "", fmt.Errorf("CRI PortForward: %w", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return "", fmt.Errorf("streaming URL %q: %w", resp.Url, err)
	}
	raw, err := dialInNetns(ctx, c.netnsPath, u.Host)
	if err != nil {
		return "", fmt.Errorf("connecting to the streaming server %s: %w", u.Host, err)
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	wsURL := *u
	wsURL.Scheme = "ws"
	wsURL.RawQuery = "port=" + strconv.Itoa(port)
	cfg, err := websocket.NewConfig(wsURL.String(), "http://localhost/")
	if err != nil {
		return "", err
	}
	cfg.Protocol = []string{"v4.channel.k8s.io"}
	ws, err := websocket.NewClient(cfg, raw)
	if err != nil {
		return "", fmt.Errorf("websocket handshake with %s: %w", resp.Url, err)
	}
	defer ws.Close()
	if err := websocket.Message.Send(ws, append([]byte{0}, req...)); err != nil {
		return "", fmt.Errorf("sending to port %d: %w", port, err)
	}
	var data, errText strings.Builder
	seen := map[byte]bool{} // channels whose port prefix was read
	for {
		var msg []byte
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return data.String(), fmt.Errorf("reading port %d (received so far %q): %w", port, data.String(), err)
		}
		if len(msg) == 0 {
			continue
		}
		ch, body := msg[0], msg[1:]
		if !seen[ch] {
			seen[ch] = true
			if len(body) < 2 {
				return data.String(), fmt.Errorf("port-forward channel %d opened with %d bytes, want the port's 2", ch, len(body))
			}
			body = body[2:]
		}
		switch ch {
		case 0:
			data.Write(body)
		case 1:
			errText.Write(body)
		}
	}
	if errText.Len() > 0 {
		return data.String(), fmt.Errorf("port-forward to port %d: %s", port, errText.String())
	}
	return data.String(), nil
}

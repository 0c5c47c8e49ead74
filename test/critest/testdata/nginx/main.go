// Command nginx stands in for nginx in critest's web server images: what
// the specs look at is an HTTP server answering 200, a process named nginx
// whose pid is in /var/run/nginx.pid, and "master process" on its command
// line (as nginx's master rewrites its own). Run it as
// `nginx [-listen :80] -g 'daemon off; master process'`.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", ":80", "address to serve on")
	root := flag.String("root", "/usr/share/nginx/html", "document root")
	flag.String("g", "", "nginx's global directives (ignored)")
	flag.Parse()
	if err := os.MkdirAll("/var/run", 0o755); err == nil {
		os.WriteFile("/var/run/nginx.pid", []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGQUIT)
	go func() {
		<-sig
		os.Exit(0)
	}()
	fmt.Fprintf(os.Stderr, "nginx: serving %s on %s\n", *root, *listen)
	if err := http.ListenAndServe(*listen, http.FileServer(http.Dir(*root))); err != nil {
		fmt.Fprintf(os.Stderr, "nginx: %v\n", err)
		os.Exit(1)
	}
}

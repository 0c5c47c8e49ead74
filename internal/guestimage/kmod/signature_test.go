package kmod

import (
	"bytes"
	"testing"
)

func TestStripSignature(t *testing.T) {
	body := []byte("\x7fELF module body")
	sig := bytes.Repeat([]byte{0xAB}, 300)
	info := make([]byte, 12)
	info[10], info[11] = byte(len(sig)>>8), byte(len(sig))
	signed := append(append(append(append([]byte{}, body...), sig...), info...), sigMagic...)

	got, ok := StripSignature(signed)
	if !ok || !bytes.Equal(got, body) {
		t.Fatalf("stripped = %q (%v), want %q", got, ok, body)
	}
	if got, ok := StripSignature(body); ok || !bytes.Equal(got, body) {
		t.Fatalf("unsigned module changed: %q %v", got, ok)
	}
	// A length that points before the start is left alone, not sliced.
	bad := append(append(append([]byte{}, body...), 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff), sigMagic...)
	if got, ok := StripSignature(bad); ok || !bytes.Equal(got, bad) {
		t.Fatalf("corrupt signature trailer was stripped")
	}
}

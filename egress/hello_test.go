package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// clientHello captures the first flight a Go TLS client sends (one record
// holding its ClientHello).
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.HandshakeContext(ctx)
	}()
	_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+(int(hdr[3])<<8|int(hdr[4])))
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

// refragment splits the handshake payload of a single-record ClientHello
// into records of at most size bytes.
func refragment(rec []byte, size int) []byte {
	payload := rec[5:]
	var out []byte
	for len(payload) > 0 {
		n := min(size, len(payload))
		out = append(out, recordHandshake, rec[1], rec[2], byte(n>>8), byte(n))
		out = append(out, payload[:n]...)
		payload = payload[n:]
	}
	return out
}

func helloSNI(b []byte) (string, bool, error) {
	return readClientHello(bufio.NewReaderSize(bytes.NewReader(b), inspectBufSize))
}

func TestReadClientHello(t *testing.T) {
	rec := clientHello(t, "allowed.test")
	for _, size := range []int{1 << 14, 100, 7, 1} {
		sni, has, err := helloSNI(append(refragment(rec, size), "trailing"...))
		if err != nil || !has || sni != "allowed.test" {
			t.Errorf("fragments of %d: %q %v %v", size, sni, has, err)
		}
	}
	// Inspection only peeks: the reader still yields every byte.
	br := bufio.NewReaderSize(bytes.NewReader(rec), inspectBufSize)
	if _, _, err := readClientHello(br); err != nil {
		t.Fatal(err)
	}
	if all, _ := io.ReadAll(br); !bytes.Equal(all, rec) {
		t.Error("readClientHello consumed bytes")
	}

	if sni, has, err := helloSNI(clientHello(t, "")); err != nil || has || sni != "" {
		t.Errorf("no SNI: %q %v %v", sni, has, err)
	}

	bad := map[string][]byte{
		"http":        []byte("GET / HTTP/1.1\r\n\r\n"),
		"alert":       {21, 3, 1, 0, 2, 2, 40},
		"zero record": {22, 3, 1, 0, 0},
		"huge record": {22, 3, 1, 0x48, 0},
		"bad version": append([]byte{22, 2, 0}, rec[3:]...),
		"server msg":  append(append([]byte{}, rec[:5]...), append([]byte{2}, rec[6:]...)...),
		"truncated":   rec[:len(rec)-10],
		"ccs inside":  append(refragment(rec, 50)[:55], 20, 3, 3, 0, 1, 1),
		"garbage":     bytes.Repeat([]byte{0x16, 0x03, 0x01, 0x00, 0x01, 0xff}, 10),
	}
	for name, b := range bad {
		if _, _, err := helloSNI(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A hello longer than the inspection buffer is refused, not buffered.
	big := []byte{22, 3, 1, 0x40, 0}
	msg := append([]byte{1, 0, 0x80, 0}, make([]byte, 1<<14-4)...)
	big = append(big, msg...)
	for len(big) < 3*inspectBufSize {
		big = append(big, 22, 3, 1, 0x40, 0)
		big = append(big, make([]byte, 1<<14)...)
	}
	if _, _, err := helloSNI(big); err == nil {
		t.Error("oversized hello accepted")
	}
}

func FuzzClientHello(f *testing.F) {
	rec := clientHello(f, "allowed.test")
	f.Add(rec)
	f.Add(refragment(rec, 9))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(b), inspectBufSize)
		_, _, _ = readClientHello(br)
		if all, _ := io.ReadAll(br); !bytes.Equal(all, b) {
			t.Fatal("inspection consumed bytes")
		}
	})
}

package procs

import (
	"io"
	"testing"
	"time"
)

// TestMarkReaderPassesOutputOn: output without a newline is sent as it
// comes; only a tail that could begin the mark waits for more.
func TestMarkReaderPassesOutputOn(t *testing.T) {
	mark := []byte("\x1eabcdef\x1f")
	pr, pw := io.Pipe()
	stop := make(chan struct{})
	defer close(stop)
	m := newMarkReader(pr, mark, 1<<10, stop)
	next := func() string {
		select {
		case ev := <-m.ch:
			return string(ev.data)
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
			return ""
		}
	}
	pw.Write([]byte("half a line"))
	if got := next(); got != "half a line" {
		t.Fatalf("got %q", got)
	}
	pw.Write([]byte("more\x1eabc"))
	if got := next(); got != "more" {
		t.Fatalf("got %q, want the part before a possible mark", got)
	}
	pw.Write([]byte("x")) // not the mark after all
	if got := next(); got != "\x1eabcx" {
		t.Fatalf("got %q", got)
	}
	pw.Close()
}

func TestMarkPrefixTail(t *testing.T) {
	mark := []byte("\x1eab\x1f")
	for in, want := range map[string]int{"": 0, "x": 0, "x\x1e": 1, "x\x1ea": 2, "\x1eab": 3, "a\x1e": 1} {
		if got := markPrefixTail([]byte(in), mark); got != want {
			t.Errorf("%q: %d, want %d", in, got, want)
		}
	}
}

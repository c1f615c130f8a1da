package streams

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"testing"
)

func TestRingKeepsLastBytes(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	for size := 1; size < 40; size += 7 {
		r := ring{buf: make([]byte, size)}
		var all []byte
		for i := 0; i < 50; i++ {
			p := make([]byte, rnd.Intn(3*size))
			rnd.Read(p)
			r.write(p)
			all = append(all, p...)
			want := all
			if len(want) > size {
				want = want[len(want)-size:]
			}
			if got := r.bytes(); !bytes.Equal(got, want) {
				t.Fatalf("size %d step %d: got %x want %x", size, i, got, want)
			}
		}
	}
}

func TestHubReplayFanoutAndSlowViewer(t *testing.T) {
	h := NewHub(8, 2)
	h.Write([]byte("0123456789"))
	fast, _ := h.Attach()
	if got := string(<-fast.C); got != "23456789" {
		t.Fatalf("replay %q", got)
	}
	slow, _ := h.Attach()
	<-slow.C // replay
	for i := 0; i < 5; i++ {
		h.Write([]byte(fmt.Sprint(i)))
		if got := string(<-fast.C); got != fmt.Sprint(i) {
			t.Fatalf("fast got %q", got)
		}
	}
	<-slow.Done()
	if !errors.Is(slow.Err(), ErrSlowViewer) {
		t.Fatalf("slow viewer err %v", slow.Err())
	}
	if n, _ := h.Viewers(); n != 1 {
		t.Fatalf("viewers %d", n)
	}
	h.Close()
	for range fast.C {
	}
	if !errors.Is(fast.Err(), ErrClosed) {
		t.Fatalf("fast err %v", fast.Err())
	}
	// Attaching after the end still replays.
	late, _ := h.Attach()
	if got := string(<-late.C); got != string(h.ring.bytes()) {
		t.Fatalf("late replay %q", got)
	}
}

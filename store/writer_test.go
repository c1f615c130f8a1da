package store

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A batch that cannot be written (the disk full) is kept and written once
// writing works again; nothing is lost, order is kept.
func TestWriterKeepsFailedBatches(t *testing.T) {
	var mu sync.Mutex
	full := true
	var written []int
	var reports []error
	w := newWriter("items", func(ctx context.Context, items []int) error {
		mu.Lock()
		defer mu.Unlock()
		if full {
			return syscall.ENOSPC
		}
		written = append(written, items...)
		return nil
	}, func(err error) {
		mu.Lock()
		reports = append(reports, err)
		mu.Unlock()
	})
	for i := range 10 {
		w.put(i)
	}
	if err := w.flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(written) != 0 || len(reports) == 0 || !errors.Is(reports[0], syscall.ENOSPC) {
		t.Fatalf("written %v, reports %v", written, reports)
	}
	full = false
	mu.Unlock()
	w.put(10)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(written)
		mu.Unlock()
		if n == 11 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("written %v", written)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.close()
	for i, v := range written {
		if v != i {
			t.Fatalf("order: %v", written)
		}
	}
}

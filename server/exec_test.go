package server

import (
	"bytes"
	"testing"
)

func TestCappedOutput(t *testing.T) {
	o := newCappedOutput(10)
	out, errw := o.writer(&o.stdout), o.writer(&o.stderr)
	write := func(w capWriter, s string) {
		t.Helper()
		n, err := w.Write([]byte(s))
		if err != nil || n != len(s) {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil (writers always drain)", s, n, err, len(s))
		}
	}
	write(out, "abcd") // 4 kept, 6 left
	if o.truncated {
		t.Fatal("truncated too early")
	}
	write(errw, "EFG")  // 3 kept, 3 left
	write(out, "hijkl") // 3 kept ("hij"), 0 left
	if !o.truncated {
		t.Fatal("not truncated after exceeding the cap")
	}
	write(errw, "MORE") // nothing kept
	write(out, "")
	if got := o.stdout.String(); got != "abcdhij" {
		t.Errorf("stdout = %q, want %q", got, "abcdhij")
	}
	if got := o.stderr.String(); got != "EFG" {
		t.Errorf("stderr = %q, want %q", got, "EFG")
	}
	if n := o.stdout.Len() + o.stderr.Len(); n != 10 {
		t.Errorf("kept %d bytes, want exactly 10", n)
	}

	// Exactly at the cap is not truncated.
	o = newCappedOutput(5)
	w := o.writer(&o.stdout)
	w.Write([]byte("12345"))
	if o.truncated || o.stdout.String() != "12345" {
		t.Errorf("exact fit: %q truncated=%v", o.stdout.String(), o.truncated)
	}
	w.Write([]byte("6"))
	if !o.truncated || o.stdout.String() != "12345" {
		t.Errorf("one past: %q truncated=%v", o.stdout.String(), o.truncated)
	}

	// Concurrent writers share the cap (run with -race).
	o = newCappedOutput(1000)
	done := make(chan struct{})
	for _, b := range []*bytes.Buffer{&o.stdout, &o.stderr} {
		go func() {
			w := o.writer(b)
			for range 200 {
				w.Write([]byte("0123456789"))
			}
			done <- struct{}{}
		}()
	}
	<-done
	<-done
	if n := o.stdout.Len() + o.stderr.Len(); n != 1000 || !o.truncated {
		t.Errorf("concurrent: kept %d, truncated=%v", n, o.truncated)
	}
}

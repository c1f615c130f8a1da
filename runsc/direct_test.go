package runsc

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"
)

// directPipes is a DirectProcess's output side on plain pipes (no runsc):
// the write ends stand for the command and its background children.
func directPipes(t *testing.T) (p *DirectProcess, outW, errW *os.File) {
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { outR.Close(); outW.Close(); errR.Close(); errW.Close() })
	p = &DirectProcess{stdout: outR, stderr: errR, out: &drainReader{f: outR}, errOut: &drainReader{f: errR}, done: make(chan struct{})}
	return p, outW, errW
}

// What the command wrote before it ended is read however far behind the
// reader is (it waited for a slow client or the session's scrubbing
// budget), and the streams still end although a background child holds
// the pipes open. Before: the pipes were closed 250 ms after the command
// ended, and what they held was lost.
func TestDirectOutputDrainedAfterExit(t *testing.T) {
	p, outW, _ := directPipes(t)
	want := bytes.Repeat([]byte("last words "), 5000) // 55 KB: fits the pipe
	if _, err := outW.Write(want); err != nil {
		t.Fatal(err)
	}
	p.outputEnds()
	time.Sleep(3 * drainAfter) // the reader is held back past the deadline
	st := time.Now()
	got, err := io.ReadAll(p.Stdout())
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes of %d (%v)", len(got), len(want), err)
	}
	if _, err := io.ReadAll(p.Stderr()); err != nil || time.Since(st) > 2*time.Second {
		t.Fatalf("stderr: %v after %v", err, time.Since(st))
	}
}

// A reader waiting on an empty pipe that a background child holds open
// ends drainAfter after the command; one that keeps writing is read for
// at most drainMax.
func TestDirectOutputEndsWithBackgroundChild(t *testing.T) {
	p, outW, errW := directPipes(t)
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(p.Stdout())
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // blocked in Read
	p.outputEnds()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader on a pipe held open did not end")
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a background child writing on and on
		b := bytes.Repeat([]byte("y\n"), 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := errW.Write(b); err != nil {
				return
			}
		}
	}()
	time.Sleep(2 * drainAfter)
	n, err := io.Copy(io.Discard, p.Stderr())
	if err != nil || n > drainMax+1<<20 {
		t.Fatalf("read %d bytes from a child that writes on: %v", n, err)
	}
	_ = outW
}

// Close under a reader ends it with EOF.
func TestDirectOutputClose(t *testing.T) {
	p, _, _ := directPipes(t)
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(p.Stdout())
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	p.stdout.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

package store

import (
	"context"
	"fmt"
	"sync"
	"time"
)

const (
	writeBuffer   = 4096 // items queued per writer before put waits
	writeBatch    = 256  // items per transaction at most
	writeInterval = 50 * time.Millisecond
	writeMaxWait  = 100 * time.Millisecond // how long put waits on a full buffer
	// A batch that cannot be written (the disk is full) is kept, up to
	// maxPending items, and tried again every retryEvery and before the
	// next batch, so a full disk loses nothing once space is freed.
	maxPending = 1 << 16
	retryEvery = 2 * time.Second
)

// writer writes items of one kind (audit records, session events) in the
// background: it batches them into one transaction every writeInterval or
// every writeBatch items, retries a failed batch a few times, and is drained
// by close. It is owned by the DB; its one goroutine ends in close.
type writer[T any] struct {
	what   string // plural noun for errors: "audit records"
	write  func(ctx context.Context, items []T) error
	report func(error)

	mu     sync.RWMutex // guards closed against sends on a closed channel
	closed bool
	ch     chan writeItem[T]
	done   chan struct{}
}

// writeItem is either an item or, when flush is non-nil, a flush marker that
// the writer closes once everything before it is written.
type writeItem[T any] struct {
	v     T
	flush chan struct{}
}

func newWriter[T any](what string, write func(context.Context, []T) error, report func(error)) *writer[T] {
	w := &writer[T]{what: what, write: write, report: report,
		ch: make(chan writeItem[T], writeBuffer), done: make(chan struct{})}
	go w.loop()
	return w
}

// put enqueues v. It never drops an item: if the buffer stays full for
// writeMaxWait it writes synchronously instead, and after close it also
// writes synchronously (which fails once the database is closed; the error
// is reported).
func (w *writer[T]) put(v T) {
	it := writeItem[T]{v: v}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		w.writeSync(v)
		return
	}
	select {
	case w.ch <- it:
		w.mu.RUnlock()
		return
	default:
	}
	t := time.NewTimer(writeMaxWait)
	defer t.Stop()
	select {
	case w.ch <- it:
		w.mu.RUnlock()
	case <-t.C:
		w.mu.RUnlock()
		w.writeSync(v)
	}
}

func (w *writer[T]) writeSync(v T) {
	if err := w.write(context.Background(), []T{v}); err != nil {
		w.report(fmt.Errorf("store: write %s (unbuffered): %w", w.what, err))
	}
}

// flush waits until every item enqueued before the call is written.
func (w *writer[T]) flush(ctx context.Context) error {
	done := make(chan struct{})
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return nil // close has drained (or is draining) everything
	}
	select {
	case w.ch <- writeItem[T]{flush: done}:
		w.mu.RUnlock()
	case <-ctx.Done():
		w.mu.RUnlock()
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close stops accepting items and returns once every queued item is
// written. It must be called once.
func (w *writer[T]) close() {
	w.mu.Lock()
	w.closed = true
	close(w.ch)
	w.mu.Unlock()
	<-w.done
}

// loop batches queued items until ch is closed and drained.
func (w *writer[T]) loop() {
	defer close(w.done)
	batch := make([]T, 0, writeBatch)
	var pending []T // failed batches, oldest first
	var waiters []chan struct{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	flush := func() {
		timer.Stop()
		if len(batch) > 0 || len(pending) > 0 {
			items := append(pending, batch...)
			if err := w.writeRetry(items); err != nil {
				if drop := len(items) - maxPending; drop > 0 {
					w.report(fmt.Errorf("store: %d %s dropped (more than %d could not be written): %w", drop, w.what, maxPending, err))
					clear(items[:drop])
					items = items[drop:]
				}
				pending = items
				retry.Reset(retryEvery)
			} else {
				if len(pending) > 0 {
					w.report(fmt.Errorf("store: %d %s written late (they had failed)", len(pending), w.what))
				}
				clear(items)
				pending = nil
			}
			clear(batch) // drop references
			batch = batch[:0]
		}
		for _, c := range waiters {
			close(c)
		}
		waiters = waiters[:0]
	}
	for {
		select {
		case it, ok := <-w.ch:
			if !ok {
				flush()
				if len(pending) > 0 {
					w.report(fmt.Errorf("store: %d %s lost at close (they could not be written)", len(pending), w.what))
				}
				return
			}
			if it.flush != nil {
				waiters = append(waiters, it.flush)
				flush()
				continue
			}
			batch = append(batch, it.v)
			if len(batch) == 1 {
				timer.Reset(writeInterval)
			}
			if len(batch) >= writeBatch {
				flush()
			}
		case <-timer.C:
			flush()
		case <-retry.C:
			flush()
		}
	}
}

// writeRetry writes a batch, retrying a few times before giving up and
// reporting the error (the caller keeps the batch).
func (w *writer[T]) writeRetry(batch []T) error {
	var err error
	for attempt := range 5 {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		if err = w.write(context.Background(), batch); err == nil {
			return nil
		}
	}
	w.report(fmt.Errorf("store: write %d %s (kept, retried every %v): %w", len(batch), w.what, retryEvery, err))
	return err
}

package store

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
)

// eventsDB opens a real SQLite file with one org and the given sessions;
// OnError fails the test.
func eventsDB(t testing.TB, path string, sids ...string) (*DB, []string) {
	t.Helper()
	ctx := context.Background()
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	db.OnError = func(err error) { t.Errorf("OnError: %v", err) }
	p, _, err := db.CreateOrg(ctx, "o", "u")
	if err != nil {
		t.Fatal(err)
	}
	var pks []string
	for _, sid := range sids {
		s := newSession(p, sid)
		if err := db.InsertSession(ctx, s); err != nil {
			t.Fatal(err)
		}
		pks = append(pks, s.ID)
	}
	return db, pks
}

func entry(i int) []byte { return fmt.Appendf(nil, `{"type":"event","kind":"k","i":%d}`, i) }

func countEvents(t testing.TB, db *DB, pk string) int {
	t.Helper()
	var n int
	if err := db.r.QueryRow(`SELECT COUNT(*) FROM session_events WHERE session_pk = ?`, pk).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkEntries fails unless evs are the entries first..first+len-1 of pk in
// order, with increasing seq.
func checkEntries(t *testing.T, evs []Event, pk string, first, n int) {
	t.Helper()
	if len(evs) != n {
		t.Fatalf("%d events, want %d", len(evs), n)
	}
	for i, e := range evs {
		if string(e.Entry) != string(entry(first+i)) || e.SessionPK != pk || e.Time.IsZero() {
			t.Fatalf("event %d = %+v (%s), want entry %d of %s", i, e, e.Entry, first+i, pk)
		}
		if i > 0 && e.Seq <= evs[i-1].Seq {
			t.Fatalf("seq not increasing: %d then %d", evs[i-1].Seq, e.Seq)
		}
	}
}

// Events are written asynchronously; Close drains the writer, so a clean
// restart loses none.
func TestEventsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ev.db")
	db, pks := eventsDB(t, path, "a", "b")
	for i := range 5 {
		db.AppendEvent(pks[0], entry(i))
		if i%2 == 0 {
			db.AppendEvent(pks[1], entry(100+i))
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	evs, err := db.LastEvents(ctx, pks[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, evs, pks[0], 0, 5)
	evs, _ = db.LastEvents(ctx, pks[0], 2)
	checkEntries(t, evs, pks[0], 3, 2)
	evs, _ = db.LastEvents(ctx, pks[1], 10)
	if len(evs) != 3 || string(evs[2].Entry) != string(entry(104)) {
		t.Fatalf("session b: %d events", len(evs))
	}
	if evs, err := db.LastEvents(ctx, "ses_unknown", 10); err != nil || len(evs) != 0 {
		t.Fatalf("unknown session: %v %v", evs, err)
	}
}

// A session keeps at most EventsKept events, the newest, whether they come
// in one large batch or many small ones, and across a reopen.
func TestEventsBound(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ev.db")
	db, pks := eventsDB(t, path, "a", "b")
	const total = EventsKept + 700
	for i := range total {
		db.AppendEvent(pks[0], entry(i))
		if i%300 == 0 { // many small batches as well as full ones
			if err := db.FlushEvents(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.AppendEvent(pks[1], entry(0))
	if err := db.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, db, pks[0]); n != EventsKept {
		t.Fatalf("session a keeps %d events, want %d", n, EventsKept)
	}
	if n := countEvents(t, db, pks[1]); n != 1 {
		t.Fatalf("session b keeps %d events, want 1", n)
	}
	evs, err := db.LastEvents(ctx, pks[0], EventsKept+1)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, evs, pks[0], total-EventsKept, EventsKept)
	db.Close()

	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := range 10 {
		db.AppendEvent(pks[0], entry(total+i))
	}
	if err := db.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	evs, _ = db.LastEvents(ctx, pks[0], 0)
	checkEntries(t, evs, pks[0], total+10-EventsKept, EventsKept)
}

// Deleting a session row deletes its events; late events of a deleted
// session are discarded without failing the other events of their batch.
func TestEventsCascadeDelete(t *testing.T) {
	ctx := context.Background()
	db, pks := eventsDB(t, filepath.Join(t.TempDir(), "ev.db"), "a", "b")
	defer db.Close()
	for i := range 3 {
		db.AppendEvent(pks[0], entry(i))
		db.AppendEvent(pks[1], entry(i))
	}
	if err := db.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteSessionRow(ctx, pks[0]); err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, db, pks[0]); n != 0 {
		t.Fatalf("%d events left after delete", n)
	}
	db.AppendEvent(pks[0], entry(3)) // same batch as the next one
	db.AppendEvent(pks[1], entry(3))
	if err := db.FlushEvents(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countEvents(t, db, pks[0]); n != 0 {
		t.Fatalf("late event of a deleted session written")
	}
	evs, _ := db.LastEvents(ctx, pks[1], 0)
	checkEntries(t, evs, pks[1], 0, 4)
}

// Concurrent appenders lose nothing across Close and reopen.
func TestEventsConcurrentDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ev.db")
	sids := []string{"s0", "s1", "s2", "s3"}
	db, pks := eventsDB(t, path, sids...)
	const goroutines, per = 40, 150 // 1500 per session
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				db.AppendEvent(pks[g%len(pks)], entry(g*per+i))
			}
		})
	}
	wg.Wait()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, pk := range pks {
		if n := countEvents(t, db, pk); n != goroutines/len(pks)*per {
			t.Fatalf("%s: %d events, want %d", pk, n, goroutines/len(pks)*per)
		}
	}
}

// BenchmarkAppendEvent is the cost on the request path (REST exec emits
// two events per call): an enqueue.
func BenchmarkAppendEvent(b *testing.B) {
	db, pks := eventsDB(b, filepath.Join(b.TempDir(), "ev.db"), "a")
	defer db.Close()
	e := entry(1)
	b.ReportAllocs()
	for b.Loop() {
		db.AppendEvent(pks[0], e)
	}
	b.StopTimer()
	db.FlushEvents(context.Background())
}

// BenchmarkWriteEventsAtBound is the writer's cost for a batch of two
// events of a session already at EventsKept (insert and trim).
func BenchmarkWriteEventsAtBound(b *testing.B) {
	ctx := context.Background()
	db, pks := eventsDB(b, filepath.Join(b.TempDir(), "ev.db"), "a", "b")
	defer db.Close()
	for i := range EventsKept {
		db.AppendEvent(pks[0], entry(i))
		db.AppendEvent(pks[1], entry(i))
	}
	db.FlushEvents(ctx)
	batch := []Event{{SessionPK: pks[0], Time: db.now(), Entry: entry(1)}, {SessionPK: pks[0], Time: db.now(), Entry: entry(2)}}
	for b.Loop() {
		if err := db.writeEvents(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}

// Egress counts noted in the background keep the highest value, and Close
// drains them.
func TestNoteEgressUsed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "eg.db")
	db, pks := eventsDB(t, path, "a")
	for _, n := range []int64{5 << 20, 9 << 20, 7 << 20} {
		db.NoteEgressUsed(pks[0], n)
	}
	db.NoteEgressUsed("ses_unknown", 1) // a deleted session: nothing to update, no error
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ses, err := db.GetSessionByID(context.Background(), pks[0])
	if err != nil || ses.EgressBytesUsed != 9<<20 {
		t.Fatalf("stored %d, %v; want %d", ses.EgressBytesUsed, err, 9<<20)
	}
}

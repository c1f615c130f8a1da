package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTest(t *testing.T) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db, path
}

func TestOpenFileMode(t *testing.T) {
	_, path := openTest(t)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Fatalf("mode = %o, want 600", m)
	}
}

func TestBootstrapAndAuth(t *testing.T) {
	ctx := context.Background()
	db, path := openTest(t)

	p, tok, created, err := db.Bootstrap(ctx, "acme", "alice", "")
	if err != nil || !created || tok == "" {
		t.Fatalf("Bootstrap = %v, %q, %v, %v", p, tok, created, err)
	}
	if len(tok) != 4+43 || tok[:4] != "sbx_" {
		t.Fatalf("token format %q", tok)
	}
	if len(p.Org.ID) != 4+26 || p.Org.ID[:4] != "org_" || p.User.ID[:4] != "usr_" || p.ProjectID[:4] != "prj_" || p.TokenID[:4] != "tok_" {
		t.Fatalf("ids %+v", p)
	}
	if p.Role != RoleOwner {
		t.Fatalf("role %q", p.Role)
	}

	p2, tok2, created2, err := db.Bootstrap(ctx, "other", "bob", "")
	if err != nil || created2 || tok2 != "" || p2.Org.ID != "" {
		t.Fatalf("second Bootstrap = %+v, %q, %v, %v", p2, tok2, created2, err)
	}

	got, err := db.Authenticate(ctx, tok)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if got != p {
		t.Fatalf("Authenticate = %+v, want %+v", got, p)
	}
	tk, err := db.GetToken(ctx, p.Org.ID, p.TokenID)
	if err != nil || tk.LastUsedAt == nil || tk.RevokedAt != nil {
		t.Fatalf("GetToken = %+v, %v", tk, err)
	}
	prj, err := db.GetProject(ctx, p.Org.ID, p.ProjectID)
	if err != nil || prj.OrgID != p.Org.ID {
		t.Fatalf("GetProject = %+v, %v", prj, err)
	}

	if _, err := db.Authenticate(ctx, "sbx_unknown"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}

	// A second token; revoke it.
	t2, sec2, err := db.CreateToken(ctx, p.Org.ID, p.User.ID, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Authenticate(ctx, sec2); err != nil {
		t.Fatal(err)
	}
	if role, err := db.TokenRole(ctx, t2.ID); err != nil || role != RoleOwner {
		t.Fatalf("TokenRole = %q, %v", role, err)
	}
	if err := db.RevokeToken(ctx, p.Org.ID, t2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.TokenRole(ctx, t2.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("TokenRole of a revoked token: %v", err)
	}
	if _, err := db.Authenticate(ctx, sec2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoked token: %v", err)
	}
	if err := db.RevokeToken(ctx, "org_other", t2.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke in wrong org: %v", err)
	}
	toks, err := db.ListTokens(ctx, p.Org.ID, "")
	if err != nil || len(toks) != 2 || toks[1].RevokedAt == nil {
		t.Fatalf("ListTokens = %+v, %v", toks, err)
	}
	if _, _, err := db.CreateToken(ctx, p.Org.ID, "usr_nobody", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("CreateToken for non-member: %v", err)
	}

	// Plain tokens must not be in the database files, only their hashes.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(path); !bytes.Contains(raw, []byte(hashSecret(tok))) {
		t.Fatal("token hash not found in database file; plain-text check would be vacuous")
	}
	for _, f := range []string{path, path + "-wal"} {
		raw, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{tok, sec2, tok[4:], sec2[4:]} {
			if bytes.Contains(raw, []byte(s)) {
				t.Fatalf("plain token found in %s", f)
			}
		}
	}
}

func TestAuthenticateTouchesOncePerMinute(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	now := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	db.Now = func() time.Time { return now }
	p, tok, err := db.CreateOrg(ctx, "o", "u")
	if err != nil {
		t.Fatal(err)
	}
	last := func() time.Time {
		tk, err := db.GetToken(ctx, p.Org.ID, p.TokenID)
		if err != nil || tk.LastUsedAt == nil {
			t.Fatalf("GetToken = %+v, %v", tk, err)
		}
		return *tk.LastUsedAt
	}
	db.Authenticate(ctx, tok)
	if got := last(); !got.Equal(now) {
		t.Fatalf("last used %v, want %v", got, now)
	}
	first := now
	now = now.Add(30 * time.Second)
	db.Authenticate(ctx, tok)
	if got := last(); !got.Equal(first) {
		t.Fatalf("touched too early: %v", got)
	}
	now = now.Add(31 * time.Second)
	db.Authenticate(ctx, tok)
	if got := last(); !got.Equal(now) {
		t.Fatalf("not touched after a minute: %v", got)
	}
}

func TestCreateOrgIndependent(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a, tokA, _, err := db.Bootstrap(ctx, "a", "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	b, tokB, err := db.CreateOrg(ctx, "b", "bob")
	if err != nil {
		t.Fatal(err)
	}
	if a.Org.ID == b.Org.ID || a.User.ID == b.User.ID || a.ProjectID == b.ProjectID || tokA == tokB {
		t.Fatalf("orgs not independent: %+v %+v", a, b)
	}
	pb, err := db.Authenticate(ctx, tokB)
	if err != nil || pb.Org.ID != b.Org.ID || pb.ProjectID != b.ProjectID {
		t.Fatalf("Authenticate B = %+v, %v", pb, err)
	}
	if _, err := db.GetProject(ctx, a.Org.ID, b.ProjectID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cross-org project: %v", err)
	}
	if _, err := db.GetToken(ctx, a.Org.ID, b.TokenID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("cross-org token: %v", err)
	}
	ma, _ := db.ListMembers(ctx, a.Org.ID)
	mb, _ := db.ListMembers(ctx, b.Org.ID)
	if len(ma) != 1 || len(mb) != 1 || ma[0].UserName != "alice" || mb[0].UserName != "bob" {
		t.Fatalf("members %+v %+v", ma, mb)
	}
}

func TestMembers(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, err := db.CreateOrg(ctx, "o", "owner")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := db.AddMember(ctx, p.Org.ID, "x", "root"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad role: %v", err)
	}
	if _, _, _, err := db.AddMember(ctx, "org_missing", "x", RoleViewer); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing org: %v", err)
	}
	u, tk, sec, err := db.AddMember(ctx, p.Org.ID, "dev", RoleDeveloper)
	if err != nil {
		t.Fatal(err)
	}
	if tk.UserID != u.ID || tk.OrgID != p.Org.ID {
		t.Fatalf("token %+v", tk)
	}
	pd, err := db.Authenticate(ctx, sec)
	if err != nil || pd.Role != RoleDeveloper || pd.User.ID != u.ID || pd.ProjectID != p.ProjectID {
		t.Fatalf("Authenticate dev = %+v, %v", pd, err)
	}
	if err := db.SetMemberRole(ctx, p.Org.ID, u.ID, RoleAdmin); err != nil {
		t.Fatal(err)
	}
	if pd, _ := db.Authenticate(ctx, sec); pd.Role != RoleAdmin {
		t.Fatalf("role after set: %q", pd.Role)
	}
	if err := db.SetMemberRole(ctx, p.Org.ID, "usr_nobody", RoleAdmin); !errors.Is(err, ErrNotFound) {
		t.Fatalf("set role of non-member: %v", err)
	}
	if err := db.SetMemberRole(ctx, p.Org.ID, p.User.ID, RoleViewer); !errors.Is(err, ErrConflict) {
		t.Fatalf("demote last owner: %v", err)
	}
	if err := db.RemoveMember(ctx, p.Org.ID, p.User.ID); !errors.Is(err, ErrConflict) {
		t.Fatalf("remove last owner: %v", err)
	}
	ms, err := db.ListMembers(ctx, p.Org.ID)
	if err != nil || len(ms) != 2 || ms[1].UserID != u.ID || ms[1].Role != RoleAdmin {
		t.Fatalf("ListMembers = %+v, %v", ms, err)
	}
	if toks, _ := db.ListTokens(ctx, p.Org.ID, u.ID); len(toks) != 1 {
		t.Fatalf("ListTokens(user) = %+v", toks)
	}
	if err := db.RemoveMember(ctx, p.Org.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Authenticate(ctx, sec); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed member auth: %v", err)
	}
	if toks, _ := db.ListTokens(ctx, p.Org.ID, u.ID); len(toks) != 1 || toks[0].RevokedAt == nil {
		t.Fatalf("tokens of removed member not revoked: %+v", toks)
	}
	if err := db.RemoveMember(ctx, p.Org.ID, u.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
}

func newSession(p Principal, sid string) *Session {
	return &Session{OrgID: p.Org.ID, ProjectID: p.ProjectID, SessionID: sid, CreatedBy: p.User.ID, Size: "small"}
}

func TestSessionConflicts(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a, _, _ := db.CreateOrg(ctx, "a", "u")
	b, _, _ := db.CreateOrg(ctx, "b", "u")

	s := newSession(a, "dev")
	if err := db.InsertSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	if s.ID[:4] != "ses_" || s.Status != StatusProvisioning || s.CreatedAt.IsZero() || s.UpdatedAt.IsZero() {
		t.Fatalf("defaults not filled: %+v", s)
	}
	if err := db.InsertSession(ctx, newSession(a, "dev")); !errors.Is(err, ErrConflict) {
		t.Fatalf("duplicate in org: %v", err)
	}
	if err := db.InsertSession(ctx, newSession(b, "dev")); err != nil {
		t.Fatalf("same id in other org: %v", err)
	}

	s.Status = StatusDeleted
	if err := db.UpdateSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetSession(ctx, a.Org.ID, "dev"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted session: %v", err)
	}
	if err := db.InsertSession(ctx, newSession(a, "dev")); !errors.Is(err, ErrConflict) {
		t.Fatalf("reuse of deleted id: %v", err)
	}

	// DeleteSessionRow frees the id.
	if err := db.DeleteSessionRow(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteSessionRow(ctx, s.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := db.InsertSession(ctx, newSession(a, "dev")); err != nil {
		t.Fatalf("insert after row delete: %v", err)
	}
	if err := db.UpdateSession(ctx, &Session{ID: "ses_missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update missing: %v", err)
	}
}

func TestListSessions(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	now := time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	db.Now = func() time.Time { now = now.Add(time.Second); return now }
	a, _, _ := db.CreateOrg(ctx, "a", "u")
	b, _, _ := db.CreateOrg(ctx, "b", "u")

	statuses := []string{StatusRunning, StatusStopped, StatusRunning, StatusDeleted, StatusPaused}
	for i, st := range statuses {
		s := newSession(a, fmt.Sprintf("s%d", i))
		s.Status = st
		if err := db.InsertSession(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	other := newSession(b, "x")
	other.Status = StatusStopping
	if err := db.InsertSession(ctx, other); err != nil {
		t.Fatal(err)
	}
	ids := func(ss []Session) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.SessionID)
		}
		return out
	}
	all, err := db.ListSessions(ctx, a.Org.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ids(all)); got != "[s4 s2 s1 s0]" {
		t.Fatalf("ListSessions all = %s", got)
	}
	running, _ := db.ListSessions(ctx, a.Org.ID, StatusRunning)
	if got := fmt.Sprint(ids(running)); got != "[s2 s0]" {
		t.Fatalf("ListSessions running = %s", got)
	}
	deleted, _ := db.ListSessions(ctx, a.Org.ID, StatusDeleted)
	if got := fmt.Sprint(ids(deleted)); got != "[s3]" {
		t.Fatalf("ListSessions deleted = %s", got)
	}
	live, _ := db.ListLiveSessions(ctx)
	if got := fmt.Sprint(ids(live)); got != "[s0 s2 s4 x]" {
		t.Fatalf("ListLiveSessions = %s", got)
	}
}

func TestUpdateSessionRoundTrip(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, _ := db.CreateOrg(ctx, "a", "u")
	s := newSession(p, "rt")
	s.RequestedSize, s.VCPUs, s.MemoryMiB, s.DiskMiB, s.Pids = "medium", 2, 2048, 10240, 512
	s.CreditRate = 1500
	s.GitRepo, s.GitBranch = "https://example.com/r.git", "main"
	s.Env = map[string]string{"A": "1", "B": "two words"}
	s.SecretNames = []string{"GH_TOKEN", "NPM"}
	s.IdleTimeoutSeconds = 900
	s.EgressBytesLimit = 1 << 30
	if err := db.InsertSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := db.GetSession(ctx, p.Org.ID, "rt")
	if err != nil {
		t.Fatal(err)
	}
	if !sessionEqual(got, *s) {
		t.Fatalf("after insert:\n got %+v\nwant %+v", got, *s)
	}
	if got.StartedAt != nil || got.StoppedAt != nil {
		t.Fatalf("times should be nil: %+v", got)
	}

	started := time.Date(2030, 1, 1, 0, 0, 0, 123456789, time.FixedZone("x", 3600))
	s.Status, s.ContainerID, s.StartedAt = StatusRunning, "ctr-1", &started
	s.EgressBytesUsed = 12345
	if err := db.UpdateSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, _ = db.GetSession(ctx, p.Org.ID, "rt")
	if !sessionEqual(got, *s) || got.StartedAt == nil || !got.StartedAt.Equal(started) || got.StartedAt.Location() != time.UTC {
		t.Fatalf("after update:\n got %+v\nwant %+v", got, *s)
	}

	stopped := started.Add(time.Hour)
	s.Status, s.StatusReason, s.StoppedAt = StatusStopped, "oom", &stopped
	if err := db.UpdateSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, _ = db.GetSession(ctx, p.Org.ID, "rt")
	if !sessionEqual(got, *s) || got.StoppedAt == nil || !got.StoppedAt.Equal(stopped) {
		t.Fatalf("after stop:\n got %+v\nwant %+v", got, *s)
	}
	s.StartedAt, s.StoppedAt = nil, nil
	if err := db.UpdateSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, _ = db.GetSessionByID(ctx, s.ID)
	if got.StartedAt != nil || got.StoppedAt != nil || !sessionEqual(got, *s) {
		t.Fatalf("after clearing times: %+v", got)
	}

	// nil vs empty env round-trips.
	e := newSession(p, "empty")
	e.Env = map[string]string{}
	db.InsertSession(ctx, e)
	got, _ = db.GetSession(ctx, p.Org.ID, "empty")
	if got.Env == nil || len(got.Env) != 0 || got.SecretNames != nil {
		t.Fatalf("empty env: %#v %#v", got.Env, got.SecretNames)
	}
}

func sessionEqual(a, b Session) bool {
	ta := func(t *time.Time) string {
		if t == nil {
			return "nil"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("%v|%v|%v|%v|%v|%v|%v|%v|%v", a.ID, a.Env, a.SecretNames, a.CreatedAt.Format(time.RFC3339Nano), a.UpdatedAt.Format(time.RFC3339Nano), ta(a.StartedAt), ta(a.StoppedAt), a.CreatedAt == b.CreatedAt, a.UpdatedAt == b.UpdatedAt) ==
		fmt.Sprintf("%v|%v|%v|%v|%v|%v|%v|%v|%v", b.ID, b.Env, b.SecretNames, b.CreatedAt.Format(time.RFC3339Nano), b.UpdatedAt.Format(time.RFC3339Nano), ta(b.StartedAt), ta(b.StoppedAt), true, true) &&
		func() bool {
			a.Env, b.Env, a.SecretNames, b.SecretNames = nil, nil, nil, nil
			a.StartedAt, b.StartedAt, a.StoppedAt, b.StoppedAt = nil, nil, nil, nil
			return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
		}()
}

func TestConcurrentInsertSameSession(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, _ := db.CreateOrg(ctx, "a", "u")
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		ok, confl int
		other     []error
	)
	for range 20 {
		wg.Go(func() {
			err := db.InsertSession(ctx, newSession(p, "race"))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrConflict):
				confl++
			default:
				other = append(other, err)
			}
		})
	}
	wg.Wait()
	if ok != 1 || confl != 19 || len(other) != 0 {
		t.Fatalf("ok=%d conflict=%d other=%v", ok, confl, other)
	}
}

func TestAuditConcurrentDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	var emu sync.Mutex
	db.OnError = func(err error) { emu.Lock(); errs = append(errs, err); emu.Unlock() }
	const goroutines, per = 50, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				db.Audit(AuditRecord{OrgID: "org_a", Action: "test", SessionID: fmt.Sprint(g), Status: i,
					Details: map[string]any{"i": i}})
			}
		})
	}
	wg.Wait()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("audit errors: %v", errs)
	}
	db, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.r.QueryRow(`SELECT COUNT(*) FROM audit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != goroutines*per {
		t.Fatalf("audit rows = %d, want %d", n, goroutines*per)
	}
}

func TestListAudit(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	base := time.Date(2032, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 300 {
		org := "org_a"
		if i%3 == 0 {
			org = "org_b"
		}
		action := "session.create"
		if i%2 == 0 {
			action = "session.exec"
		}
		db.Audit(AuditRecord{Time: base.Add(time.Duration(i) * time.Second), OrgID: org, UserID: "usr_1",
			TokenID: "tok_1", Action: action, SessionID: fmt.Sprintf("s%d", i%5), Outcome: "ok", Status: 200,
			RemoteAddr: "10.0.0.1:1234", RequestID: fmt.Sprintf("req%d", i), Details: map[string]any{"n": i}})
	}
	if err := db.FlushAudit(ctx); err != nil {
		t.Fatal(err)
	}
	recs, err := db.ListAudit(ctx, AuditFilter{})
	if err != nil || len(recs) != 100 {
		t.Fatalf("default limit: %d, %v", len(recs), err)
	}
	if recs[0].RequestID != "req299" || !recs[0].Time.Equal(base.Add(299*time.Second)) || recs[0].Details["n"] != float64(299) {
		t.Fatalf("newest first: %+v", recs[0])
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Time.After(recs[i-1].Time) {
			t.Fatal("not sorted newest first")
		}
	}
	if recs, _ := db.ListAudit(ctx, AuditFilter{Limit: 5000}); len(recs) != 300 {
		t.Fatalf("limit cap: %d", len(recs))
	}
	recs, _ = db.ListAudit(ctx, AuditFilter{OrgID: "org_b", Limit: 1000})
	if len(recs) != 100 {
		t.Fatalf("org filter: %d", len(recs))
	}
	recs, _ = db.ListAudit(ctx, AuditFilter{OrgID: "org_a", SessionID: "s1", Action: "session.create", Limit: 1000})
	for _, r := range recs {
		if r.OrgID != "org_a" || r.SessionID != "s1" || r.Action != "session.create" {
			t.Fatalf("bad filter result %+v", r)
		}
	}
	// i in [0,300): i%3!=0, i%5==1, i odd  =>  i%30 in {1, 11}: 20 records.
	if len(recs) != 20 {
		t.Fatalf("combined filter: %d", len(recs))
	}
	recs, _ = db.ListAudit(ctx, AuditFilter{Since: base.Add(290 * time.Second)})
	if len(recs) != 10 {
		t.Fatalf("since filter: %d", len(recs))
	}
}

func TestAuditAfterFlushVisible(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	db.Audit(AuditRecord{OrgID: "o", Action: "a"})
	if err := db.FlushAudit(ctx); err != nil {
		t.Fatal(err)
	}
	recs, err := db.ListAudit(ctx, AuditFilter{OrgID: "o"})
	if err != nil || len(recs) != 1 || recs[0].Time.IsZero() || recs[0].Details != nil {
		t.Fatalf("ListAudit = %+v, %v", recs, err)
	}
}

func TestMigrationsIdempotent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	var orgID string
	for i := range 3 {
		db, err := Open(path)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		var n, v int
		if err := db.r.QueryRow(`SELECT COUNT(*), MAX(version) FROM schema_migrations`).Scan(&n, &v); err != nil {
			t.Fatal(err)
		}
		if n != len(migrations) || v != len(migrations) {
			t.Fatalf("schema_migrations count=%d max=%d", n, v)
		}
		var mode string
		if err := db.r.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("journal_mode = %q, %v", mode, err)
		}
		var fk int
		if err := db.w.QueryRow(`PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
			t.Fatalf("foreign_keys = %d, %v", fk, err)
		}
		p, _, created, err := db.Bootstrap(ctx, "acme", "alice", "")
		if err != nil {
			t.Fatal(err)
		}
		if (i == 0) != created {
			t.Fatalf("open %d: created=%v", i, created)
		}
		if i == 0 {
			orgID = p.Org.ID
		}
		if ms, err := db.ListMembers(ctx, orgID); err != nil || len(ms) != 1 {
			t.Fatalf("data lost across reopen: %v %v", ms, err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestConcurrentOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.db")
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for range 5 {
		wg.Go(func() {
			db, err := Open(path)
			if err != nil {
				errs <- err
				return
			}
			errs <- db.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestPathWithSpecialChars(t *testing.T) {
	path := filepath.Join(t.TempDir(), "we?ird #dir%x", "s.db")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.CreateOrg(context.Background(), "o", "u"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}

func TestAuditBufferFullFallsBackToSyncWrite(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	// Occupy the only writer connection so the background writer stalls and
	// the buffer fills up.
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = writeBuffer + 1000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			db.Audit(AuditRecord{OrgID: "o", Action: "fill", Status: i})
		}
	}()
	time.Sleep(300 * time.Millisecond)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := db.FlushAudit(ctx); err != nil {
		t.Fatal(err)
	}
	var got int
	if err := db.r.QueryRow(`SELECT COUNT(*) FROM audit`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("audit rows = %d, want %d", got, n)
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "Team 1", "x.y_z-w", strings.Repeat("a", 64)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", " a", "-a", strings.Repeat("a", 65), "a/b", "a\n"} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) = nil", bad)
		}
	}
}

// A save is recorded by SetSaved and survives an UpdateSession of a copy
// read before it.
func TestSetSaved(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	p, _, _ := db.CreateOrg(ctx, "a", "u")
	s := newSession(p, "sv")
	if err := db.InsertSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	stale := *s
	at := time.Date(2030, 1, 1, 0, 0, 0, 5, time.UTC)
	sv := Saved{Object: "sessions/x/disk-1.tar.zst", Bytes: 1234, SHA256: "ab", At: &at, Generation: 1}
	if err := db.SetSaved(ctx, s.ID, sv); err != nil {
		t.Fatal(err)
	}
	stale.Status = StatusRunning
	if err := db.UpdateSession(ctx, &stale); err != nil {
		t.Fatal(err)
	}
	got, _ := db.GetSessionByID(ctx, s.ID)
	if got.Saved.Object != sv.Object || got.Saved.Bytes != 1234 || got.Saved.SHA256 != "ab" || got.Saved.Generation != 1 || !got.Saved.At.Equal(at) {
		t.Fatalf("saved: %+v", got.Saved)
	}
	if err := db.SetSaved(ctx, "ses_missing", sv); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
}

func TestListSessionContainers(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a, _, _ := db.CreateOrg(ctx, "a", "u")
	b, _, _ := db.CreateOrg(ctx, "b", "u")
	want := ""
	for i, st := range []string{StatusProvisioning, StatusRunning, StatusStopped, StatusDeleted, StatusFailed} {
		p := a
		if i%2 == 1 {
			p = b
		}
		s := newSession(p, fmt.Sprint("s", i))
		s.ContainerID, s.Status = fmt.Sprint("c", i), st
		if err := db.InsertSession(ctx, s); err != nil {
			t.Fatal(err)
		}
		want += fmt.Sprintf("%s c%d %s;", s.ID, i, st)
	}
	got, err := db.ListSessionContainers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := ""
	for _, c := range got {
		s += fmt.Sprintf("%s %s %s;", c.ID, c.ContainerID, c.Status)
	}
	if s != want {
		t.Fatalf("ListSessionContainers:\n got %s\nwant %s", s, want)
	}
}

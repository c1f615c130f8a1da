package server

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sys/unix"

	"sandboxd/runsc"
	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

type provisionRequest struct {
	SessionID          string            `json:"sessionId"`
	Size               string            `json:"size"`
	GitRepo            string            `json:"gitRepo"`
	GitBranch          string            `json:"gitBranch"`
	ProjectID          string            `json:"projectId"`
	Env                map[string]string `json:"env"`
	Secrets            map[string]string `json:"secrets"`
	IdleTimeoutSeconds *int              `json:"idleTimeoutSeconds"`
}

func (s *Server) validateProvision(req *provisionRequest) (config.Size, error) {
	if req.SessionID == "" {
		return config.Size{}, errdefs.Invalid("sessionId: required").WithCode("invalid_session_id")
	}
	if !validSessionID(req.SessionID) {
		return config.Size{}, errInvalidSessionID
	}
	size, ok := s.cfg.Sizes.Resolve(req.Size)
	if !ok {
		return config.Size{}, errdefs.Invalid("size: must be one of %s", strings.Join(s.cfg.Sizes.Names(), ", ")).WithCode("invalid_size")
	}
	if req.GitRepo != "" && !validRepo(req.GitRepo) {
		return config.Size{}, errdefs.Invalid("gitRepo: must be owner/name (owner: 1-39 of letters, digits, '-'; name: 1-100 of letters, digits, '.', '_', '-')").WithCode("invalid_repo")
	}
	if req.GitBranch != "" {
		if req.GitRepo == "" {
			return config.Size{}, errdefs.Invalid("gitBranch: needs gitRepo").WithCode("invalid_branch")
		}
		if !validBranch(req.GitBranch) {
			return config.Size{}, errdefs.Invalid("gitBranch: not a valid git branch name").WithCode("invalid_branch")
		}
	}
	if e := checkEnv("env", req.Env); e != nil {
		return config.Size{}, e
	}
	if e := checkEnv("secrets", req.Secrets); e != nil {
		return config.Size{}, e
	}
	for k, v := range req.Secrets {
		if len(v) < scrub.MinValueLen {
			return config.Size{}, badRequest("secrets: value of %s is shorter than %d bytes and cannot be redacted safely; it was not accepted", k, scrub.MinValueLen)
		}
	}
	if t := req.IdleTimeoutSeconds; t != nil && (*t < 0 || *t > 7*24*3600) {
		return config.Size{}, badRequest("idleTimeoutSeconds: must be 0-604800")
	}
	return size, nil
}

// provision: POST /v1/sandbox.
func (s *Server) provision(c *gin.Context) {
	var req provisionRequest
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	size, aerr := s.validateProvision(&req)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	p := principal(c)
	c.Params = append(c.Params, gin.Param{Key: "sessionId", Value: req.SessionID}) // for the audit record
	auditDetail(c, "size", size.Name)
	if req.ProjectID != "" && req.ProjectID != p.ProjectID {
		if _, err := s.db.GetProject(c.Request.Context(), p.Org.ID, req.ProjectID); err != nil {
			s.writeError(c, badRequest("projectId: no such project in your organization"))
			return
		}
	}
	if req.GitRepo != "" {
		// Cloning uses the caller's connected GitHub credential; none is connected.
		s.writeError(c, errdefs.New(errdefs.ErrPrecondition, "gitRepo needs a connected GitHub credential (PUT /v1/me/github); nothing was provisioned").WithCode("github_not_connected"))
		return
	}
	project := req.ProjectID
	if project == "" {
		project = p.ProjectID
	}
	names := make([]string, 0, len(req.Secrets))
	for k := range req.Secrets {
		names = append(names, k)
	}
	sort.Strings(names)
	idle := 0
	if req.IdleTimeoutSeconds != nil {
		idle = *req.IdleTimeoutSeconds
	}
	ses := &store.Session{
		OrgID: p.Org.ID, ProjectID: project, SessionID: req.SessionID, CreatedBy: p.User.ID,
		ContainerID: s.rt.ContainerID(p.Org.ID, req.SessionID), Status: store.StatusProvisioning,
		Size: size.Name, RequestedSize: req.Size, VCPUs: size.VCPUs, MemoryMiB: size.MemoryMiB,
		DiskMiB: size.DiskMiB, Pids: size.Pids, CreditsPerHour: size.CreditsPerHour,
		EgressBytesLimit: size.EgressBytes(),
		GitRepo:          req.GitRepo, GitBranch: req.GitBranch, Env: req.Env, SecretNames: names,
		IdleTimeoutSeconds: idle,
	}
	if ses.RequestedSize == "" {
		ses.RequestedSize = size.Name
	}
	if err := s.checkDisk(); err != nil {
		s.writeError(c, err)
		return
	}
	if err := s.sb.reserve(p.Org.ID, size.MemoryMiB); err != nil {
		s.writeError(c, err)
		return
	}
	if err := s.db.InsertSession(c.Request.Context(), ses); err != nil {
		s.sb.release(p.Org.ID, size.MemoryMiB)
		if errors.Is(err, store.ErrConflict) {
			s.writeError(c, errdefs.Conflict("sessionId %q was already used in this organization; a fresh start is a new session id", req.SessionID))
			return
		}
		s.writeError(c, err)
		return
	}
	unlock := s.sb.lock(ses.ID)
	defer unlock()
	if len(req.Secrets) > 0 {
		if err := s.db.SetSecrets(c.Request.Context(), ses.ID, req.Secrets); err != nil {
			s.sb.release(p.Org.ID, size.MemoryMiB)
			s.db.DeleteSessionRow(context.Background(), ses.ID)
			s.writeError(c, err)
			return
		}
	}
	start := time.Now()
	if err := s.sb.provision(c.Request.Context(), ses, size); err != nil {
		s.sb.release(p.Org.ID, size.MemoryMiB)
		s.writeError(c, err)
		return
	}
	auditDetail(c, "provisionMs", time.Since(start).Milliseconds())
	s.met.provision.Observe(time.Since(start).Seconds())
	c.JSON(http.StatusCreated, sandboxJSON(ses))
}

// checkDisk refuses a provision when the data dir's file system is nearly
// full (sandbox disks are sparse and grow as they are written).
func (s *Server) checkDisk() error {
	var st unix.Statfs_t
	if err := unix.Statfs(s.cfg.DataDir, &st); err != nil {
		return nil
	}
	freeMiB := int64(st.Bavail) * int64(st.Bsize) >> 20
	if freeMiB < int64(s.cfg.Limits.MinFreeDiskMiB) {
		return errdefs.Unavailable("the server is low on disk space; retry later")
	}
	return nil
}

// sessionFor loads the caller's session by its id: unknown ids and other
// organizations' sessions are the same 404.
func (s *Server) sessionFor(c *gin.Context) (*store.Session, bool) {
	id := c.Param("sessionId")
	if !validSessionID(id) {
		s.writeError(c, errInvalidSessionID)
		return nil, false
	}
	ses, err := s.db.GetSession(c.Request.Context(), principal(c).Org.ID, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			s.writeError(c, errNotFound)
		} else {
			s.writeError(c, err)
		}
		return nil, false
	}
	return &ses, true
}

func (s *Server) listSandboxes(c *gin.Context) {
	status := c.Query("status")
	switch status {
	case "", store.StatusProvisioning, store.StatusRunning, store.StatusPaused, store.StatusStopping, store.StatusStopped, store.StatusFailed:
	default:
		s.writeError(c, badRequest("status: must be provisioning, running, paused, stopping, stopped or failed"))
		return
	}
	list, err := s.db.ListSessions(c.Request.Context(), principal(c).Org.ID, status)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]sandboxObject, 0, len(list))
	for i := range list {
		s.liveEgress(&list[i])
		out = append(out, sandboxJSON(&list[i]))
	}
	c.JSON(http.StatusOK, gin.H{"sandboxes": out})
}

func (s *Server) getSandbox(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	s.liveEgress(ses)
	c.JSON(http.StatusOK, sandboxJSON(ses))
}

func (s *Server) teardown(c *gin.Context) {
	cur, unlock, ok := s.lockedSession(c)
	if !ok {
		return
	}
	defer unlock()
	res, err := s.sb.teardown(c.Request.Context(), &cur)
	if err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "workspaceBytes", res.WorkspaceBytes)
	obj := sandboxJSON(&cur)
	obj.Teardown = &res
	c.JSON(http.StatusOK, obj)
}

// resume: POST /v1/sandbox/:sessionId/resume. A stopped session starts
// again on its kept disk; a failed one is torn down first; a running one
// answers as it is.
func (s *Server) resume(c *gin.Context) {
	cur, unlock, ok := s.lockedSession(c)
	if !ok {
		return
	}
	defer unlock()
	s.sb.checkAlive(c.Request.Context(), &cur) // a dead "running" sandbox is resumed, not answered
	switch cur.Status {
	case store.StatusRunning:
		c.JSON(http.StatusOK, sandboxJSON(&cur))
		return
	case store.StatusFailed:
		if _, err := s.sb.teardown(c.Request.Context(), &cur); err != nil {
			s.writeError(c, err)
			return
		}
	case store.StatusStopped:
	default:
		s.writeError(c, errdefs.Conflict("session is %s; only a stopped or failed session can be resumed", cur.Status))
		return
	}
	if err := s.checkDisk(); err != nil {
		s.writeError(c, err)
		return
	}
	if err := s.sb.reserve(cur.OrgID, cur.MemoryMiB); err != nil {
		s.writeError(c, err)
		return
	}
	start := time.Now()
	if err := s.sb.resume(&cur); err != nil {
		s.sb.release(cur.OrgID, cur.MemoryMiB)
		s.writeError(c, err)
		return
	}
	auditDetail(c, "provisionMs", time.Since(start).Milliseconds())
	s.met.provision.Observe(time.Since(start).Seconds())
	c.JSON(http.StatusOK, sandboxJSON(&cur))
}

func (s *Server) deleteSandbox(c *gin.Context) {
	cur, unlock, ok := s.lockedSession(c)
	if !ok {
		return
	}
	defer unlock()
	if err := s.sb.remove(c.Request.Context(), &cur); err != nil {
		s.writeError(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

// lockedSession loads the caller's session, takes its lock and re-reads it
// under the lock; on failure it has answered and holds no lock.
func (s *Server) lockedSession(c *gin.Context) (store.Session, func(), bool) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return store.Session{}, nil, false
	}
	unlock := s.sb.lock(ses.ID)
	cur, ok := s.reload(c, ses)
	if !ok {
		unlock()
		return cur, nil, false
	}
	return cur, unlock, true
}

// reload re-reads a session under its lock (it may have changed or, after a
// failed provision, disappeared while the caller waited).
func (s *Server) reload(c *gin.Context, ses *store.Session) (store.Session, bool) {
	cur, err := s.db.GetSessionByID(c.Request.Context(), ses.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && cur.Status == store.StatusDeleted) {
		s.writeError(c, errNotFound)
		return cur, false
	}
	if err != nil {
		s.writeError(c, err)
		return cur, false
	}
	return cur, true
}

type execRequest struct {
	Action    string            `json:"action"`
	Command   string            `json:"command"`
	Cwd       string            `json:"cwd"`
	Env       map[string]string `json:"env"`
	TimeoutMs *int64            `json:"timeoutMs"`
	Stdin     *string           `json:"stdin"`
}

type execResponse struct {
	ExitCode   int    `json:"exitCode"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"durationMs"`
	TimedOut   bool   `json:"timedOut"`
	Truncated  bool   `json:"truncated"`
	OOM        bool   `json:"oom"`
}

const maxCommandBytes = 256 * 1024

// timeout checks a request's timeoutMs (1 to limits.execMaxTimeoutMs) and
// returns it, or def when it is absent.
func (s *Server) timeout(ms *int64, def time.Duration) (time.Duration, error) {
	if ms == nil {
		return def, nil
	}
	if *ms < 1 || *ms > s.cfg.Limits.ExecMaxTimeoutMs {
		return 0, badRequest("timeoutMs: must be 1-%d", s.cfg.Limits.ExecMaxTimeoutMs)
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

// terminal: POST /v1/sandbox/terminal/:sessionId.
func (s *Server) terminal(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	var req execRequest
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "action", req.Action)
	switch req.Action {
	case "exec":
	case "kill":
		s.killAll(c, ses, &req)
		return
	default:
		s.writeError(c, badRequest("action: must be \"exec\" or \"kill\""))
		return
	}
	if strings.TrimSpace(req.Command) == "" || len(req.Command) > maxCommandBytes || strings.ContainsRune(req.Command, 0) {
		s.writeError(c, badRequest("command: required, under 256 KiB, without NUL bytes"))
		return
	}
	if req.Cwd == "" {
		req.Cwd = runsc.Workspace
	}
	if !validCwd(req.Cwd) {
		s.writeError(c, badRequest("cwd: must be an absolute, normalized path"))
		return
	}
	if e := checkEnv("env", req.Env); e != nil {
		s.writeError(c, e)
		return
	}
	timeout, aerr := s.timeout(req.TimeoutMs, time.Duration(s.cfg.Limits.ExecDefaultTimeoutMs)*time.Millisecond)
	if aerr != nil {
		s.writeError(c, aerr)
		return
	}
	if ses.Status != store.StatusRunning {
		s.writeError(c, errdefs.Conflict("session is %s; commands run only in a running session", ses.Status))
		return
	}
	secrets, err := s.db.Secrets(c.Request.Context(), ses.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	// Output passes the session's scrubber first, then the shared cap: what
	// is cut is already redacted, so no secret is ever cut in half.
	set := s.scrub.forSession(ses.ID, secrets)
	out := newCappedOutput(s.cfg.Limits.ExecOutputBytes)
	stdout, stderr := set.NewWriter(out.writer(&out.stdout)), set.NewWriter(out.writer(&out.stderr))
	xr := runsc.ExecRequest{
		Args:    []string{"/bin/bash", "-lc", req.Command},
		Env:     commandEnv(ses.Env, secrets, req.Env),
		BaseEnv: commandEnv(ses.Env, secrets, nil),
		Cwd:     req.Cwd,
		Stdout:  stdout,
		Stderr:  stderr,
		Timeout: timeout,
	}
	if req.Stdin != nil {
		xr.Stdin = strings.NewReader(*req.Stdin)
	}
	s.logs.Event(ses.ID, "process_start", map[string]any{"command": clip(string(set.Redact([]byte(req.Command))), 256), "cwd": req.Cwd})
	end, ok := s.sb.begin(ses.ID, s.cfg.Limits.MaxExecsPerSession)
	if !ok {
		s.writeError(c, errdefs.RateLimited("at most %d commands run at once in a session; retry when one ends", s.cfg.Limits.MaxExecsPerSession))
		return
	}
	res, err := s.rt.Exec(c.Request.Context(), ses.ContainerID, xr)
	end()
	stdout.Close()
	stderr.Close()
	redactions := map[string]int64{}
	for _, w := range []*scrub.Writer{stdout, stderr} {
		for k, n := range w.Counts() {
			if n > 0 {
				redactions[k] += n
			}
		}
	}
	s.met.exec.Observe(res.Duration.Seconds())
	if err != nil {
		switch {
		case errors.Is(err, runsc.ErrBadCwd):
			s.writeError(c, badRequest("cwd: does not exist or is not accessible to the sandbox user"))
		case errors.Is(err, runsc.ErrTooManyProcesses):
			s.writeError(c, errdefs.Conflict("the command could not start: the sandbox is at its process limit (send {\"action\": \"kill\"} to stop its processes) or cwd is not accessible"))
		case errors.Is(err, runsc.ErrNotRunning):
			s.noteDead(ses)
			s.writeError(c, errdefs.Conflict("the sandbox is not running any more"))
		default:
			// A teardown may have raced the command.
			if cur, gerr := s.db.GetSessionByID(context.Background(), ses.ID); gerr == nil && cur.Status != store.StatusRunning {
				s.writeError(c, errdefs.Conflict("the sandbox is not running any more"))
				return
			}
			s.writeError(c, err)
		}
		return
	}
	if res.OOM || res.Died {
		reason := "exited"
		if res.OOM {
			reason = "oom"
		}
		s.noteDeadReason(ses, reason)
	}
	s.logs.Event(ses.ID, "process_exit", map[string]any{"exitCode": res.ExitCode, "durationMs": res.Duration.Milliseconds(),
		"timedOut": res.TimedOut, "oom": res.OOM, "redactions": redactions})
	auditDetail(c, "exitCode", res.ExitCode)
	auditDetail(c, "durationMs", res.Duration.Milliseconds())
	c.JSON(http.StatusOK, execResponse{
		ExitCode:   res.ExitCode,
		Stdout:     out.stdout.String(),
		Stderr:     out.stderr.String(),
		DurationMs: res.Duration.Milliseconds(),
		TimedOut:   res.TimedOut,
		Truncated:  out.truncated,
		OOM:        res.OOM,
	})
}

// killAll: {"action": "kill"} stops every process in the sandbox but its
// init, e.g. after a fork bomb or forgotten background jobs.
func (s *Server) killAll(c *gin.Context, ses *store.Session, req *execRequest) {
	if req.Command != "" || req.Cwd != "" || req.Env != nil || req.TimeoutMs != nil || req.Stdin != nil {
		s.writeError(c, badRequest("action kill takes no command, cwd, env, timeoutMs or stdin"))
		return
	}
	if ses.Status != store.StatusRunning {
		s.writeError(c, errdefs.Conflict("session is %s; only a running session has processes", ses.Status))
		return
	}
	if err := s.rt.KillAll(c.Request.Context(), ses.ContainerID); err != nil {
		if errors.Is(err, runsc.ErrNotRunning) {
			s.noteDead(ses)
			s.writeError(c, errdefs.Conflict("the sandbox is not running any more"))
			return
		}
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"action": "kill", "killed": true})
}

func (s *Server) noteDead(ses *store.Session) {
	unlock := s.sb.lock(ses.ID)
	defer unlock()
	if cur, err := s.db.GetSessionByID(context.Background(), ses.ID); err == nil {
		s.sb.checkAlive(context.Background(), &cur)
	}
}

func (s *Server) noteDeadReason(ses *store.Session, reason string) {
	unlock := s.sb.lock(ses.ID)
	defer unlock()
	if cur, err := s.db.GetSessionByID(context.Background(), ses.ID); err == nil {
		s.sb.markDead(&cur, reason)
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// commandEnv is the environment of a user command: platform defaults, then
// the session's env and secrets, then the request's env.
func commandEnv(sessionEnv, secrets, reqEnv map[string]string) []string {
	env := map[string]string{
		"PATH": runsc.BasePath, "HOME": runsc.UserHome, "USER": "user", "LOGNAME": "user",
		"SHELL": "/bin/bash", "LANG": "C.UTF-8", "TERM": "dumb",
	}
	// The only way out is the session's egress proxy (see runsc/netns.go).
	for k, v := range runsc.ProxyEnv() {
		env[k] = v
	}
	for _, m := range []map[string]string{sessionEnv, secrets, reqEnv} {
		for k, v := range m {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// cappedOutput collects stdout and stderr up to a shared byte cap and keeps
// draining (so the command never blocks on a full pipe) past it.
type cappedOutput struct {
	mu             sync.Mutex
	left           int
	stdout, stderr bytes.Buffer
	truncated      bool
}

func newCappedOutput(limit int) *cappedOutput { return &cappedOutput{left: limit} }

type capWriter struct {
	o   *cappedOutput
	buf *bytes.Buffer
}

func (o *cappedOutput) writer(b *bytes.Buffer) capWriter { return capWriter{o, b} }

func (w capWriter) Write(p []byte) (int, error) {
	w.o.mu.Lock()
	defer w.o.mu.Unlock()
	n := min(len(p), w.o.left)
	w.buf.Write(p[:n])
	w.o.left -= n
	if n < len(p) {
		w.o.truncated = true
	}
	return len(p), nil
}

// sandboxObject is the contract's Sandbox object.
type sandboxObject struct {
	SessionID     string            `json:"sessionId"`
	OrgID         string            `json:"orgId"`
	ProjectID     string            `json:"projectId"`
	Status        string            `json:"status"`
	StatusReason  *string           `json:"statusReason"`
	Size          string            `json:"size"`
	RequestedSize string            `json:"requestedSize"`
	Resources     resources         `json:"resources"`
	GitRepo       *string           `json:"gitRepo"`
	GitBranch     *string           `json:"gitBranch"`
	SecretNames   []string          `json:"secretNames"`
	CreatedAt     time.Time         `json:"createdAt"`
	StartedAt     *time.Time        `json:"startedAt"`
	StoppedAt     *time.Time        `json:"stoppedAt"`
	Egress        egressUsage       `json:"egress"`
	Credits       creditUsage       `json:"credits"`
	URLs          map[string]string `json:"urls"`
	Teardown      *teardownResult   `json:"teardown,omitempty"`
}

type resources struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskMiB   int `json:"diskMiB"`
}

type egressUsage struct {
	BytesUsed  int64 `json:"bytesUsed"`
	BytesLimit int64 `json:"bytesLimit"`
}

type creditUsage struct {
	Used float64 `json:"used"`
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func sandboxJSON(ses *store.Session) sandboxObject {
	used := ses.CreditsUsed
	if ses.Status == store.StatusRunning && ses.StoppedAt == nil {
		used += credits(ses, time.Now().UTC())
	}
	names := ses.SecretNames
	if names == nil {
		names = []string{}
	}
	return sandboxObject{
		SessionID: ses.SessionID, OrgID: ses.OrgID, ProjectID: ses.ProjectID,
		Status: ses.Status, StatusReason: strPtr(ses.StatusReason),
		Size: ses.Size, RequestedSize: ses.RequestedSize,
		Resources: resources{VCPUs: ses.VCPUs, MemoryMiB: ses.MemoryMiB, DiskMiB: ses.DiskMiB},
		GitRepo:   strPtr(ses.GitRepo), GitBranch: strPtr(ses.GitBranch),
		SecretNames: names,
		CreatedAt:   ses.CreatedAt, StartedAt: ses.StartedAt, StoppedAt: ses.StoppedAt,
		Egress:  egressUsage{BytesUsed: ses.EgressBytesUsed, BytesLimit: ses.EgressBytesLimit},
		Credits: creditUsage{Used: used},
		URLs:    map[string]string{},
	}
}

// sizeLimits converts a size to the driver's limits.
func sizeLimits(z config.Size) runsc.Limits {
	return runsc.Limits{
		VCPUs:     z.VCPUs,
		MemoryMiB: int64(z.MemoryMiB),
		DiskMiB:   int64(z.DiskMiB),
		Pids:      int64(z.Pids),
		Processes: runsc.DefaultProcesses(int64(z.Pids)),
	}
}

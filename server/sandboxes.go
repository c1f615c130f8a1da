package server

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/server/config"
	"sandboxd/server/errdefs"
	"sandboxd/server/sandbox"
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
	IdleAction         string            `json:"idleAction"`
}

func (s *Server) validateProvision(req *provisionRequest) (config.Size, error) {
	if req.SessionID == "" {
		return config.Size{}, errdefs.Invalid("sessionId: required").WithCode("invalid_session_id")
	}
	if !validSessionID(req.SessionID) {
		return config.Size{}, errInvalidSessionID
	}
	if reservedSessionIDs[req.SessionID] {
		return config.Size{}, errdefs.Invalid("sessionId: %q is a word of the API's routes (/v1/sandbox/%s/...); choose another", req.SessionID, req.SessionID).WithCode("invalid_session_id")
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
	if req.IdleAction != "" && req.IdleAction != config.IdleTeardown && req.IdleAction != config.IdlePause {
		return config.Size{}, badRequest("idleAction: must be teardown or pause")
	}
	if e := checkEnv("env", req.Env); e != nil {
		return config.Size{}, e
	}
	if e := checkEnv("secrets", req.Secrets); e != nil {
		return config.Size{}, e
	}
	if e := checkSecretNames(req.Secrets); e != nil {
		return config.Size{}, e
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(req.Secrets)) {
		v := req.Secrets[k]
		switch {
		case len(v) < scrub.MinValueLen:
			return config.Size{}, badRequest("secrets: value of %s is shorter than %d bytes and cannot be redacted safely; it was not accepted", k, scrub.MinValueLen)
		case scrub.Shown(v) < scrub.MinValueLen:
			return config.Size{}, badRequest("secrets: value of %s shows fewer than %d characters (spaces, control characters, invisible characters and escape sequences left out) and cannot be redacted safely; it was not accepted", k, scrub.MinValueLen)
		case len(v) > scrub.MaxValueLen:
			// Every encoding of a secret is indexed for redaction.
			return config.Size{}, badRequest("secrets: value of %s is %d bytes, over the %d KiB a secret may have; put a large credential in a file in the workspace and a short one in secrets", k, len(v), scrub.MaxValueLen>>10)
		}
		total += len(v)
	}
	if total > scrub.MaxValuesLen {
		return config.Size{}, badRequest("secrets: %d bytes in all, over the %d KiB a session's secrets may have", total, scrub.MaxValuesLen>>10)
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
	size, err := s.validateProvision(&req)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.Params = append(c.Params, gin.Param{Key: "sessionId", Value: req.SessionID}) // for the audit record
	auditDetail(c, "size", size.Name)
	ses, err := s.provisionChecked(c.Request.Context(), principal(c), &req, size, ginNote(c))
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusCreated, s.sandboxJSON(c.Request, &ses))
}

// provisionChecked provisions a request validateProvision accepted, for p:
// the REST provision's and the MCP create_sandbox's one path.
func (s *Server) provisionChecked(ctx context.Context, p store.Principal, req *provisionRequest, size config.Size, note noteFn) (store.Session, error) {
	if req.GitRepo != "" {
		// Cloning uses the caller's connected Git credential.
		connected, _, err := s.db.GitConnected(ctx, p.User.ID)
		if err != nil {
			return store.Session{}, err
		}
		if !connected {
			return store.Session{}, errdefs.New(errdefs.ErrPrecondition, "gitRepo needs a connected GitHub credential (PUT /v1/me/github); nothing was provisioned").WithCode("github_not_connected")
		}
	}
	idle := 0
	if req.IdleTimeoutSeconds != nil {
		idle = *req.IdleTimeoutSeconds
	}
	start := time.Now()
	ses, err := s.sessions.Provision(ctx, p, sandbox.Spec{
		SessionID: req.SessionID, ProjectID: req.ProjectID, Size: size, RequestedSize: req.Size,
		Env: req.Env, Secrets: req.Secrets, IdleTimeoutSeconds: idle, IdleAction: req.IdleAction,
		GitRepo: req.GitRepo, GitBranch: req.GitBranch,
	})
	if err != nil {
		return store.Session{}, err
	}
	s.startTook(note, start)
	return ses, nil
}

// sessionFor loads the caller's session by its id: unknown ids and other
// organizations' sessions are the same 404.
func (s *Server) sessionFor(c *gin.Context) (*store.Session, bool) {
	id := c.Param("sessionId")
	if !validSessionID(id) {
		s.writeError(c, errInvalidSessionID)
		return nil, false
	}
	ses, err := s.sessions.Get(c.Request.Context(), principal(c).Org.ID, id)
	if err != nil {
		s.writeError(c, err)
		return nil, false
	}
	c.Set(ctxSessionPK, ses.ID)
	return &ses, true
}

// sessionID is the route's session id, checked; on failure it has answered.
func (s *Server) sessionID(c *gin.Context) (string, bool) {
	id := c.Param("sessionId")
	if !validSessionID(id) {
		s.writeError(c, errInvalidSessionID)
		return "", false
	}
	return id, true
}

func (s *Server) listSandboxes(c *gin.Context) {
	status := c.Query("status")
	if status != "" && !slices.Contains(sandbox.Statuses, status) {
		s.writeError(c, badRequest("status: must be %s", strings.Join(sandbox.Statuses, ", ")))
		return
	}
	list, err := s.sessions.List(c.Request.Context(), principal(c).Org.ID, status)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]sandboxObject, 0, len(list))
	for i := range list {
		out = append(out, s.sandboxJSON(c.Request, &list[i]))
	}
	c.JSON(http.StatusOK, gin.H{"sandboxes": out})
}

func (s *Server) getSandbox(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	c.JSON(http.StatusOK, s.sandboxJSON(c.Request, ses))
}

func (s *Server) teardown(c *gin.Context) {
	id, ok := s.sessionID(c)
	if !ok {
		return
	}
	ses, res, err := s.sessions.Teardown(c.Request.Context(), principal(c).Org.ID, id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusOK, s.teardownJSON(c.Request, &ses, res, ginNote(c)))
}

// teardownJSON is a torn down session's object with its teardown report.
func (s *Server) teardownJSON(r *http.Request, ses *store.Session, res sandbox.Teardown, note noteFn) sandboxObject {
	note("workspaceBytes", res.WorkspaceBytes)
	note("savedBytes", res.SavedBytes)
	obj := s.sandboxJSON(r, ses)
	obj.Teardown = &teardownResult{WorkspaceBytes: res.WorkspaceBytes, SavedBytes: res.SavedBytes, GitCommits: []string{}}
	if g := res.Git; g != nil {
		obj.Teardown.GitPushed, obj.Teardown.GitCommits = g.Pushed, g.Commits
		if g.Commits == nil {
			obj.Teardown.GitCommits = []string{}
		}
		if g.Error != "" {
			obj.Teardown.GitError = &g.Error
		}
		note("gitPushed", g.Pushed)
		note("gitCommits", len(g.Commits))
	}
	return obj
}

// teardownResult is the contract's teardown report. gitError is a class
// (sandbox.Git*), null when the push went out or the session is not paired;
// gitCommits are the paired branch's commits pushed (or that were to be).
type teardownResult struct {
	WorkspaceBytes int64    `json:"workspaceBytes"`
	SavedBytes     int64    `json:"savedBytes"`
	GitPushed      bool     `json:"gitPushed"`
	GitCommits     []string `json:"gitCommits"`
	GitError       *string  `json:"gitError"`
}

// pause: POST /v1/sandbox/:sessionId/pause (sandbox.Manager.Pause): a
// checkpoint with memory; resume brings the processes back.
func (s *Server) pause(c *gin.Context) {
	id, ok := s.sessionID(c)
	if !ok {
		return
	}
	start := time.Now()
	ses, err := s.sessions.Pause(c.Request.Context(), principal(c).Org.ID, id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "pauseMs", time.Since(start).Milliseconds())
	c.JSON(http.StatusOK, s.sandboxJSON(c.Request, &ses))
}

// resume: POST /v1/sandbox/:sessionId/resume (sandbox.Manager.Resume).
func (s *Server) resume(c *gin.Context) {
	id, ok := s.sessionID(c)
	if !ok {
		return
	}
	start := time.Now()
	ses, err := s.sessions.Resume(c.Request.Context(), principal(c).Org.ID, id)
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.startTook(ginNote(c), start)
	c.JSON(http.StatusOK, s.sandboxJSON(c.Request, &ses))
}

func (s *Server) deleteSandbox(c *gin.Context) {
	id, ok := s.sessionID(c)
	if !ok {
		return
	}
	if err := s.sessions.Delete(c.Request.Context(), principal(c).Org.ID, id); err != nil {
		s.writeError(c, err)
		return
	}
	c.Status(http.StatusNoContent)
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
	IdleTimeout   int               `json:"idleTimeoutSeconds"`
	IdleAction    string            `json:"idleAction"`
	CreatedAt     time.Time         `json:"createdAt"`
	StartedAt     *time.Time        `json:"startedAt"`
	StoppedAt     *time.Time        `json:"stoppedAt"`
	Egress        egressUsage       `json:"egress"`
	Credits       creditUsage       `json:"credits"`
	URLs          map[string]string `json:"urls"`
	Storage       storageUsage      `json:"storage"`
	Teardown      *teardownResult   `json:"teardown,omitempty"`
}

// storageUsage is the session's save in its organization's storage.
type storageUsage struct {
	SavedBytes int64      `json:"savedBytes"`
	SavedAt    *time.Time `json:"savedAt"`
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

// creditUsage is what the session has drawn over its life, in credits
// and exactly in milli-credits.
type creditUsage struct {
	Used      float64 `json:"used"`
	UsedMilli int64   `json:"usedMilli"`
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (s *Server) sandboxJSON(r *http.Request, ses *store.Session) sandboxObject {
	names := ses.SecretNames
	if names == nil {
		names = []string{}
	}
	used, err := s.sessions.SessionCredits(r.Context(), ses)
	if err != nil {
		s.log.Warn("session credits", "session", ses.SessionID, "err", err)
	}
	return sandboxObject{
		SessionID: ses.SessionID, OrgID: ses.OrgID, ProjectID: ses.ProjectID,
		Status: ses.Status, StatusReason: strPtr(ses.StatusReason),
		Size: ses.Size, RequestedSize: ses.RequestedSize,
		Resources: resources{VCPUs: ses.VCPUs, MemoryMiB: ses.MemoryMiB, DiskMiB: ses.DiskMiB},
		GitRepo:   strPtr(ses.GitRepo), GitBranch: strPtr(ses.GitBranch),
		SecretNames: names, IdleTimeout: ses.IdleTimeoutSeconds, IdleAction: s.sessions.IdleAction(ses),
		CreatedAt: ses.CreatedAt, StartedAt: ses.StartedAt, StoppedAt: ses.StoppedAt,
		Egress:  egressUsage{BytesUsed: ses.EgressBytesUsed, BytesLimit: ses.EgressBytesLimit},
		Credits: creditUsage{Used: used.Credits(), UsedMilli: int64(used)},
		URLs:    s.sandboxURLs(r, ses),
		Storage: storageUsage{SavedBytes: ses.Saved.Bytes, SavedAt: ses.Saved.At},
	}
}

// startTook records how long a provision or resume took to a running
// sandbox (audit and metrics).
func (s *Server) startTook(note noteFn, start time.Time) {
	note("provisionMs", time.Since(start).Milliseconds())
	s.met.provision.Observe(time.Since(start).Seconds())
}

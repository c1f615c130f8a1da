package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// ProvisionRequest is the body of POST /v1/sandbox. Only SessionID is
// required.
type ProvisionRequest struct {
	SessionID string `json:"sessionId"`
	// Size is a size name (standard-1 ... standard-5, or a legacy alias);
	// empty means the server's default.
	Size      string            `json:"size,omitempty"`
	GitRepo   string            `json:"gitRepo,omitempty"` // owner/name
	GitBranch string            `json:"gitBranch,omitempty"`
	ProjectID string            `json:"projectId,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Secrets are given to commands as environment variables and redacted
	// from every output; no answer ever contains them.
	Secrets map[string]string `json:"secrets,omitempty"`
	// IdleTimeoutSeconds: after this long unused the session is torn down
	// (or paused, IdleAction "pause"); nil leaves the server's default, 0
	// turns it off.
	IdleTimeoutSeconds *int   `json:"idleTimeoutSeconds,omitempty"`
	IdleAction         string `json:"idleAction,omitempty"` // "pause" or "teardown"
}

// Sandbox is the contract's Sandbox object.
type Sandbox struct {
	SessionID     string            `json:"sessionId"`
	OrgID         string            `json:"orgId"`
	ProjectID     string            `json:"projectId"`
	Status        string            `json:"status"`
	StatusReason  *string           `json:"statusReason"`
	Size          string            `json:"size"`
	RequestedSize string            `json:"requestedSize"`
	Resources     Resources         `json:"resources"`
	GitRepo       *string           `json:"gitRepo"`
	GitBranch     *string           `json:"gitBranch"`
	SecretNames   []string          `json:"secretNames"`
	IdleTimeout   int               `json:"idleTimeoutSeconds"`
	IdleAction    string            `json:"idleAction"`
	CreatedAt     time.Time         `json:"createdAt"`
	StartedAt     *time.Time        `json:"startedAt"`
	StoppedAt     *time.Time        `json:"stoppedAt"`
	Egress        EgressUsage       `json:"egress"`
	Credits       CreditUsage       `json:"credits"`
	URLs          map[string]string `json:"urls"`
	Storage       StorageUsage      `json:"storage"`
	// Teardown is set on the answer of a teardown.
	Teardown *TeardownResult `json:"teardown,omitempty"`

	// Raw is the JSON object the server answered.
	Raw json.RawMessage `json:"-"`
}

// Session statuses.
const (
	StatusProvisioning = "provisioning"
	StatusRunning      = "running"
	StatusPaused       = "paused"
	StatusStopping     = "stopping"
	StatusStopped      = "stopped"
	StatusFailed       = "failed"
)

// Resources are a session's limits.
type Resources struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskMiB   int `json:"diskMiB"`
}

// EgressUsage is a session's network quota.
type EgressUsage struct {
	BytesUsed  int64 `json:"bytesUsed"`
	BytesLimit int64 `json:"bytesLimit"`
}

// CreditUsage is what a session has drawn over its life: Used in credits,
// UsedMilli the same exactly, in thousandths of a credit.
type CreditUsage struct {
	Used      float64 `json:"used"`
	UsedMilli int64   `json:"usedMilli"`
}

// StorageUsage is a session's save in its organization's storage.
type StorageUsage struct {
	SavedBytes int64      `json:"savedBytes"`
	SavedAt    *time.Time `json:"savedAt"`
}

// TeardownResult reports a teardown: what was saved and the git push of a
// paired session (GitError is a class such as "rejected_non_fast_forward").
type TeardownResult struct {
	WorkspaceBytes int64    `json:"workspaceBytes"`
	SavedBytes     int64    `json:"savedBytes"`
	GitPushed      bool     `json:"gitPushed"`
	GitCommits     []string `json:"gitCommits"`
	GitError       *string  `json:"gitError"`
}

// SandboxList is the answer of GET /v1/sandbox.
type SandboxList struct {
	Sandboxes []Sandbox       `json:"sandboxes"`
	Raw       json.RawMessage `json:"-"`
}

func sandboxPath(id string) string { return "/v1/sandbox/" + seg(id) }

// sandbox calls an endpoint that answers a Sandbox object.
func (c *Client) sandbox(ctx context.Context, method, p string, in any) (*Sandbox, error) {
	var sb Sandbox
	raw, _, err := c.doJSON(ctx, method, p, nil, in, &sb)
	if err != nil {
		return nil, err
	}
	sb.Raw = raw
	return &sb, nil
}

// Provision creates and starts a sandbox for a new session id (POST
// /v1/sandbox). It returns when the sandbox runs (a clone of GitRepo
// included).
func (c *Client) Provision(ctx context.Context, req ProvisionRequest) (*Sandbox, error) {
	return c.sandbox(ctx, http.MethodPost, "/v1/sandbox", req)
}

// Get returns one session.
func (c *Client) Get(ctx context.Context, sessionID string) (*Sandbox, error) {
	return c.sandbox(ctx, http.MethodGet, sandboxPath(sessionID), nil)
}

// List returns the organization's sessions, newest first; status filters
// by status when not empty.
func (c *Client) List(ctx context.Context, status string) (*SandboxList, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	var l SandboxList
	raw, _, err := c.doJSON(ctx, http.MethodGet, "/v1/sandbox", q, nil, &l)
	if err != nil {
		return nil, err
	}
	l.Raw = raw
	// Each element's own JSON, for callers that pass objects on.
	var parts struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	if json.Unmarshal(raw, &parts) == nil && len(parts.Sandboxes) == len(l.Sandboxes) {
		for i := range l.Sandboxes {
			l.Sandboxes[i].Raw = parts.Sandboxes[i]
		}
	}
	return &l, nil
}

// Teardown saves the session's workspace, pushes a paired branch, stops
// the sandbox and releases its compute. Idempotent on a stopped session.
func (c *Client) Teardown(ctx context.Context, sessionID string) (*Sandbox, error) {
	return c.sandbox(ctx, http.MethodPost, sandboxPath(sessionID)+"/teardown", nil)
}

// Resume restarts a stopped or paused session with its workspace.
func (c *Client) Resume(ctx context.Context, sessionID string) (*Sandbox, error) {
	return c.sandbox(ctx, http.MethodPost, sandboxPath(sessionID)+"/resume", nil)
}

// Pause checkpoints a running session with its memory and processes.
func (c *Client) Pause(ctx context.Context, sessionID string) (*Sandbox, error) {
	return c.sandbox(ctx, http.MethodPost, sandboxPath(sessionID)+"/pause", nil)
}

// Delete tears the session down if needed and deletes its saved
// workspace; the id stays used.
func (c *Client) Delete(ctx context.Context, sessionID string) error {
	_, _, err := c.doJSON(ctx, http.MethodDelete, sandboxPath(sessionID), nil, nil, nil)
	return err
}

// Me is the caller (GET /v1/me).
type Me struct {
	User         Ref      `json:"user"`
	Organization Ref      `json:"organization"`
	ProjectID    string   `json:"projectId"`
	Role         string   `json:"role"`
	Permissions  []string `json:"permissions"`
	TokenID      string   `json:"tokenId"`
	GitHub       struct {
		Connected   bool       `json:"connected"`
		ConnectedAt *time.Time `json:"connectedAt"`
	} `json:"github"`
	Raw json.RawMessage `json:"-"`
}

// Ref names a user or an organization.
type Ref struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Me returns the caller: user, organization, role and permissions. It is
// the cheapest way to check a token.
func (c *Client) Me(ctx context.Context) (*Me, error) {
	var m Me
	raw, _, err := c.doJSON(ctx, http.MethodGet, "/v1/me", nil, nil, &m)
	if err != nil {
		return nil, err
	}
	m.Raw = raw
	return &m, nil
}

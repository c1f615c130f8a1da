package sandbox

import (
	"context"
	"errors"
	"sort"
	"strings"
	"time"

	"sandboxd/runsc"
	"sandboxd/server/errdefs"
	"sandboxd/store"
	"sandboxd/streams/scrub"
)

// Command is a session admitted to run something (a REST exec, an exec
// stream, a code run, a terminal): its row, its secrets and scrubber, and,
// when it holds one, a command slot. End releases the slot.
type Command struct {
	Session  store.Session
	Secrets  map[string]string
	Scrubber *scrub.Set
	end      func()
}

// End records that the command ended (its slot is free, its session was in
// use until now). Safe to call more than once.
func (c *Command) End() {
	if c.end != nil {
		c.end()
	}
}

// Env is the environment of the command's processes: platform defaults,
// the session's env and secrets, then reqEnv.
func (c *Command) Env(reqEnv map[string]string) []string {
	return CommandEnv(c.Session.Env, c.Secrets, reqEnv)
}

// Admit says what a command needs from its session.
type Admit struct {
	// NotRunning ends the conflict message for a session that is not
	// running ("session is stopped; <NotRunning>").
	NotRunning string
	// Slot takes one of the session's limits.maxExecsPerSession command
	// slots (rate limited above it).
	Slot bool
	// Use counts the command as use for the idle timeout until End,
	// without a slot (an attached terminal). A slot counts anyway.
	Use bool
	// NoSecrets admits without reading the secrets (no Secrets, no
	// Scrubber): for requests that start nothing themselves (the portal's
	// proxied requests; a service it starts reads them with SessionEnv).
	NoSecrets bool
}

// Command admits a command in a session (as Get returned it) that must be
// running; one paused for memory pressure is resumed first (the returned
// Command holds the session as it is now).
func (m *Manager) Command(ctx context.Context, ses store.Session, a Admit) (*Command, error) {
	if err := m.wake(ctx, &ses); err != nil {
		return nil, err
	}
	if ses.Status == store.StatusPaused {
		return nil, errdefs.Conflict("session is paused; resume it first (POST /v1/sandbox/%s/resume): its processes are kept", ses.SessionID)
	}
	if ses.Status != store.StatusRunning {
		return nil, errdefs.Conflict("session is %s; %s", ses.Status, a.NotRunning)
	}
	c := &Command{Session: ses}
	if !a.NoSecrets {
		secrets, err := m.db.Secrets(ctx, ses.ID)
		if err != nil {
			return nil, err
		}
		c.Secrets, c.Scrubber = secrets, m.scrub.forSession(ses.ID, secrets)
	}
	if a.Slot {
		end, ok := m.begin(ses.ID, m.lim.MaxExecsPerSession)
		if !ok {
			return nil, errdefs.RateLimited("at most %d commands run at once in a session; retry when one ends", m.lim.MaxExecsPerSession)
		}
		c.end = end
	} else if a.Use {
		c.end, _ = m.begin(ses.ID, 0)
	}
	return c, nil
}

var errNotRunningAnyMore = errdefs.Conflict("the sandbox is not running any more")

// Exec runs a command to completion in an admitted session. A sandbox that
// died under it (OOM, exit) is marked failed once the driver confirms it:
// the command's result speaks of the sandbox it ran in, which a teardown
// and a resume may have replaced meanwhile.
func (m *Manager) Exec(ctx context.Context, c *Command, req runsc.ExecRequest) (runsc.ExecResult, error) {
	pk := c.Session.ID
	res, err := m.rt.Exec(ctx, c.Session.ContainerID, req)
	switch {
	case err == nil:
	case errors.Is(err, runsc.ErrBadCwd):
		return res, errdefs.Invalid("cwd: does not exist or is not accessible to the sandbox user")
	case errors.Is(err, runsc.ErrAgentSlow):
		return res, errdefs.Unavailable("the sandbox did not answer within 10 s: it (or this server) is busy; retry")
	case errors.Is(err, runsc.ErrTooManyProcesses):
		return res, errdefs.Conflict("the command could not start: the sandbox is at its process limit (send {\"action\": \"kill\"} to stop its processes) or cwd is not accessible")
	case errors.Is(err, runsc.ErrNotRunning):
		m.NoteDead(pk)
		return res, errNotRunningAnyMore
	default:
		// A teardown may have raced the command.
		if cur, gerr := m.db.GetSessionByID(context.WithoutCancel(ctx), pk); gerr == nil && cur.Status != store.StatusRunning {
			return res, errNotRunningAnyMore
		}
		return res, err
	}
	if res.OOM || res.Died {
		m.NoteDead(pk)
	}
	return res, nil
}

// KillAll stops every process in a running session's sandbox but its
// init (after a fork bomb, or forgotten background jobs), and says what
// survived its deadline.
func (m *Manager) KillAll(ctx context.Context, ses store.Session) (runsc.KillResult, error) {
	if ses.Status != store.StatusRunning {
		return runsc.KillResult{}, errdefs.Conflict("session is %s; only a running session has processes", ses.Status)
	}
	res, err := m.rt.KillAll(ctx, ses.ContainerID)
	if err != nil {
		if errors.Is(err, runsc.ErrNotRunning) {
			m.NoteDead(ses.ID)
			return res, errNotRunningAnyMore
		}
		return res, err
	}
	return res, nil
}

// SessionEnv reads a session's secrets now and returns the environment of
// its processes (CommandEnv without a request's env).
func (m *Manager) SessionEnv(ctx context.Context, ses store.Session) ([]string, error) {
	secrets, err := m.db.Secrets(ctx, ses.ID)
	if err != nil {
		return nil, err
	}
	return CommandEnv(ses.Env, secrets, nil), nil
}

// CommandEnv is the environment of a user command: platform defaults, then
// the session's env and secrets, then the request's env; sorted.
func CommandEnv(sessionEnv, secrets, reqEnv map[string]string) []string {
	env := map[string]string{
		"PATH": runsc.BasePath, "HOME": runsc.UserHome, "USER": "user", "LOGNAME": "user",
		"SHELL": "/bin/bash", "LANG": "C.UTF-8", "TERM": "dumb",
		// The session's virtual display (the portal's /display/).
		"DISPLAY": ":99",
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

// SetEnv sets k in an environment list.
func SetEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// startTimeout bounds how long starting a process may take.
const startTimeout = 10 * time.Second

// StartContext is the context a process start runs on: not the request's
// (a start is short and must not be cut in half), bounded.
func StartContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
}

// ResourceUse reads a running session's current resource use (cgroups and
// disk). It takes no session lock: a read that races a stop answers
// conflict or missing figures, never stale ones of another sandbox.
func (m *Manager) ResourceUse(ses store.Session) (runsc.Usage, error) {
	if ses.Status != store.StatusRunning || ses.ContainerID == "" {
		return runsc.Usage{}, errdefs.Conflict("session is %s; only a running sandbox has resource use", ses.Status)
	}
	return m.rt.Usage(ses.ContainerID)
}

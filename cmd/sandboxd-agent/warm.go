package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// bootstrap is the -c script of a warm shell, run after the login profile:
// it reports its exported variable names on fd 4 (then "#ok", and EOF means
// ready) and waits for one byte on the pipe at fd 3. By then the agent has
// written the script (see warmScript), NUL-terminated, at offset 0 of the
// memfd at fd 5; mapfile reads it with buffered reads (a read from a pipe
// would take one syscall per byte) and without reopening anything (a pipe
// created by root cannot be reopened through /dev/fd by the user).
const bootstrap = `compgen -e >&4 && echo '#ok' >&4; exec 4>&-; ` +
	`read -r -n 1 -u 3 __sbx_s || exit 0; mapfile -t -d '' -u 5 __sbx_s; exec 3<&- 5<&-; eval "${__sbx_s[0]}"`

const (
	warmTimeout = 10 * time.Second
	// After maxWarmFails consecutive failed warm starts (a slow or broken
	// login profile, the process limit) the pool backs off: one start may
	// be tried per back-off period, which doubles from warmBackoff up to
	// maxWarmBackoff, and only when a request comes (an idle sandbox
	// starts nothing). A change to the profile files ends the back-off.
	maxWarmFails   = 3
	warmBackoff    = 15 * time.Second
	maxWarmBackoff = 5 * time.Minute
)

// bashManaged are variables a fresh bash sets itself; the warm script
// recreates their fresh-bash values instead of copying the request's.
var bashManaged = map[string]bool{"PWD": true, "SHLVL": true, "OLDPWD": true, "_": true}

// startupVars steer bash's start-up (which profile files run, shell
// options): a request may use a warm shell only if it agrees on them with
// the pool's base environment.
var startupVars = []string{"HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT"}

// bashSpecial are variables bash treats specially (read-only, dynamic or
// not imported); a request setting one of them starts cold.
var bashSpecial = map[string]bool{
	"BASHOPTS": true, "SHELLOPTS": true, "BASH_VERSINFO": true, "EUID": true, "PPID": true, "UID": true,
	"RANDOM": true, "SRANDOM": true, "SECONDS": true, "LINENO": true, "HISTCMD": true, "BASH_ARGV0": true,
	"BASHPID": true, "EPOCHSECONDS": true, "EPOCHREALTIME": true, "GROUPS": true, "FUNCNAME": true,
	"DIRSTACK": true, "BASH_COMMAND": true, "BASH_SUBSHELL": true, "BASH_SOURCE": true, "BASH_LINENO": true,
	"BASH_ARGC": true, "BASH_ARGV": true, "BASH_REMATCH": true, "BASH_EXECUTION_STRING": true,
	"PIPESTATUS": true, "COMP_WORDBREAKS": true, "BASH_ALIASES": true, "BASH_CMDS": true,
	"BASH_XTRACEFD": true, "IFS": true, "BASH": true, "BASH_VERSION": true,
}

type warmConfig struct {
	env      []string
	uid, gid uint32
	cwd      string
	count    int
}

func (c *warmConfig) equal(o *warmConfig) bool {
	return c != nil && o != nil && slices.Equal(c.env, o.env) && c.uid == o.uid && c.gid == o.gid &&
		c.cwd == o.cwd && c.count == o.count
}

// warmShell is a started login shell waiting for its script on fd 3.
type warmShell struct {
	child  *child
	names  []string // exported variable names after the profile ran
	base   []string // the environment it was started with
	prof   string   // profileStamp before its profile ran
	memfd  *os.File // its fd 5, for the script
	script *os.File // write end of its fd 3: one byte says the script is there
	stdin  *os.File
	stdout *os.File
	stderr *os.File
}

func (w *warmShell) closeFiles() {
	for _, f := range []*os.File{w.memfd, w.script, w.stdin, w.stdout, w.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// pool keeps up to cfg.count warm shells ready. All fields below mu are
// guarded by it; spawn goroutines are owned by the pool and end on their
// own (a warm start is bounded by warmTimeout).
type pool struct {
	log *slog.Logger
	// start starts a warm shell (server.startWarm); stop kills one that
	// will not be used; now is the clock. Fakes replace them in tests.
	start func(cfg *warmConfig, stamp string) (*warmShell, error)
	stop  func(*warmShell)
	now   func() time.Time

	mu       sync.Mutex
	cfg      *warmConfig
	explicit bool // configured by a warm op: start requests no longer do
	gen      int  // bumped when shells of older generations must not be kept
	ready    []*warmShell
	starting int
	paused   bool
	changed  chan struct{} // closed and replaced on every change
	// fails counts consecutive failed starts; from maxWarmFails on, no
	// start before retryAt, and then one at a time. failStamp is the
	// profileStamp after the last failed start.
	fails     int
	failStamp string
	backoff   time.Duration
	retryAt   time.Time
}

func newPool(s *server) *pool {
	return &pool{
		log: s.log, start: s.startWarm, now: time.Now,
		stop: func(w *warmShell) {
			s.reaper.killRunning(w.child)
			w.closeFiles()
		},
		changed: make(chan struct{}),
	}
}

// resetFailsLocked ends a back-off.
func (p *pool) resetFailsLocked() {
	p.fails, p.failStamp, p.backoff, p.retryAt = 0, "", 0, time.Time{}
}

func (p *pool) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// configure replaces the configuration (nil disables the pool). The same
// configuration again keeps the ready shells.
func (p *pool) configure(cfg *warmConfig) {
	p.mu.Lock()
	p.explicit = true
	if cfg.equal(p.cfg) {
		p.mu.Unlock()
		p.fill()
		return
	}
	old := p.ready
	p.cfg, p.ready = cfg, nil
	p.resetFailsLocked()
	p.gen++
	p.notifyLocked()
	p.mu.Unlock()
	for _, w := range old {
		p.discard(w)
	}
	p.fill()
}

// configureAndWait configures the pool and waits until it is full.
func (p *pool) configureAndWait(cfg *warmConfig, timeout time.Duration) error {
	p.configure(cfg)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		full := p.cfg == nil || len(p.ready) >= p.cfg.count
		failed := p.fails >= maxWarmFails
		ch := p.changed
		p.mu.Unlock()
		switch {
		case full:
			return nil
		case failed:
			return errors.New("warm shells failed to start")
		}
		select {
		case <-ch:
		case <-timer.C:
			return errors.New("warm shells not ready in time")
		}
	}
}

// warmStats is what the stats op reports about the pool.
type warmStats struct {
	ready, fails int
	retryIn      time.Duration // left of a back-off
}

func (p *pool) stats() warmStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := warmStats{ready: len(p.ready), fails: p.fails}
	if p.fails >= maxWarmFails {
		st.retryIn = max(0, p.retryAt.Sub(p.now()))
	}
	return st
}

// pause drops the ready shells and stops refilling until resume.
func (p *pool) pause() {
	p.mu.Lock()
	p.paused = true
	p.gen++
	old := p.ready
	p.ready = nil
	p.notifyLocked()
	p.mu.Unlock()
	for _, w := range old {
		p.discard(w)
	}
}

// resume refills after a pause, with a fresh failure count (killall may
// have ended what made the starts fail: a fork bomb at the process limit).
func (p *pool) resume() {
	p.mu.Lock()
	p.paused = false
	p.resetFailsLocked()
	p.mu.Unlock()
	p.fill()
}

// fill starts as many warm shells as are missing; while backing off, one
// once retryAt has passed.
func (p *pool) fill() {
	p.mu.Lock()
	n := 0
	if p.cfg != nil && !p.paused {
		n = p.cfg.count - len(p.ready) - p.starting
		if p.fails >= maxWarmFails && (p.starting > 0 || p.now().Before(p.retryAt)) {
			n = 0
		}
		if p.fails >= maxWarmFails {
			n = min(n, 1)
		}
	}
	if n <= 0 {
		p.mu.Unlock()
		return
	}
	p.starting += n
	gen, cfg := p.gen, p.cfg
	p.mu.Unlock()
	for range n {
		go p.spawn(gen, cfg)
	}
}

func (p *pool) spawn(gen int, cfg *warmConfig) {
	// A shell is stamped with the profile files before they run (a change
	// while they run makes it stale); a failure with them after (so that a
	// profile that rewrites one of them does not end its own back-off).
	w, err := p.start(cfg, profileStamp(cfg.env))
	var stamp string
	if err != nil {
		stamp = profileStamp(cfg.env)
	}
	p.mu.Lock()
	p.starting--
	if gen != p.gen || p.paused || (err == nil && len(p.ready) >= p.cfg.count) {
		p.mu.Unlock()
		if w != nil {
			p.discard(w)
		}
		p.fill() // this generation may be short of the shells it counted
		return
	}
	if err != nil {
		p.fails++
		p.failStamp = stamp
		fails, retry := p.fails, p.fails < maxWarmFails
		var backoff time.Duration
		// Shells started together fail together: one back-off for them.
		if now := p.now(); !retry && !now.Before(p.retryAt) {
			p.backoff = min(max(2*p.backoff, warmBackoff), maxWarmBackoff)
			p.retryAt = now.Add(p.backoff)
			backoff = p.backoff
		}
		p.notifyLocked()
		p.mu.Unlock()
		if backoff > 0 {
			p.log.Warn("warm shell", "err", err, "fails", fails, "retryIn", backoff)
		} else {
			p.log.Warn("warm shell", "err", err)
		}
		if retry {
			time.AfterFunc(100*time.Millisecond, p.fill)
		}
		return
	}
	wasFailing := p.fails > 0
	p.resetFailsLocked()
	p.ready = append(p.ready, w)
	p.notifyLocked()
	p.mu.Unlock()
	if wasFailing {
		p.fill() // a probe after a back-off: start the others
	}
}

// discard kills a warm shell that will not be used and closes its files.
func (p *pool) discard(w *warmShell) {
	p.stop(w)
}

// take hands out a ready warm shell for a request that is eligible (see
// warmEnv) or returns nil (an unconfigured pool: cold start).
func (p *pool) take(uid, gid uint32, env []string, cwd string) *warmShell {
	p.mu.Lock()
	// Only a warm op configures the pool: a request's own env (which may
	// hold one-off values) must never become the warm shells' environment.
	if p.cfg == nil || p.cfg.uid != uid || p.cfg.gid != gid || !sameStartup(p.cfg.env, env) {
		p.mu.Unlock()
		return nil
	}
	var w *warmShell
	var dead []*warmShell
	// A shell whose profile files changed since it read them would miss
	// what a cold login shell sees (an export appended to ~/.profile).
	// The change may also have fixed what made warm starts fail.
	stamp := profileStamp(p.cfg.env)
	if p.fails > 0 && stamp != p.failStamp {
		p.resetFailsLocked()
	}
	for len(p.ready) > 0 && w == nil {
		c := p.ready[0]
		p.ready = p.ready[1:]
		select {
		case <-c.child.done:
			dead = append(dead, c)
		default:
			if c.prof != stamp {
				dead = append(dead, c)
				continue
			}
			w = c
		}
	}
	p.notifyLocked()
	p.mu.Unlock()
	for _, c := range dead {
		p.discard(c)
	}
	p.fill()
	return w
}

// profileStamp identifies the state of the files a login bash reads
// (size and modification time of each), so that warm shells started
// before one of them changed are not used.
func profileStamp(env []string) string {
	home, _ := lookupEnv(env, "HOME")
	paths := []string{"/etc/profile", "/etc/bash.bashrc", "/etc/profile.d"}
	if ents, err := os.ReadDir("/etc/profile.d"); err == nil {
		for _, e := range ents {
			paths = append(paths, "/etc/profile.d/"+e.Name())
		}
	}
	if home != "" {
		for _, f := range []string{".bash_profile", ".bash_login", ".profile", ".bashrc"} {
			paths = append(paths, home+"/"+f)
		}
	}
	var b strings.Builder
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String()
}

func sameStartup(base, req []string) bool {
	for _, name := range startupVars {
		bv, bok := lookupEnv(base, name)
		rv, rok := lookupEnv(req, name)
		if bok != rok || bv != rv {
			return false
		}
	}
	return true
}

func lookupEnv(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v, true
		}
	}
	return "", false
}

// warmCommand returns the command of a request a warm shell may run:
// exactly ["/bin/bash","-lc",CMD] with an environment the warm script can
// reproduce exactly.
func warmCommand(args, env []string) (string, bool) {
	if len(args) != 3 || args[0] != "/bin/bash" || args[1] != "-lc" || strings.IndexByte(args[2], 0) >= 0 {
		return "", false
	}
	seen := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || !isIdentifier(k) || seen[k] || bashSpecial[k] || strings.IndexByte(kv, 0) >= 0 {
			return "", false
		}
		seen[k] = true
	}
	if !seen["PATH"] { // a fresh bash would use its built-in, unexported PATH
		return "", false
	}
	return args[2], true
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range []byte(s) {
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// shQuote quotes s for bash as one word.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// warmScript is what a warm shell evals: turn the environment the shell
// was started with (base) into the request's (env), as a cold `bash -lc`
// would see it after its login profile: variables of base the request
// lacks are unset, variables the request adds or changes are exported, and
// what the profile added or changed (PATH additions, ~/.profile exports)
// stays unless the request changed that variable. Then (with fresh-bash
// PWD, SHLVL and OLDPWD) enter cwd and run cmd. The set-up is one line so
// cmd starts on line 2.
func warmScript(names, base, env []string, cwd, cmd string) string {
	want := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		want[k] = v
	}
	had := make(map[string]string, len(base))
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		had[k] = v
	}
	var b strings.Builder
	b.WriteString("unset -v __sbx_s")
	var unset []string
	for _, n := range names {
		_, inBase := had[n]
		if _, ok := want[n]; !ok && inBase && !bashManaged[n] && isIdentifier(n) {
			unset = append(unset, n)
		}
	}
	if len(unset) > 0 {
		b.WriteString("; unset -v " + strings.Join(unset, " ") + " 2>/dev/null")
	}
	var exports []string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if old, ok := had[k]; ok && old == v && k != "PWD" && k != "OLDPWD" {
			continue // unchanged since start: keep what the profile made of it
		}
		if !bashManaged[k] {
			exports = append(exports, k+"="+shQuote(v))
		}
	}
	if len(exports) > 0 {
		b.WriteString("; export " + strings.Join(exports, " "))
	}
	b.WriteString("; export SHLVL=" + strconv.Itoa(nextShellLevel(want)))
	b.WriteString("; cd -P -- " + shQuote(cwd) + " || exit 1")
	// A fresh bash keeps an inherited PWD naming the working directory.
	if pwd, ok := want["PWD"]; ok && strings.HasPrefix(pwd, "/") {
		b.WriteString("; [[ " + shQuote(pwd) + " -ef . ]] && PWD=" + shQuote(pwd))
	}
	// ... and an inherited OLDPWD naming a directory; else OLDPWD is
	// exported but unset.
	b.WriteString("; unset -v OLDPWD; declare -x OLDPWD")
	if old, ok := want["OLDPWD"]; ok {
		b.WriteString("; [[ -d " + shQuote(old) + " ]] && OLDPWD=" + shQuote(old))
	}
	b.WriteString("\n")
	b.WriteString(cmd)
	return b.String()
}

// nextShellLevel is the SHLVL a fresh bash derives from its environment.
func nextShellLevel(env map[string]string) int {
	n, err := strconv.Atoi(strings.TrimSpace(env["SHLVL"]))
	if err != nil {
		n = 0
	}
	switch n++; {
	case n < 0:
		return 0
	case n >= 1000:
		return 1
	}
	return n
}

// startWarm starts one warm shell and waits until its profile ran.
// stamp is the profileStamp read before it starts.
func (s *server) startWarm(cfg *warmConfig, stamp string) (_ *warmShell, err error) {
	var toClose []*os.File // the child's ends, and ours on failure
	w := &warmShell{base: cfg.env, prof: stamp}
	defer func() {
		for _, f := range toClose {
			f.Close()
		}
		if err != nil {
			if w.child != nil {
				s.reaper.killRunning(w.child)
			}
			w.closeFiles()
		}
	}()
	pipe := func() (r, wr *os.File, err error) {
		r, wr, err = os.Pipe()
		return
	}
	scriptR, scriptW, err := pipe()
	if err != nil {
		return nil, err
	}
	w.script = scriptW
	toClose = append(toClose, scriptR)
	mfd, err := unix.MemfdCreate("sandboxd-script", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	w.memfd = os.NewFile(uintptr(mfd), "sandboxd-script")
	readyR, readyW, err := pipe()
	if err != nil {
		return nil, err
	}
	toClose = append(toClose, readyR, readyW)
	stdinR, stdinW, err := pipe()
	if err != nil {
		return nil, err
	}
	w.stdin = stdinW
	toClose = append(toClose, stdinR)
	stdoutR, stdoutW, err := pipe()
	if err != nil {
		return nil, err
	}
	w.stdout = stdoutR
	toClose = append(toClose, stdoutW)
	stderrR, stderrW, err := pipe()
	if err != nil {
		return nil, err
	}
	w.stderr = stderrR
	toClose = append(toClose, stderrW)

	attr := &syscall.ProcAttr{
		Dir:   cfg.cwd,
		Env:   cfg.env,
		Files: []uintptr{stdinR.Fd(), stdoutW.Fd(), stderrW.Fd(), scriptR.Fd(), readyW.Fd(), w.memfd.Fd()},
		Sys:   userAttr(cfg.uid, cfg.gid),
	}
	args := []string{"/bin/bash", "-l", "-c", bootstrap}
	w.child, err = s.spawn(func() (int, error) { return syscall.ForkExec(args[0], args, attr) })
	if err != nil {
		return nil, err
	}
	for _, f := range []*os.File{scriptR, readyW, stdinR, stdoutW, stderrW} {
		f.Close()
	}
	toClose = []*os.File{readyR}
	readyR.SetReadDeadline(time.Now().Add(warmTimeout))
	out, err := io.ReadAll(io.LimitReader(readyR, 1<<20))
	if err != nil {
		return nil, err
	}
	names := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(names) == 0 || names[len(names)-1] != "#ok" {
		return nil, errors.New("warm shell did not start")
	}
	w.names = names[:len(names)-1]
	return w, nil
}

// run hands the request to the warm shell.
func (w *warmShell) run(env []string, cwd, cmd string, stdin bool) (*proc, error) {
	_, err := w.memfd.WriteAt([]byte(warmScript(w.names, w.base, env, cwd, cmd)+"\x00"), 0)
	if err == nil {
		_, err = w.script.Write([]byte{'g'})
	}
	w.memfd.Close()
	w.script.Close()
	w.memfd, w.script = nil, nil
	if err != nil {
		return nil, err
	}
	if !stdin {
		w.stdin.Close()
		w.stdin = nil
	}
	return &proc{child: w.child, warm: true, stdin: w.stdin, outs: []*os.File{w.stdout, w.stderr}}, nil
}

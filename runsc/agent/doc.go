// Package agent is the wire protocol of sandboxd-agent, the PID 1 of every
// sandbox, and the host-side client that speaks it. The agent starts
// processes (plain or on a PTY) on request over a unix socket, which is much
// cheaper than one `runsc exec` per command, and keeps a small pool of warm
// login shells so that `bash -lc CMD` does not pay for bash's start-up.
//
// # Transport
//
// The agent listens on a unix stream socket (mode 0600); inside the sandbox
// it is /.sandboxd/run/agent.sock, a host directory bind-mounted with
// runsc --host-uds=create, so the host dials <hostdir>/agent.sock.
// There is one connection per operation.
//
// # Request
//
// The client first sends one JSON object terminated by '\n' (at most
// MaxRequest bytes):
//
//	{"op":"start","args":["/bin/bash","-lc","make"],"env":["K=V",...],"cwd":"/workspace",
//	 "uid":1000,"gid":1000,"tty":false,"cols":80,"rows":24,"stdin":true}
//	{"op":"killall"}
//	{"op":"ping"}
//	{"op":"warm","env":["K=V",...],"count":2}
//	{"op":"dial","port":8000}
//	{"op":"suspend"}
//	{"op":"attach","pid":42}
//	{"op":"expire"}
//
// start: runs args (args[0] without a slash is looked up in the request's
// PATH) with exactly env, in cwd (default "/"), as uid/gid (default
// 1000/1000 when absent; supplementary groups are [gid]) with no
// capabilities and no_new_privs, as the leader of a new session and process
// group. RLIMITs are inherited from the agent. tty allocates a PTY of
// cols x rows (default 80x24) that becomes the controlling terminal and
// stdin/stdout/stderr. Without tty, stdin is a pipe fed by 'i' frames if
// "stdin" is true, else /dev/null (so a reading command sees EOF at once).
//
// killall: SIGKILLs every process of the sandbox but the agent (as PID 1:
// kill(-1); in serve mode: every descendant of the agent), waits until they
// are gone (bounded), restarts the warm shells and answers 'x' {"exitCode":0}.
//
// ping: answers 'x' {"exitCode":0}; for liveness and latency.
//
// warm: sets the base environment and size of the warm-shell pool (count 0
// disables it; optional "uid", "gid" default 1000, optional "cwd" default
// "/") and answers 'x' {"exitCode":0} once count shells are ready (or 'E'
// if they fail to start; at most about 10 s; the pool keeps the
// configuration and retries on its own). Repeating the current
// configuration keeps the pool, its failure count and back-off, and only
// waits for it to be full. Until a
// warm op is received every start is cold: a request's own environment
// (which may hold one-off values) never configures the pool.
//
// dial: connects to 127.0.0.1:port inside the sandbox (port 1-65535) and
// answers 'x' {"exitCode":0}; from then on the connection carries raw bytes
// in both directions, with no frames, until either side closes. A half-close
// is passed on (the agent shuts down the TCP connection's write side when
// the client shuts down its write side, and the other way round). A failed
// dial answers 'E' ("connection refused", "port unreachable", "bad port").
// This is the portal's only way in: it reaches the sandbox's loopback and
// nothing else, and gives the sandbox no new way out.
//
// suspend: before a checkpoint (gVisor cannot save a socket bound to a
// host file). The agent closes its listener and every other connection and
// answers 'x'. The processes whose connections it closed are not killed
// but parked: their output frames (and exit status) are kept, bounded,
// for the next client. SIGUSR1 to the agent makes it listen again (after
// the restore, or after a checkpoint that failed); a session still parked
// 60 s later is killed as if its connection had closed.
//
// attach: {"op":"attach","pid":N} gives the session of process N this
// connection: 'p' {"pid":N}, the frames kept meanwhile, then the session
// goes on exactly as on its first connection. If the session still has a
// connection (no suspend came), that one is cut and this one takes over.
// An unknown or ended process answers 'E' "no such process".
//
// expire: kills every session still parked (as its expiry 60 s after the
// re-listen would) and answers 'x'. The server sends it after a restore,
// once it re-attached every process it knows of: after a server restart it
// knows none, so terminals and code contexts of the lost server end at
// once instead of lingering.
//
// stats (debug): answers 'x' {"exitCode":0,"goroutines":N,"fds":N,"warm":N,
// "warmFails":N,"warmRetryMs":N}: ready warm shells, consecutive failed warm
// starts, and how long the pool's back-off has left (see Warm shells).
//
// # Frames
//
// After the request line, both directions carry binary frames: one type
// byte, a 4-byte big-endian payload length, then the payload (at most
// MaxFrame bytes).
//
// Agent to client:
//
//	'p' started  {"pid":N}                     (start only, first frame; "warm":true if a warm shell ran it)
//	'o' stdout   raw bytes                     (with tty: all terminal output)
//	'e' stderr   raw bytes                     (never with tty)
//	'x' exit     {"exitCode":N,"signal":"SIGKILL"|""}   then the agent closes the connection
//	'E' error    {"message":"..."}             then the agent closes the connection
//
// A process killed by a signal reports exitCode 128+signo and the signal's
// name. Error messages are fixed strings ("working directory does not
// exist", "executable not found", "permission denied", "process limit
// reached", ...) and never contain argv, paths or env values.
//
// Client to agent (start only):
//
//	'i' stdin bytes        written to the process's stdin (pipe or PTY)
//	'c' close stdin        (tty: writes the EOF character ^D)
//	'r' resize             {"cols":N,"rows":N}; tty only. After TIOCSWINSZ the
//	                       agent sends SIGWINCH to the terminal's foreground
//	                       process group itself (gVisor may not), or to the
//	                       session's group if that cannot be read.
//	's' signal             {"signal":"SIGINT","group":true}; group signals the
//	                       process group, else the process alone.
//
// If the connection closes (or is half-closed) before the process exited,
// the agent sends SIGHUP and SIGCONT to the other process groups of its
// session (an interactive shell's jobs: what the kernel does for a
// terminal that goes away, which gVisor does not), so they end unless they
// ignore hangups (nohup), and SIGKILLs its process group. Once the process exited, its group
// is left alone: background children outlive the command.
//
// Output is read from the pipes (or the PTY) as it comes and written to the
// connection; a slow client slows the process down by backpressure only
// once the socket buffer is full. Order is kept within each stream. After
// the process exits the agent drains the pipes until EOF, but for at most
// DrainGrace, since background children may hold them open; then it sends
// 'x'.
//
// # Warm shells
//
// A warm shell is `/bin/bash -l -c BOOTSTRAP` started ahead of time (new
// session, the pool's uid/gid, cwd and base environment). After the login
// profile ran, the bootstrap reports its exported variable names on fd 4
// and blocks reading one byte from a pipe on fd 3. For a request the agent
// writes a NUL-terminated script into a memfd on the shell's fd 5 (read
// with mapfile: buffered, and nothing to reopen), then the byte; the shell
// closes fds 3 and 5 and evals the script, which unsets and exports
// variables so the environment equals the request's exactly (bash's own
// PWD, SHLVL, OLDPWD and _ behave as in a fresh bash), changes to cwd
// (cd -P; failure exits 1) and runs the command from line 2 of the eval.
// The warm shell's stdin, stdout and stderr are pipes the agent owns;
// anything the profile printed is forwarded first, as with a cold start.
// A replacement shell is started as soon as one is handed out. A shell
// that fails to start (the profile exits it, or takes longer than 10 s)
// is retried after 100 ms; after 3 consecutive failures the pool backs
// off: it starts nothing until the back-off has passed (15 s, doubling
// up to 5 min for each further failure), and then one shell, on the next
// request, which refills the pool if it starts. A request that finds the
// login profile files changed since the last failure (size or mtime of
// /etc/profile, /etc/bash.bashrc, /etc/profile.d/*, ~/.bash_profile,
// ~/.bash_login, ~/.profile, ~/.bashrc) ends the back-off at once; so
// does killall, and a new configuration. A broken profile thus costs at
// most one start per back-off period, and only when requests come.
// A request uses a warm shell only
// if it is not a tty, its args are exactly ["/bin/bash","-lc",CMD], its
// uid/gid match the pool's, its env has PATH, no duplicate or non-identifier
// names, no bash-special names, and agrees with the pool's base env on the
// variables that steer bash's start-up (HOME, BASH_ENV, ENV, SHELLOPTS,
// BASHOPTS, POSIXLY_CORRECT). Otherwise, or when no warm shell is ready,
// the command starts cold. Differences to a cold `bash -lc CMD` that
// remain: variables the login profile changes are reset to the request's
// values (a cold login shell would keep the profile's PATH, for instance);
// a single simple command is not exec'ed in place of bash, so a signal
// sent to the process alone (group false) reaches bash, not the command;
// syntax errors are reported as "bash: eval: line N+1" instead of
// "bash: -c: line N"; $BASH_EXECUTION_STRING shows the bootstrap; a cwd
// the user may not enter fails with exit 1 and bash's message instead of
// an 'E' frame; and warm shells count against the user's RLIMIT_NPROC.
//
// # Client
//
// Client is safe for concurrent use; every call dials its own connection.
// A Process has one reader goroutine that demultiplexes frames into two
// bounded queues (StreamBuffer bytes each) for stdout and stderr: if the
// consumer of one stream stops reading, the whole connection blocks once
// that queue is full (including the other stream and the exit status), so
// read both streams (or neither, for small outputs) concurrently with Wait.
// ReadOutput reads both in the order the frames came, which two readers
// lose (the scrubber's merged view of a value split between the streams
// needs it).
package agent

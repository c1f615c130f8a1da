// Command sandboxd-agent runs inside every sandbox. It is a small static
// binary bind-mounted read-only at /.sandboxd/agent.
//
//	sandboxd-agent init            PID 1 of the sandbox: reaps orphaned
//	                               processes and exits on SIGTERM.
//	sandboxd-agent init --socket S PID 1 that also serves the agent protocol
//	                               (package sandboxd/runsc/agent) on unix
//	                               socket S: starts processes, plain or on a
//	                               PTY, and keeps warm login shells.
//	sandboxd-agent serve --socket S the same server without being PID 1 (tests,
//	                               debugging): it becomes a child subreaper and
//	                               killall kills its descendants only.
//	sandboxd-agent killall         kills every process but PID 1 (root only)
//	                               until none is left (or 10 s) and prints
//	                               the agent's KillResult JSON.
//	sandboxd-agent exec -- ARGV... starts ARGV as the leader of a new session
//	                               and process group, so a timeout can kill
//	                               the whole group (runsc kill --pgid).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"sandboxd/runsc/agent"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "init", "serve":
		fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
		socket := fs.String("socket", "", "serve the agent protocol on this unix socket")
		fs.Parse(os.Args[2:])
		switch {
		case *socket != "":
			os.Exit(runServer(*socket, os.Args[1] == "serve"))
		case os.Args[1] == "serve":
			usage()
		}
		runInit()
	case "killall":
		// As root beside PID 1 (runsc exec, when the agent does not
		// answer): the same verified rounds; the result goes to stdout.
		res := killEveryone(time.Now().Add(agent.DefaultKillWait))
		json.NewEncoder(os.Stdout).Encode(res)
	case "exec":
		args := os.Args[2:]
		if len(args) > 0 && args[0] == "--" {
			args = args[1:]
		}
		if len(args) == 0 {
			usage()
		}
		runExec(args)
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sandboxd-agent init [--socket PATH] | serve --socket PATH | killall | exec -- ARGV...")
	os.Exit(2)
}

// runInit reaps every child (orphans are re-parented to PID 1) until SIGTERM.
func runInit() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// runExec becomes a session and process-group leader, then replaces itself
// with argv, keeping the PID that runsc reported.
func runExec(args []string) {
	if _, err := syscall.Setsid(); err != nil {
		// Already a session leader: a new process group is enough.
		_ = syscall.Setpgid(0, 0)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxd-agent: %s: command not found\n", args[0])
		os.Exit(127)
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "sandboxd-agent: exec %s: %v\n", args[0], err)
	os.Exit(126)
}

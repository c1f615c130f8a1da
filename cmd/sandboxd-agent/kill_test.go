package main

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

// killRounds keeps going while something is left, and never reports
// "killed" for what it could not see.
func TestKillRounds(t *testing.T) {
	t.Run("dies after rounds", func(t *testing.T) {
		left, rounds := 40, 0
		res := killRounds(time.Now().Add(5*time.Second), func() ([]int, error) {
			return make([]int, left), nil
		}, func(v []int) { rounds++; left = len(v) / 2 })
		if !res.Killed() || rounds < 6 {
			t.Fatalf("%+v after %d rounds", res, rounds)
		}
	})
	t.Run("survivor at the deadline", func(t *testing.T) {
		t0 := time.Now()
		res := killRounds(t0.Add(200*time.Millisecond), func() ([]int, error) { return []int{7, 8, 9}, nil }, func([]int) {})
		if res.Killed() || res.Survivors != 3 || res.Unknown {
			t.Fatalf("%+v", res)
		}
		if d := time.Since(t0); d < 200*time.Millisecond || d > 2*time.Second {
			t.Fatalf("gave up after %v", d)
		}
	})
	t.Run("unreadable proc is unknown", func(t *testing.T) {
		res := killRounds(time.Now().Add(50*time.Millisecond), func() ([]int, error) { return nil, errors.New("EACCES") }, func([]int) {})
		if res.Killed() || !res.Unknown {
			t.Fatalf("%+v", res)
		}
	})
}

// liveProcesses sees a child and stops listing it once it is a zombie.
func TestLiveProcesses(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	has := func() bool {
		live, err := liveProcesses(func(p, ppid int) bool { return p == pid && ppid == os.Getpid() })
		if err != nil {
			t.Fatal(err)
		}
		return len(live) == 1
	}
	if !has() {
		t.Fatal("child not listed")
	}
	cmd.Process.Kill()
	for deadline := time.Now().Add(5 * time.Second); has(); {
		if time.Now().After(deadline) {
			t.Fatal("killed child (a zombie until reaped) still listed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Wait()
}

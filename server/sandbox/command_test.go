package sandbox

import (
	"reflect"
	"strings"
	"testing"

	"sandboxd/runsc"
)

func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("env entry %q has no '='", kv)
		}
		if _, dup := m[k]; dup {
			t.Fatalf("env has %s twice", k)
		}
		m[k] = v
	}
	return m
}

func TestCommandEnv(t *testing.T) {
	def := CommandEnv(nil, nil, nil)
	want := []string{
		"DISPLAY=:99", "HOME=/home/user", "HTTPS_PROXY=" + runsc.ProxyURL, "HTTP_PROXY=" + runsc.ProxyURL,
		"LANG=C.UTF-8", "LOGNAME=user", "NO_PROXY=localhost,127.0.0.1,::1", "PATH=" + runsc.BasePath,
		"SHELL=/bin/bash", "TERM=dumb", "USER=user",
		"http_proxy=" + runsc.ProxyURL, "https_proxy=" + runsc.ProxyURL, "no_proxy=localhost,127.0.0.1,::1",
	}
	if !reflect.DeepEqual(def, want) {
		t.Errorf("defaults = %q, want %q", def, want)
	}

	sessionEnv := map[string]string{"A": "session", "B": "session", "TERM": "xterm", "LANG": "de_DE.UTF-8"}
	secrets := map[string]string{"B": "secret", "C": "secret", "TOKEN": "s3cr3t-value"}
	reqEnv := map[string]string{"C": "request", "D": "request", "LANG": "request"}
	env := CommandEnv(sessionEnv, secrets, reqEnv)
	for i := 1; i < len(env); i++ {
		if env[i-1] >= env[i] {
			t.Fatalf("env not sorted: %q", env)
		}
	}
	m := envMap(t, env)
	wantM := map[string]string{
		"A": "session", "B": "secret", "C": "request", "D": "request", "TOKEN": "s3cr3t-value",
		"TERM": "xterm", "LANG": "request", "DISPLAY": ":99",
		"HOME": "/home/user", "USER": "user", "LOGNAME": "user", "SHELL": "/bin/bash", "PATH": runsc.BasePath,
	}
	for k, v := range runsc.ProxyEnv() {
		wantM[k] = v
	}
	if !reflect.DeepEqual(m, wantM) {
		t.Errorf("CommandEnv = %v, want %v", m, wantM)
	}
	// Inputs are not modified.
	if sessionEnv["B"] != "session" || len(sessionEnv) != 4 {
		t.Errorf("sessionEnv modified: %v", sessionEnv)
	}
}

package server

import (
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
)

var (
	sessionIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	repoOwnerRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,38}$`)
	repoNameRe  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)
	branchRe    = regexp.MustCompile(`^[A-Za-z0-9._/-]{1,255}$`)
	envKeyRe    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
)

// validSessionID reports whether s is a session id: 1-128 of [A-Za-z0-9._-],
// starting with a letter or digit.
func validSessionID(s string) bool { return sessionIDRe.MatchString(s) }

// reservedSessionIDs are the routes' own words after /v1/sandbox/: a
// session so named would be routed as another session's action (the
// router matches these first). TestReservedSessionIDsCoverTheRoutes keeps
// the list whole.
var reservedSessionIDs = map[string]bool{"terminal": true, "python": true, "node": true, "proxy": true}

// validRepo reports whether s is owner/name as GitHub allows them.
func validRepo(s string) bool {
	owner, name, ok := strings.Cut(s, "/")
	return ok && repoOwnerRe.MatchString(owner) && repoNameRe.MatchString(name) && name != "." && name != ".."
}

// validBranch applies git's branch name rules (git check-ref-format
// --branch, which also refuses "HEAD") on top of a strict character set.
func validBranch(s string) bool {
	if !branchRe.MatchString(s) || s == "@" || s == "HEAD" {
		return false
	}
	if strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/") || strings.HasSuffix(s, ".") ||
		strings.Contains(s, "..") || strings.Contains(s, "//") || strings.Contains(s, "@{") ||
		strings.HasPrefix(s, "-") {
		return false
	}
	for _, comp := range strings.Split(s, "/") {
		if strings.HasPrefix(comp, ".") || strings.HasSuffix(comp, ".lock") {
			return false
		}
	}
	return true
}

// reservedEnv are variables the platform sets; a client may not override them.
var reservedEnv = map[string]bool{"HOME": true, "USER": true, "LOGNAME": true, "SHELL": true}

// loaderOrShellVar reports a variable the dynamic loader, the shell or an
// interpreter acts on (code to load or source, the command search path).
// Such a name is no credential: as a secret its value would be redacted
// wherever it is printed, and a mistyped one would change what runs.
func loaderOrShellVar(k string) bool {
	switch k {
	case "PATH", "IFS", "ENV", "BASH_ENV", "PROMPT_COMMAND", "PS1", "PS2", "PS4", "SHELLOPTS", "BASHOPTS",
		"PYTHONPATH", "PYTHONSTARTUP", "NODE_OPTIONS", "NODE_PATH":
		return true
	}
	return strings.HasPrefix(k, "LD_") || strings.HasPrefix(k, "BASH_FUNC_")
}

// checkSecretNames refuses secrets named like loader or shell variables.
func checkSecretNames(secrets map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(secrets)) {
		if loaderOrShellVar(k) {
			return badRequest("secrets: %s is read by the shell, the loader or an interpreter, not a credential; pass it in env", k)
		}
	}
	return nil
}

// checkEnv validates an env map; field names the JSON field for messages.
// Names are checked in order, so a request always gets the same message.
func checkEnv(field string, env map[string]string) error {
	if len(env) > 256 {
		return badRequest("%s: at most 256 variables", field)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		if !envKeyRe.MatchString(k) {
			return badRequest("%s: invalid variable name (letters, digits, '_', not starting with a digit)", field)
		}
		if reservedEnv[k] {
			return badRequest("%s: %s is set by the platform", field, k)
		}
		if strings.ContainsRune(v, 0) {
			return badRequest("%s: value of %s must not contain NUL", field, k)
		}
		if len(v) > 128*1024 { // secrets: scrub.MaxValueLen, checked after
			return badRequest("%s: value of %s is %d bytes, over the 128 KiB a value may have", field, k, len(v))
		}
	}
	return nil
}

// validCwd reports whether p is an absolute, clean path without NUL.
func validCwd(p string) bool {
	return strings.HasPrefix(p, "/") && len(p) <= 4096 && !strings.ContainsRune(p, 0) && path.Clean(p) == p
}

// Package config owns sandboxd's configuration: the built-in defaults
// (configs/sandboxd.yaml), the operator's file, environment and flag
// overrides, strict decoding and validation, and the size table. It imports
// no HTTP framework, sandbox driver or database, so commands that only read
// the configuration stay small.
//
// Concurrency: a loaded *Config is read-only; share it freely.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"sandboxd/configs"
	"sandboxd/egress"
	"sandboxd/runsc/image"
)

// Config is sandboxd's configuration (configs/sandboxd.yaml documents it).
type Config struct {
	Listen         string   `yaml:"listen"`
	DataDir        string   `yaml:"dataDir"`
	TrustedProxies []string `yaml:"trustedProxies"`
	AllowedOrigins []string `yaml:"allowedOrigins"`
	Runsc          struct {
		Binary   string `yaml:"binary"`
		Agent    string `yaml:"agent"`
		Platform string `yaml:"platform"`
		Debug    bool   `yaml:"debug"`
		// RestoreBackground resumes paused sandboxes with runsc restore
		// --background: they run once their kernel state is loaded, their
		// memory pages load after.
		RestoreBackground bool `yaml:"restoreBackground"`
	} `yaml:"runsc"`
	Image struct {
		CacheDir    string `yaml:"cacheDir"`
		Mirror      string `yaml:"mirror"`
		NPMRegistry string `yaml:"npmRegistry"`
		Suite       string `yaml:"suite"`
		AutoBuild   bool   `yaml:"autoBuild"`
	} `yaml:"image"`
	Limits  Limits  `yaml:"limits"`
	Portal  Portal  `yaml:"portal"`
	Git     Git     `yaml:"git"`
	Storage Storage `yaml:"storage"`

	EgressOptions struct {
		// Allowlist file (configs/egress.yaml's format); empty means the
		// built-in one.
		ConfigFile string `yaml:"configFile"`
	} `yaml:"egress"`

	SizesOptions struct {
		// Size table file (configs/sizes.yaml's format); empty means the
		// built-in one.
		ConfigFile string `yaml:"configFile"`
	} `yaml:"sizes"`

	PlansOptions struct {
		// Plan table file (configs/plans.yaml's format); empty means the
		// built-in one.
		ConfigFile string `yaml:"configFile"`
	} `yaml:"plans"`

	// Sizes is the size table, loaded from sizes.configFile or the
	// built-in configs/sizes.yaml.
	Sizes Sizes `yaml:"-"`
	// Plans is the plan table, loaded from plans.configFile or the
	// built-in configs/plans.yaml.
	Plans Plans `yaml:"-"`
	// Clock replaces the server's clock for credits, idle timeouts and
	// lifecycle times (tests); nil means time.Now().UTC().
	Clock func() time.Time `yaml:"-"`
	// Egress is the egress allowlist and dialer policy, loaded from
	// egress.configFile or the built-in configs/egress.yaml.
	Egress *egress.Config `yaml:"-"`
	// EgressResolver replaces the proxy's DNS resolver (tests map names to
	// loopback upstreams); nil means the host's.
	EgressResolver egress.Resolver `yaml:"-"`

	// pressureSet: the config file names limits.pressureFreeDiskMiB.
	pressureSet bool
}

// EnvVars are the environment variables Load reads.
var EnvVars = []string{"SANDBOXD_CONFIG", "SANDBOXD_LISTEN", "SANDBOXD_DATA_DIR"}

// Limits bound what clients and sandboxes may use (configs/sandboxd.yaml
// documents each).
type Limits struct {
	MaxBodyBytes         int64 `yaml:"maxBodyBytes"`
	ExecOutputBytes      int   `yaml:"execOutputBytes"`
	ExecMaxDroppedBytes  int64 `yaml:"execMaxDroppedBytes"`
	ExecDefaultTimeoutMs int64 `yaml:"execDefaultTimeoutMs"`
	ExecMaxTimeoutMs     int64 `yaml:"execMaxTimeoutMs"`
	MaxSandboxes         int   `yaml:"maxSandboxes"`
	MaxSandboxesPerOrg   int   `yaml:"maxSandboxesPerOrg"`
	MaxExecsPerSession   int   `yaml:"maxExecsPerSession"`
	MaxMemoryMiB         int   `yaml:"maxMemoryMiB"`
	// MemoryOvercommit lets the sizes of running sandboxes add up to
	// MaxMemoryMiB times this: an idle sandbox uses a small part of its
	// size. What is actually in use is watched with the two below.
	MemoryOvercommit float64 `yaml:"memoryOvercommit"`
	// MinFreeMemoryMiB: a start is refused (503) while the host has less
	// memory available (MemAvailable).
	MinFreeMemoryMiB int `yaml:"minFreeMemoryMiB"`
	// MinFreePids: a start is refused (503) while fewer process ids than
	// this are free on the host (kernel.pid_max or threads-max, less the
	// threads running): an idle sandbox takes about 30 host tasks, each
	// a pid, and a sandbox that cannot make a thread dies.
	MinFreePids int `yaml:"minFreePids"`
	// MaxSecretsMemoryMiB: the memory the server keeps for redacting the
	// secrets of its running sessions (each secret's encodings are
	// indexed, about 1 KB per secret byte; at most 32 KiB of secrets a
	// session); a provision or resume that would go over is refused (503,
	// Retry-After) before anything is compiled. Stopped sessions' indexes,
	// loaded for reads, are evicted for the room. 0: an eighth of the
	// host's memory.
	MaxSecretsMemoryMiB int `yaml:"maxSecretsMemoryMiB"`
	// PressureFreeMemoryMiB: below this much available memory the monitor
	// pauses the coldest idle sandboxes (idle at least
	// PressureMinIdleSeconds) with their memory; each resumes on its next
	// request.
	PressureFreeMemoryMiB  int `yaml:"pressureFreeMemoryMiB"`
	PressureMinIdleSeconds int `yaml:"pressureMinIdleSeconds"`
	// MinFreeDiskMiB: a provision, resume or restore is refused (503)
	// while the data dir's file system has less free space, and a save is
	// stopped before it would leave less.
	MinFreeDiskMiB int `yaml:"minFreeDiskMiB"`
	// PressureFreeDiskMiB: below this much free space on the data dir's
	// file system (less what sandboxes wrote that is still on its way
	// there), the monitor stops the running sandbox whose disk grew the
	// most, keeping its disk (0: off). More than MinFreeDiskMiB, so a
	// stopped session can still be resumed to clean up.
	PressureFreeDiskMiB int `yaml:"pressureFreeDiskMiB"`
	TerminalIdleSeconds int `yaml:"terminalIdleSeconds"`
	MaxAPIConns         int `yaml:"maxAPIConns"`
	APIIdleSeconds      int `yaml:"apiIdleSeconds"`
	// Per client (server/fair): connections of one address (0: an eighth
	// of maxAPIConns, at least 32), and for each address and each token a
	// request rate, its burst and the requests in flight at once (0: no
	// limit).
	MaxConnsPerClient   int     `yaml:"maxConnsPerClient"`
	RequestsPerSecond   float64 `yaml:"requestsPerSecond"`
	RequestBurst        int     `yaml:"requestBurst"`
	MaxRequestsInFlight int     `yaml:"maxRequestsInFlight"`
	// IdleAction is what a session's idle timeout does unless its
	// provision chose: IdleTeardown or IdlePause.
	IdleAction string `yaml:"idleAction"`
	// ScrubCPUCores is the server CPU (in cores) scrubbing one session's
	// output may use sustained, ScrubCPUBurstMs how much CPU time at once
	// above it; past that the session's output waits (streams/scrub
	// Budget). 0 cores: no budget.
	ScrubCPUCores   float64 `yaml:"scrubCpuCores"`
	ScrubCPUBurstMs int     `yaml:"scrubCpuBurstMs"`
}

// Storage is the organizations' storage, where teardown saves sessions
// (configs/sandboxd.yaml documents each).
type Storage struct {
	// OrgQuotaMiB caps the saves one organization keeps; 0: no cap.
	OrgQuotaMiB int64 `yaml:"orgQuotaMiB"`
}

// StorageDir is where the directory backend keeps each organization's
// objects.
func StorageDir(dataDir string) string { return filepath.Join(dataDir, "storage") }

// What an idle timeout does: tear the sandbox down (processes end, the
// disk is kept) or pause it with its memory (processes resume).
const (
	IdleTeardown = "teardown"
	IdlePause    = "pause"
)

// Portal is where browsers reach sandboxes (configs/sandboxd.yaml
// documents each).
type Portal struct {
	Domain             string   `yaml:"domain"`
	Scheme             string   `yaml:"scheme"`
	Port               int      `yaml:"port"`
	FrameAncestors     []string `yaml:"frameAncestors"`
	ServiceIdleSeconds int      `yaml:"serviceIdleSeconds"`
}

// Git is the Git host that sessions pair with (configs/sandboxd.yaml
// documents each key).
type Git struct {
	WebURL              string `yaml:"webURL"`
	APIURL              string `yaml:"apiURL"`
	CAFile              string `yaml:"caFile"`
	Username            string `yaml:"username"`
	CloneTimeoutSeconds int    `yaml:"cloneTimeoutSeconds"`
	PushTimeoutSeconds  int    `yaml:"pushTimeoutSeconds"`
}

// WebHost returns the web URL's host (lower case, no port), its port (443
// when absent) and its path prefix without a trailing slash ("" for none).
// Valid only after validation.
func (g *Git) WebHost() (host string, port int, prefix string) {
	u, _ := url.Parse(g.WebURL)
	port = 443
	if p := u.Port(); p != "" {
		port, _ = strconv.Atoi(p)
	}
	return strings.ToLower(u.Hostname()), port, strings.TrimSuffix(u.EscapedPath(), "/")
}

func (g *Git) validate() []error {
	var errs []error
	checkURL := func(key, v string) bool {
		u, err := url.Parse(v)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
			!gitPathRe.MatchString(u.EscapedPath()) || !domainRe.MatchString(strings.ToLower(u.Hostname())) {
			errs = append(errs, fmt.Errorf("git.%s: must be an https URL of a named host, e.g. https://github.com or https://git.example.com/prefix", key))
			return false
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				errs = append(errs, fmt.Errorf("git.%s: bad port", key))
				return false
			}
		}
		return true
	}
	if checkURL("webURL", g.WebURL) {
		g.WebURL = strings.TrimSuffix(g.WebURL, "/")
	}
	if g.APIURL != "" && checkURL("apiURL", g.APIURL) {
		g.APIURL = strings.TrimSuffix(g.APIURL, "/")
	}
	if g.CAFile != "" && !filepath.IsAbs(g.CAFile) {
		errs = append(errs, errors.New("git.caFile: must be an absolute path"))
	}
	if !gitUserRe.MatchString(g.Username) {
		errs = append(errs, errors.New("git.username: 1-64 of [A-Za-z0-9._-]"))
	}
	if g.CloneTimeoutSeconds < 1 || g.PushTimeoutSeconds < 1 {
		errs = append(errs, errors.New("git.cloneTimeoutSeconds, git.pushTimeoutSeconds: must be 1 or more"))
	}
	return errs
}

var (
	gitPathRe = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)*/?$`)
	gitUserRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// Overrides are values from flags and environment; empty means "not set".
type Overrides struct {
	ConfigFile, Listen, DataDir string
}

// Load builds the configuration: built-in defaults, then the config
// file, then environment, then flags (each beats the previous). Unknown keys
// in a file are errors.
func Load(flags Overrides) (*Config, error) {
	var c Config
	def, err := configs.FS.ReadFile("sandboxd.yaml")
	if err != nil {
		return nil, err
	}
	if err := decodeStrict(def, &c); err != nil {
		return nil, fmt.Errorf("built-in config: %w", err)
	}
	file := firstNonEmpty(flags.ConfigFile, os.Getenv("SANDBOXD_CONFIG"))
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		if err := decodeStrict(b, &c); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		c.pressureSet = setsPressure(b)
	}
	c.Listen = firstNonEmpty(flags.Listen, os.Getenv("SANDBOXD_LISTEN"), c.Listen)
	c.DataDir = firstNonEmpty(flags.DataDir, os.Getenv("SANDBOXD_DATA_DIR"), c.DataDir)
	if c.SizesOptions.ConfigFile != "" {
		b, err := os.ReadFile(c.SizesOptions.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("sizes config: %w", err)
		}
		if c.Sizes, err = ParseSizes(b); err != nil {
			return nil, fmt.Errorf("sizes config %s: %w", c.SizesOptions.ConfigFile, err)
		}
	} else {
		sz, err := configs.FS.ReadFile("sizes.yaml")
		if err != nil {
			return nil, err
		}
		if c.Sizes, err = ParseSizes(sz); err != nil {
			return nil, fmt.Errorf("built-in sizes: %w", err)
		}
	}
	plans, err := configs.FS.ReadFile("plans.yaml")
	if err != nil {
		return nil, err
	}
	what := "built-in plans"
	if c.PlansOptions.ConfigFile != "" {
		if plans, err = os.ReadFile(c.PlansOptions.ConfigFile); err != nil {
			return nil, fmt.Errorf("plans config: %w", err)
		}
		what = "plans config " + c.PlansOptions.ConfigFile
	}
	if c.Plans, err = ParsePlans(plans, c.Sizes); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c.EgressOptions.ConfigFile != "" {
		b, err := os.ReadFile(c.EgressOptions.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("egress config: %w", err)
		}
		if c.Egress, err = egress.LoadConfig(b); err != nil {
			return nil, fmt.Errorf("egress config %s: %w", c.EgressOptions.ConfigFile, err)
		}
	} else {
		b, err := configs.FS.ReadFile("egress.yaml")
		if err != nil {
			return nil, err
		}
		if c.Egress, err = egress.LoadConfig(b); err != nil {
			return nil, fmt.Errorf("built-in egress config: %w", err)
		}
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// setsPressure tells whether a config file names limits.pressureFreeDiskMiB.
func setsPressure(b []byte) bool {
	var v struct {
		Limits struct {
			P *int `yaml:"pressureFreeDiskMiB"`
		} `yaml:"limits"`
	}
	return yaml.Unmarshal(b, &v) == nil && v.Limits.P != nil
}

func decodeStrict(b []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

var mirrorRe = regexp.MustCompile(`^https?://[A-Za-z0-9.\-:/_]+$`)

// resolveSymlinks is p with the symlinks of its longest existing prefix
// resolved: runsc's gofer refuses mounts whose path it finds changed by a
// link (a data dir under a linked /var/lib), and mountinfo names the real
// path. What does not exist yet is kept as given.
func resolveSymlinks(p string) string {
	rest := ""
	for dir := p; ; dir = filepath.Dir(dir) {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest)
		}
		if dir == filepath.Dir(dir) {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
}

// defaultPressureFreeDiskMiB is configs/sandboxd.yaml's
// limits.pressureFreeDiskMiB.
const defaultPressureFreeDiskMiB = 4096

func (c *Config) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen: %w", err))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("dataDir: required"))
	} else if abs, err := filepath.Abs(c.DataDir); err != nil {
		errs = append(errs, fmt.Errorf("dataDir: %w", err))
	} else {
		c.DataDir = resolveSymlinks(abs)
	}
	if c.Image.CacheDir == "" || !filepath.IsAbs(c.Image.CacheDir) {
		errs = append(errs, errors.New("image.cacheDir: must be an absolute path"))
	}
	if !mirrorRe.MatchString(c.Image.Mirror) {
		errs = append(errs, errors.New("image.mirror: must be an http(s) URL"))
	}
	if !mirrorRe.MatchString(c.Image.NPMRegistry) {
		errs = append(errs, errors.New("image.npmRegistry: must be an http(s) URL"))
	}
	for _, p := range c.TrustedProxies {
		if _, _, err := net.ParseCIDR(p); err != nil && net.ParseIP(p) == nil {
			errs = append(errs, fmt.Errorf("trustedProxies: %q is not an IP or CIDR", p))
		}
	}
	errs = append(errs, c.Portal.validate()...)
	errs = append(errs, c.Git.validate()...)
	// A floor left at its default under a raised minFreeDiskMiB (a config
	// from before pressureFreeDiskMiB) follows it instead of failing.
	// A floor the file names itself is kept as written (and checked below).
	if !c.pressureSet && c.Limits.PressureFreeDiskMiB == defaultPressureFreeDiskMiB && c.Limits.MinFreeDiskMiB >= defaultPressureFreeDiskMiB {
		c.Limits.PressureFreeDiskMiB = 2 * c.Limits.MinFreeDiskMiB
	}
	l := c.Limits
	for _, f := range []struct {
		name     string
		v, least int64
	}{
		{"maxBodyBytes", int64(l.MaxBodyBytes), 1024}, {"execOutputBytes", int64(l.ExecOutputBytes), 1024},
		{"execMaxDroppedBytes", l.ExecMaxDroppedBytes, 0}, {"execDefaultTimeoutMs", int64(l.ExecDefaultTimeoutMs), 1},
		{"execMaxTimeoutMs", int64(l.ExecMaxTimeoutMs), int64(max(l.ExecDefaultTimeoutMs, 1))},
		{"maxSandboxes", int64(l.MaxSandboxes), 1}, {"maxSandboxesPerOrg", int64(l.MaxSandboxesPerOrg), 1},
		{"maxExecsPerSession", int64(l.MaxExecsPerSession), 1}, {"maxMemoryMiB", int64(l.MaxMemoryMiB), 0},
		{"minFreeDiskMiB", int64(l.MinFreeDiskMiB), 0}, {"terminalIdleSeconds", int64(l.TerminalIdleSeconds), 1},
		{"maxAPIConns", int64(l.MaxAPIConns), 0}, {"apiIdleSeconds", int64(l.APIIdleSeconds), 1},
	} {
		if f.v < f.least {
			errs = append(errs, fmt.Errorf("limits.%s: %d is less than %d", f.name, f.v, f.least))
		}
	}
	if !(l.MemoryOvercommit >= 1 && l.MemoryOvercommit <= 1000) {
		errs = append(errs, fmt.Errorf("limits.memoryOvercommit: %v is not between 1 (no overcommit) and 1000", l.MemoryOvercommit))
	}
	if l.MinFreeMemoryMiB < 0 || l.PressureFreeMemoryMiB < 0 || l.PressureMinIdleSeconds < 0 || l.MinFreePids < 0 || l.MaxSecretsMemoryMiB < 0 {
		errs = append(errs, errors.New("limits: minFreeMemoryMiB, pressureFreeMemoryMiB, pressureMinIdleSeconds, minFreePids and maxSecretsMemoryMiB must be 0 or more"))
	}
	if l.PressureFreeDiskMiB < 0 || (l.PressureFreeDiskMiB > 0 && l.PressureFreeDiskMiB <= l.MinFreeDiskMiB) {
		errs = append(errs, fmt.Errorf("limits.pressureFreeDiskMiB: %d must be 0 (off) or more than limits.minFreeDiskMiB (%d): "+
			"growing sandboxes are stopped before provisions and resumes are refused (e.g. twice minFreeDiskMiB)", l.PressureFreeDiskMiB, l.MinFreeDiskMiB))
	}
	if l.MaxConnsPerClient < 0 {
		errs = append(errs, errors.New("limits.maxConnsPerClient: must be 0 (an eighth of maxAPIConns) or more"))
	}
	if l.RequestsPerSecond < 0 || math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0) {
		errs = append(errs, errors.New("limits.requestsPerSecond: must be 0 (no limit) or more"))
	} else if l.RequestsPerSecond > 0 && l.RequestBurst < 1 {
		errs = append(errs, errors.New("limits.requestBurst: must be 1 or more when requestsPerSecond is set"))
	}
	if l.RequestBurst < 0 {
		errs = append(errs, errors.New("limits.requestBurst: must be 0 or more"))
	}
	if l.MaxRequestsInFlight < 0 {
		errs = append(errs, errors.New("limits.maxRequestsInFlight: must be 0 (no limit) or more"))
	}
	if c.Storage.OrgQuotaMiB < 0 {
		errs = append(errs, errors.New("storage.orgQuotaMiB: must be 0 (no cap) or more"))
	}
	if math.IsNaN(l.ScrubCPUCores) || l.ScrubCPUCores < 0 || (l.ScrubCPUCores > 0 && l.ScrubCPUCores < 0.01) || l.ScrubCPUCores > 64 {
		errs = append(errs, errors.New("limits.scrubCpuCores: must be 0 (no budget) or 0.01 to 64"))
	} else if l.ScrubCPUCores > 0 && (l.ScrubCPUBurstMs < 1 || l.ScrubCPUBurstMs > 60000) {
		errs = append(errs, errors.New("limits.scrubCpuBurstMs: must be 1 to 60000 when scrubCpuCores is set"))
	}
	if l.IdleAction != IdleTeardown && l.IdleAction != IdlePause {
		errs = append(errs, fmt.Errorf("limits.idleAction: %q is not teardown or pause", l.IdleAction))
	}
	return errors.Join(errs...)
}

var (
	domainRe = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	originRe = regexp.MustCompile(`^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$`)
)

func (p *Portal) validate() []error {
	var errs []error
	if len(p.Domain) > 200 || !domainRe.MatchString(p.Domain) {
		errs = append(errs, errors.New("portal.domain: must be a lower-case DNS name such as localhost or sbx.example.com"))
	}
	if p.Scheme != "http" && p.Scheme != "https" {
		errs = append(errs, errors.New("portal.scheme: must be http or https"))
	}
	if p.Port < 0 || p.Port > 65535 {
		errs = append(errs, errors.New("portal.port: must be 0 (the API's port) to 65535"))
	}
	for _, o := range p.FrameAncestors {
		if !originRe.MatchString(o) {
			errs = append(errs, fmt.Errorf("portal.frameAncestors: %q is not an origin like https://app.example", o))
		}
	}
	if p.ServiceIdleSeconds < 0 {
		errs = append(errs, errors.New("portal.serviceIdleSeconds: must be 0 (never) or more"))
	}
	return errs
}

// recipeMain are the files of configs/image that Recipe names itself;
// every other file there is one of its Files.
var recipeMain = map[string]bool{"packages.txt": true, "build.sh": true, "setup.sh": true}

// ImageRecipe is the default image's recipe from configs/image.
func (c *Config) ImageRecipe() (image.Recipe, error) {
	files := map[string][]byte{}
	err := fs.WalkDir(configs.FS, "image", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel := strings.TrimPrefix(p, "image/")
		if recipeMain[rel] {
			return nil
		}
		b, err := configs.FS.ReadFile(p)
		files[rel] = b
		return err
	})
	if err != nil {
		return image.Recipe{}, err
	}
	pk, err := configs.FS.ReadFile("image/packages.txt")
	if err != nil {
		return image.Recipe{}, err
	}
	build, err := configs.FS.ReadFile("image/build.sh")
	if err != nil {
		return image.Recipe{}, err
	}
	setup, err := configs.FS.ReadFile("image/setup.sh")
	if err != nil {
		return image.Recipe{}, err
	}
	return image.Recipe{Suite: c.Image.Suite, Mirror: c.Image.Mirror, NPMRegistry: c.Image.NPMRegistry,
		Packages: image.ParsePackages(string(pk)), Build: build, Setup: setup, Files: files}, nil
}

// DBPath is the SQLite file inside a data directory.
func DBPath(dataDir string) string { return filepath.Join(dataDir, "sandboxd.db") }

// TrustBundlePath is the PEM bundle sandboxes trust (the image's roots and
// the installation's Git host CA), mounted over their system roots.
func TrustBundlePath(dataDir string) string { return filepath.Join(dataDir, "git-ca", "trust.pem") }

// ResourcePrefix names every host resource of the server with this data
// directory, so servers with different data directories never collide.
func ResourcePrefix(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "sbx" + hex.EncodeToString(sum[:3])
}

// Command sandboxd is the sandbox server and its operator tools.
//
//	sandboxd serve [--config FILE] [--listen ADDR] [--data-dir DIR] [--no-image-build]
//	sandboxd image                            build the default image if missing
//	sandboxd doctor [--json]                  check this machine; say what is missing and how to fix it
//	sandboxd gc [--apply] [--json]            list (remove) this installation's unclaimed leftovers
//	sandboxd org create NAME | org list
//	sandboxd user add ORG NAME --role ROLE [--operator]
//	sandboxd token create ORG USER [--name N]
//	sandboxd plan set ORG PLAN
//	sandboxd credits grant ORG AMOUNT [--note TEXT]
//	sandboxd secrets rotate-key               (server stopped)
//
// Every command but serve and image works on the data dir with the server
// stopped or running (SQLite in WAL mode; a busy database is waited for).
// Commands that print a secret print it alone on stdout, and their
// description on stderr, so scripts can capture the token.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"sandboxd/runsc/image"
	"sandboxd/server"
	"sandboxd/server/config"
	"sandboxd/store"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	os.Exit(report(os.Stderr, err))
}

// exitCode ends sandboxd with a status after the command printed its own
// findings (doctor's problems).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func report(w io.Writer, err error) int {
	var ec exitCode
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return int(ec)
	case errors.As(err, &ue):
		fmt.Fprintf(w, "sandboxd: %v\nRun 'sandboxd --help' for usage.\n", ue.error)
		return 2
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(w, "sandboxd: interrupted")
		return 130
	}
	fmt.Fprintf(w, "sandboxd: %v\n", err)
	return 1
}

// cli holds the output streams and the flags every command shares.
type cli struct {
	stdout, stderr io.Writer
	o              config.Overrides
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	c := &cli{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "sandboxd",
		Short: "The sandboxd server and its operator tools",
		Long: `sandboxd serves disposable gVisor sandboxes over a REST, WebSocket and MCP API.

Its other commands work on the data dir (--data-dir, $SANDBOXD_DATA_DIR or the
config file's dataDir; default /var/lib/sandboxd) with the server stopped or
running. The config file is --config, else $SANDBOXD_CONFIG, else
/etc/sandboxd/sandboxd.yaml when it exists (make install puts it there), else
the built-in defaults. Environment: SANDBOXD_LISTEN, SANDBOXD_DATA_DIR (flags
win); SANDBOXD_SECRETS_KEY (base64 of 32 bytes) replaces <data-dir>/secrets.key.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&c.o.ConfigFile, "config", "", "config file (YAML)")
	pf.StringVar(&c.o.DataDir, "data-dir", "", "data directory (default /var/lib/sandboxd)")
	root.AddCommand(c.serveCmd(), c.imageCmd(), c.doctorCmd(), c.gcCmd(), c.orgCmd(), c.userCmd(), c.tokenCmd(),
		c.planCmd(), c.creditsCmd(), c.secretsCmd())
	return root
}

// exactArgs is cobra.ExactArgs reported as a usage error naming the arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef("%s takes %d arguments (%v), got %d", cmd.CommandPath(), len(names), names, len(args))
		}
		return nil
	}
}

func requireRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root: sandboxes need network namespaces, mounts and cgroups (try: sudo make run)")
	}
	return nil
}

// installedConfig is the config file make install puts in place; every
// command reads it when neither --config nor SANDBOXD_CONFIG names one, so
// the operator commands see what the installed server does.
var installedConfig = "/etc/sandboxd/sandboxd.yaml"

// config loads the configuration the shared flags point at.
func (c *cli) config() (*config.Config, error) {
	o := c.o
	o.ConfigFile = c.configFile()
	return config.Load(o)
}

// rootConfig is the configuration of a command that needs root.
func (c *cli) rootConfig() (*config.Config, error) {
	if err := requireRoot(); err != nil {
		return nil, err
	}
	return c.config()
}

// configFile is the config file the commands read ("": the defaults).
func (c *cli) configFile() string {
	if c.o.ConfigFile != "" {
		return c.o.ConfigFile
	}
	if f := os.Getenv("SANDBOXD_CONFIG"); f != "" {
		return f
	}
	if _, err := os.Stat(installedConfig); err == nil {
		return installedConfig
	}
	return ""
}

// openDB opens the data dir's database, which must exist unless create.
func (c *cli) openDB(create bool) (*config.Config, *store.DB, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, nil, err
	}
	path := config.DBPath(cfg.DataDir)
	if _, err := os.Stat(path); err != nil {
		if !create {
			return nil, nil, fmt.Errorf("no database at %s: wrong --data-dir, or the server never ran there (sudo make run)", path)
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, nil, err
		}
	}
	db, err := store.Open(path)
	if err != nil {
		return nil, nil, err
	}
	return cfg, db, nil
}

func (c *cli) serveCmd() *cobra.Command {
	var noBuild bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Start the server (builds a missing image first)",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.rootConfig()
			if err != nil {
				return err
			}
			if noBuild {
				cfg.Image.AutoBuild = false
			}
			return server.Run(cmd.Context(), cfg, c.stdout)
		},
	}
	cmd.Flags().StringVar(&c.o.Listen, "listen", "", "listen address (default 127.0.0.1:8080)")
	cmd.Flags().BoolVar(&noBuild, "no-image-build", false, "fail instead of building a missing image")
	return cmd
}

func (c *cli) imageCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "image",
		Short: "Build the default image if it is missing",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.rootConfig()
			if err != nil {
				return err
			}
			r, err := cfg.ImageRecipe()
			if err != nil {
				return err
			}
			path, err := image.Ensure(cmd.Context(), cfg.Image.CacheDir, r, true, c.stdout)
			if err != nil {
				return err
			}
			fmt.Fprintln(c.stdout, "image ready:", path)
			return nil
		},
	}
}

func (c *cli) secretsCmd() *cobra.Command {
	secrets := &cobra.Command{Use: "secrets", Short: "The key that seals secrets at rest"}
	secrets.AddCommand(&cobra.Command{
		Use:   "rotate-key",
		Short: "Give the data dir a new secrets key and re-seal every stored secret (server stopped)",
		Long: `Gives the data directory a new secrets key (secrets.key) and re-seals every stored
secret with it. Stop the server first. Interrupted, it leaves every secret
readable; run it again to finish.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Getenv("SANDBOXD_SECRETS_KEY") != "" {
				return errors.New("SANDBOXD_SECRETS_KEY is set: the key comes from the environment; rotate it there (unset it to use the data directory's key file)")
			}
			cfg, err := c.config()
			if err != nil {
				return err
			}
			unlock, err := lockDataDir(cfg.DataDir)
			if err != nil {
				return err
			}
			defer unlock()
			n, err := store.RotateKey(cmd.Context(), cfg.DataDir, config.DBPath(cfg.DataDir))
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "new secrets key in %s; %d stored secrets re-sealed with it\n", filepath.Join(cfg.DataDir, store.KeyFile), n)
			return nil
		},
	})
	return secrets
}

// lockName is the data dir's lock file, which a running server holds.
const lockName = "sandboxd.lock"

// lockDataDir takes the data dir's lock, as the server does: it fails
// while a server runs there.
func lockDataDir(dataDir string) (unlock func(), err error) {
	lock, err := os.OpenFile(filepath.Join(dataDir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, errors.New("the data directory is in use: stop the server first")
	}
	return func() { lock.Close() }, nil
}

// serverRunning reports whether a server holds the data dir's lock.
func serverRunning(dataDir string) bool {
	lock, err := os.Open(filepath.Join(dataDir, lockName))
	if err != nil {
		return false
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return true
	}
	return false
}

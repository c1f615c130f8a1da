// Command sandboxd is the sandbox server and its operator tools.
//
//	sandboxd serve [--config FILE] [--listen ADDR] [--data-dir DIR] [--no-image-build]
//	sandboxd image [--config FILE]            build the default image if missing
//	sandboxd org create NAME [--data-dir DIR] [--config FILE]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"sandboxd/runsc/image"
	"sandboxd/server"
	"sandboxd/server/config"
	"sandboxd/store"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "image":
		err = buildImage(os.Args[2:])
	case "org":
		if len(os.Args) < 3 || os.Args[2] != "create" {
			usage()
		}
		err = orgCreate(os.Args[3:])
	case "secrets":
		if len(os.Args) < 3 || os.Args[2] != "rotate-key" {
			usage()
		}
		err = rotateKey(os.Args[3:])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "sandboxd: unknown command %q\n", os.Args[1])
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandboxd: %v\n", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  sandboxd serve [--config FILE] [--listen ADDR] [--data-dir DIR] [--no-image-build]
  sandboxd image [--config FILE]
  sandboxd org create NAME [--data-dir DIR] [--config FILE]
  sandboxd secrets rotate-key [--data-dir DIR] [--config FILE]   (server stopped)
Environment: SANDBOXD_LISTEN, SANDBOXD_DATA_DIR, SANDBOXD_CONFIG (flags win);
SANDBOXD_SECRETS_KEY (base64 of 32 bytes) replaces <data-dir>/secrets.key.
`)
	os.Exit(2)
}

func requireRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root: sandboxes need network namespaces, mounts and cgroups (try: sudo make run)")
	}
	return nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var o config.Overrides
	fs.StringVar(&o.ConfigFile, "config", "", "config file (YAML)")
	fs.StringVar(&o.Listen, "listen", "", "listen address (default 127.0.0.1:8080)")
	fs.StringVar(&o.DataDir, "data-dir", "", "data directory (default /var/lib/sandboxd)")
	noBuild := fs.Bool("no-image-build", false, "fail instead of building a missing image")
	fs.Parse(args)
	if err := requireRoot(); err != nil {
		return err
	}
	cfg, err := config.Load(o)
	if err != nil {
		return err
	}
	if *noBuild {
		cfg.Image.AutoBuild = false
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return server.Run(ctx, cfg, os.Stdout)
}

func buildImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	var o config.Overrides
	fs.StringVar(&o.ConfigFile, "config", "", "config file (YAML)")
	fs.Parse(args)
	if err := requireRoot(); err != nil {
		return err
	}
	cfg, err := config.Load(o)
	if err != nil {
		return err
	}
	r, err := cfg.ImageRecipe()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	path, err := image.Ensure(ctx, cfg.Image.CacheDir, r, true, os.Stdout)
	if err != nil {
		return err
	}
	fmt.Println("image ready:", path)
	return nil
}

func orgCreate(args []string) error {
	const use = "usage: sandboxd org create NAME [--data-dir DIR] [--config FILE]"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Println(use + "\n  creates an organization with an owner and prints the owner's token once")
		return nil
	}
	if len(args) < 1 || args[0] == "" || args[0][0] == '-' {
		return errors.New(use)
	}
	name := args[0]
	fs := flag.NewFlagSet("org create", flag.ExitOnError)
	var o config.Overrides
	fs.StringVar(&o.ConfigFile, "config", "", "config file (YAML)")
	fs.StringVar(&o.DataDir, "data-dir", "", "data directory")
	fs.Parse(args[1:])
	cfg, err := config.Load(o)
	if err != nil {
		return err
	}
	if err := store.ValidName(name); err != nil {
		return fmt.Errorf("organization name: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	db, err := store.Open(config.DBPath(cfg.DataDir))
	if err != nil {
		return err
	}
	defer db.Close()
	p, token, err := db.CreateOrg(context.Background(), name, "owner")
	if err != nil {
		return err
	}
	fmt.Printf("organization %s (%s) created; owner token (shown once):\n%s\n", name, p.Org.ID, token)
	return nil
}

// rotateKey: sandboxd secrets rotate-key. The server must be stopped: the
// command takes the data directory's lock, as the server does.
func rotateKey(args []string) error {
	fs := flag.NewFlagSet("secrets rotate-key", flag.ExitOnError)
	var o config.Overrides
	fs.StringVar(&o.ConfigFile, "config", "", "config file (YAML)")
	fs.StringVar(&o.DataDir, "data-dir", "", "data directory")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: sandboxd secrets rotate-key [--data-dir DIR] [--config FILE]\n"+
			"  gives the data directory a new secrets key (secrets.key) and re-seals every stored secret with it;\n"+
			"  stop the server first. Interrupted, it leaves every secret readable; run it again to finish.")
		fs.PrintDefaults()
	}
	fs.Parse(args)
	if os.Getenv("SANDBOXD_SECRETS_KEY") != "" {
		return errors.New("SANDBOXD_SECRETS_KEY is set: the key comes from the environment; rotate it there (unset it to use the data directory's key file)")
	}
	cfg, err := config.Load(o)
	if err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(cfg.DataDir, "sandboxd.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.New("the data directory is in use: stop the server first")
	}
	n, err := store.RotateKey(context.Background(), cfg.DataDir, config.DBPath(cfg.DataDir))
	if err != nil {
		return err
	}
	fmt.Printf("new secrets key in %s; %d stored secrets re-sealed with it\n", filepath.Join(cfg.DataDir, store.KeyFile), n)
	return nil
}

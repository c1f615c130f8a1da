package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultServer is the server sbx talks to when nothing else says.
const DefaultServer = "http://127.0.0.1:8080"

// fileConfig is $XDG_CONFIG_HOME/sbx/config.json (mode 0600), written by
// sbx login.
type fileConfig struct {
	Server string `json:"server"`
	Token  string `json:"token"`
}

// configPath is where login stores the server and token:
// $XDG_CONFIG_HOME/sbx/config.json, else ~/.config/sbx/config.json.
func configPath(getenv func(string) string) (string, error) {
	dir := getenv("XDG_CONFIG_HOME")
	if dir == "" || !filepath.IsAbs(dir) {
		home := getenv("HOME")
		if home == "" {
			var err error
			if home, err = os.UserHomeDir(); err != nil {
				return "", errors.New("no config directory: set XDG_CONFIG_HOME or HOME")
			}
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "sbx", "config.json"), nil
}

// loadConfig reads the config file; a missing file is an empty config.
func loadConfig(path string) (fileConfig, error) {
	var c fileConfig
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("read config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// saveConfig writes the config file atomically, readable only by its owner.
func saveConfig(path string, c fileConfig) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".config-*.json")
	if err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	defer os.Remove(f.Name())
	// CreateTemp makes the file 0600; say so anyway, whatever the umask.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("save config: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("save config: %w", err)
	}
	return nil
}

// credentials are the server and token a command uses, and where the token
// came from.
type credentials struct {
	Server, Token, TokenSource string
}

// resolve picks the server and the token. Server: --server, SBX_SERVER, the
// config file, DefaultServer. Token: --token, --token-file, SBX_TOKEN, the
// config file; the config file's token is used only with the server it
// was saved for, so a token never goes to another server by accident.
func resolve(flagServer, flagToken, flagTokenFile string, getenv func(string) string, stdin io.Reader, cfg fileConfig) (credentials, error) {
	var c credentials
	switch {
	case flagServer != "":
		c.Server = flagServer
	case getenv("SBX_SERVER") != "":
		c.Server = getenv("SBX_SERVER")
	case cfg.Server != "":
		c.Server = cfg.Server
	default:
		c.Server = DefaultServer
	}
	c.Server = strings.TrimRight(strings.TrimSpace(c.Server), "/")
	switch {
	case flagToken != "" && flagTokenFile != "":
		return c, usagef("--token and --token-file: give one")
	case flagToken != "":
		c.Token, c.TokenSource = flagToken, "--token"
	case flagTokenFile != "":
		t, err := readTokenFile(flagTokenFile, stdin)
		if err != nil {
			return c, err
		}
		c.Token, c.TokenSource = t, "--token-file"
	case getenv("SBX_TOKEN") != "":
		c.Token, c.TokenSource = strings.TrimSpace(getenv("SBX_TOKEN")), "SBX_TOKEN"
	case cfg.Token != "" && sameServer(cfg.Server, c.Server):
		c.Token, c.TokenSource = cfg.Token, "config"
	}
	return c, nil
}

// sameServer compares server URLs as sbx stores them.
func sameServer(a, b string) bool {
	norm := func(s string) string { return strings.TrimRight(strings.TrimSpace(s), "/") }
	if a == "" {
		a = DefaultServer
	}
	return norm(a) == norm(b)
}

// readTokenFile reads a token from a file ("-": standard input).
func readTokenFile(path string, stdin io.Reader) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, 64<<10))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return t, nil
}

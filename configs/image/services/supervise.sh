# Shared by /opt/sandboxd/bin/service-*: a service runs in the foreground,
# logs to its stdout/stderr, and ends (with a non-zero status) as soon as one
# of its processes ends, after stopping all the others. Whoever started it
# (the host) restarts it. Sourced by bash; the service names itself in SVC.
#
#   . /opt/sandboxd/lib/supervise.sh
#   spawn NAME command args...   # as often as needed
#   supervise                    # returns never
#
# The service runs in a process group of its own (the host starts it as a
# session leader; started from a shell, it makes one), so that stopping it
# reaches every process it started, grandchildren included.
set -u
: "${SVC:=${0##*/}}"

if [ "$(ps -o pgid= -p $$ | tr -d ' ')" != "$$" ]; then
  exec setsid "$0" "$@"
fi

log() { printf '%s: %s\n' "$SVC" "$*" >&2; }

declare -A SVC_CHILDREN=()

# stop ends the whole process group but this shell: TERM, then KILL for
# whatever is still there after 5 seconds.
stop() {
  trap '' TERM INT HUP
  kill -TERM 0 2>/dev/null
  local i
  for ((i = 0; i < 50; i++)); do
    others
    ((${#OTHERS[@]} == 0)) && return
    sleep 0.1
  done
  log "killing what did not stop: ${OTHERS[*]}"
  kill -KILL "${OTHERS[@]}" 2>/dev/null
}

# others sets OTHERS to the live processes of the service's group but this
# shell. It reads /proc with builtins only: a command substitution would be
# one more process of the group.
others() {
  OTHERS=()
  local f pid stat
  for f in /proc/[0-9]*/stat; do
    read -r stat 2>/dev/null < "$f" || continue
    pid=${f//[^0-9]/}
    # After "(comm) ": state, ppid, pgrp.
    set -- ${stat##*) }
    [ "$3" = "$$" ] && [ "$pid" != "$$" ] && [ "$1" != Z ] && OTHERS+=("$pid")
  done
  return 0
}

trap 'log "stopping (signal)"; stop; exit 143' TERM INT HUP

spawn() {
  local name=$1
  shift
  "$@" &
  SVC_CHILDREN[$!]=$name
  log "started $name (pid $!): $*"
}

# alive NAME is true while the process spawned as NAME runs.
alive() {
  local pid
  for pid in "${!SVC_CHILDREN[@]}"; do
    [ "${SVC_CHILDREN[$pid]}" = "$1" ] && kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}

supervise() {
  local pid rc
  wait -n -p pid
  rc=$?
  log "${SVC_CHILDREN[$pid]:-a child} (pid ${pid:-?}) ended with status $rc; stopping the service"
  stop
  ((rc == 0)) && rc=1
  exit "$rc"
}

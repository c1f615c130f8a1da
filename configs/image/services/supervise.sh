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
  local i left
  for ((i = 0; i < 50; i++)); do
    left=$(others)
    [ -z "$left" ] && return
    sleep 0.1
  done
  log "killing what did not stop: $left"
  # shellcheck disable=SC2086
  kill -KILL $left 2>/dev/null
}

# others lists the processes of the service's group but this shell.
others() {
  local p out=()
  # A lone command in $(...) runs without a subshell of its own, and pgrep
  # never lists itself: nothing but the service's processes is listed.
  for p in $(pgrep -g $$); do
    [ "$p" != $$ ] && out+=("$p")
  done
  echo "${out[*]}"
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

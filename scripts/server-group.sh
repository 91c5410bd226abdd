# Sourced by the *-lab.sh scripts: a server they start as a process group
# (setsid) under a time limit, its leader's pid in DIR/group.pid.

# group_wait NAME DIR SECONDS CHECK...: runs CHECK each second until it
# succeeds; fails, saying so, when the server has exited or after SECONDS.
group_wait() {
    local name=$1 dir=$2 secs=$3
    shift 3
    for _ in $(seq 1 "$secs"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$(cat "$dir/group.pid")" 2>/dev/null; then
            echo "$name: the server exited; see $dir/stdout" >&2
            return 1
        fi
        sleep 1
    done
    echo "$name: the server was not up within $secs s" >&2
    return 1
}

# group_stop DIR [STOP...]: asks the server to stop (the command STOP, or
# SIGTERM to its group), gives it 10 s, then ends the group: SIGTERM, and
# SIGKILL a second later.
group_stop() {
    local dir=$1 pid
    shift
    [ -f "$dir/group.pid" ] || return 0
    pid=$(cat "$dir/group.pid")
    if [ $# -gt 0 ]; then "$@" >/dev/null 2>&1 || true; else kill -TERM -- "-$pid" 2>/dev/null || true; fi
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        sleep 1
    fi
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$dir/group.pid"
}

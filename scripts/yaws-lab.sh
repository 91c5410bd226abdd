#!/usr/bin/env bash
# A private Yaws web server (Debian's yaws) for beamdiag's tests: its own
# node name, a port on loopback and a directory of its own, started under a
# time limit so that it stops on its own, and stopped by the suite.
# Usage: scripts/yaws-lab.sh start DIR [SECONDS] | wait DIR | stop DIR
# The node is beamdiag_yaws@$(hostname -s), its cookie in DIR/cookie, HTTP
# on 127.0.0.1:${BEAMDIAG_YAWS_PORT:-8099}: /static.txt (a 16 KB file) and
# /work.yaws (a dynamic page that builds and encodes a term per request).
set -euo pipefail
cmd=${1:?usage: yaws-lab.sh start|wait|stop DIR [SECONDS]}
dir=${2:?usage: yaws-lab.sh start|wait|stop DIR [SECONDS]}
limit=${3:-300}
port=${BEAMDIAG_YAWS_PORT:-8099}
ebin=$(ls -d /usr/lib/yaws/ebin 2>/dev/null || true)
[ -n "$ebin" ] || { echo "yaws-lab: yaws is not installed (scripts/setup.sh test)" >&2; exit 2; }
. "$(dirname "$0")/server-group.sh"

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

case "$cmd" in
start)
    mkdir -p "$dir/www" "$dir/log"
    head -c 16384 /dev/zero | tr '\0' 'x' >"$dir/www/static.txt"
    cat >"$dir/www/work.yaws" <<'YAWS'
<erl>
out(_A) ->
    T = [{N, integer_to_list(N), lists:seq(1, 20)} || N <- lists:seq(1, 400)],
    B = term_to_binary(T),
    {html, integer_to_list(erlang:phash2(binary_to_term(B)))}.
</erl>
YAWS
    cat >"$dir/yaws.conf" <<CONF
logdir = $dir/log
max_connections = 200
keepalive_timeout = 30000
<server beamdiag>
    port = $port
    listen = 127.0.0.1
    docroot = $dir/www
    access_log = false
</server>
CONF
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/cookie"
    chmod 600 "$dir/cookie"
    # HOME: yaws keeps its control file there.
    HOME="$dir" setsid timeout -k 10 "$limit" erl -noshell -noinput -pa "$ebin" \
        -sname beamdiag_yaws -setcookie "$(cat "$dir/cookie")" \
        -run yaws -conf "$dir/yaws.conf" -yaws id beamdiag_yaws \
        >"$dir/stdout" 2>&1 </dev/null &
    echo $! >"$dir/group.pid"
    ;;
wait)
    group_wait yaws-lab "$dir" 60 listening
    ;;
stop)
    group_stop "$dir"
    ;;
*)
    echo "yaws-lab: unknown command $cmd" >&2; exit 2
    ;;
esac

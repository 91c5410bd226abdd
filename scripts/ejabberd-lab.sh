#!/usr/bin/env bash
# A private ejabberd node (Debian's ejabberd) to judge beamdiag against: its
# own node name, one client port on loopback without TLS, its own spool,
# logs and configuration, started under a time limit so that it stops on
# its own.
# Usage: scripts/ejabberd-lab.sh start DIR [SECONDS] | wait DIR | stop DIR
#        | ctl DIR ARGS... (ejabberdctl against the node, e.g. register)
# The node is beamdiag_ejabberd@$(hostname -s), XMPP (domain localhost) on
# 127.0.0.1:${BEAMDIAG_EJABBERD_PORT:-5299}, its cookie that of the ejabberd
# user (/var/lib/ejabberd/.erlang.cookie).
set -euo pipefail
cmd=${1:?usage: ejabberd-lab.sh start|wait|stop|ctl DIR [SECONDS]}
dir=${2:?usage: ejabberd-lab.sh start|wait|stop|ctl DIR [SECONDS]}
limit=${3:-300}
port=${BEAMDIAG_EJABBERD_PORT:-5299}
node="beamdiag_ejabberd@$(hostname -s)"
. "$(dirname "$0")/server-group.sh"
command -v ejabberdctl >/dev/null || { echo "ejabberd-lab: ejabberd is not installed (apt-get install ejabberd)" >&2; exit 2; }

ctl() {
    ejabberdctl --node "$node" --config "$dir/ejabberd.yml" --ctl-config "$dir/ejabberdctl.cfg" \
        --spool "$dir/spool" --logs "$dir/logs" "$@"
}

case "$cmd" in
start)
    mkdir -p "$dir/spool" "$dir/logs"
    cat >"$dir/ejabberd.yml" <<YML
hosts:
  - localhost
loglevel: warning
auth_method: internal
default_db: mnesia
listen:
  -
    port: $port
    ip: "127.0.0.1"
    module: ejabberd_c2s
    max_stanza_size: 262144
    shaper: none
    access: all
acl:
  local:
    user_regexp: ""
access_rules:
  local:
    allow: local
shaper_rules:
  c2s_shaper: none
modules:
  mod_ping: {}
  mod_roster: {}
YML
    printf 'EJABBERD_BYPASS_WARNINGS=true\nERLANG_NODE=%s\n' "$node" >"$dir/ejabberdctl.cfg"
    chown -R ejabberd:ejabberd "$dir"
    # setsid: the server is a group the stop command (or the time limit)
    # ends as a whole.
    setsid timeout -k 10 "$limit" ejabberdctl --node "$node" --config "$dir/ejabberd.yml" \
        --ctl-config "$dir/ejabberdctl.cfg" --spool "$dir/spool" --logs "$dir/logs" \
        foreground >"$dir/stdout" 2>&1 </dev/null &
    echo $! >"$dir/group.pid"
    ;;
wait)
    group_wait ejabberd-lab "$dir" 90 ctl status
    ;;
stop)
    group_stop "$dir" ctl stop
    ;;
ctl)
    shift 2; ctl "$@"
    ;;
*)
    echo "ejabberd-lab: unknown command $cmd" >&2; exit 2
    ;;
esac

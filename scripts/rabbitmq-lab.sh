#!/usr/bin/env bash
# A private RabbitMQ node (Debian's rabbitmq-server) for beamdiag's tests:
# its own node name, ports on loopback and data directory, started under a
# time limit so that it stops on its own, and stopped by the suite.
# Usage: scripts/rabbitmq-lab.sh start DIR [SECONDS] | stop DIR | wait DIR
# DIR holds the node's data, logs and the pid of the time-limited server.
# Prints nothing on success; the node is beamdiag_rabbit@$(hostname -s),
# AMQP on 127.0.0.1:${BEAMDIAG_RABBIT_PORT:-5699}, its cookie that of the
# rabbitmq user (/var/lib/rabbitmq/.erlang.cookie).
set -euo pipefail
cmd=${1:?usage: rabbitmq-lab.sh start|stop|wait DIR [SECONDS]}
dir=${2:?usage: rabbitmq-lab.sh start|stop|wait DIR [SECONDS]}
limit=${3:-300}
port=${BEAMDIAG_RABBIT_PORT:-5699}
host=$(hostname -s)
node="beamdiag_rabbit@$host"
bin=/usr/lib/rabbitmq/bin
. "$(dirname "$0")/server-group.sh"
[ -x "$bin/rabbitmq-server" ] || { echo "rabbitmq-lab: rabbitmq-server is not installed (scripts/setup.sh test)" >&2; exit 2; }

ctl() {
    su rabbitmq -s /bin/sh -c "HOME=/var/lib/rabbitmq RABBITMQ_NODENAME=$node $bin/rabbitmqctl -n $node $*"
}

case "$cmd" in
start)
    mkdir -p "$dir"
    chown rabbitmq:rabbitmq "$dir"
    # setsid: the server and its epmd-free children form a group the stop
    # command (or the time limit) ends as a whole.
    setsid su rabbitmq -s /bin/sh -c "cd /var/lib/rabbitmq && exec env HOME=/var/lib/rabbitmq \
        RABBITMQ_NODENAME=$node RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$port \
        RABBITMQ_DIST_PORT=$((port + 20000)) RABBITMQ_MNESIA_BASE=$dir/mnesia \
        RABBITMQ_LOG_BASE=$dir/log RABBITMQ_PID_FILE=$dir/rabbit.pid \
        RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins RABBITMQ_ENABLED_PLUGINS= \
        RABBITMQ_CONFIG_FILE=$dir/none \
        timeout -k 10 $limit $bin/rabbitmq-server" >"$dir/stdout" 2>&1 </dev/null &
    echo $! >"$dir/group.pid"
    ;;
wait)
    # Up to 90 s for the node to boot (a loaded 2-core machine is slow).
    group_wait rabbitmq-lab "$dir" 90 ctl await_startup --timeout 1
    ;;
stop)
    group_stop "$dir" ctl stop
    ;;
ctl)
    shift 2; ctl "$@"
    ;;
*)
    echo "rabbitmq-lab: unknown command $cmd" >&2; exit 2
    ;;
esac

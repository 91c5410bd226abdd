#!/bin/sh
# Runs every bench/*.escript from the repository root and prints its figures.
# Escripts take their settings from the environment (see each one's header),
# not from arguments. Exit status: non-zero if any of them failed.
# bench/cluster.escript starts up to 200 small nodes (about 30 MB each); it
# skips a size the host's available memory cannot hold and says so.
set -u
cd "$(dirname "$0")/.." || exit 2
rebar3 compile >/dev/null || exit 2
status=0
for script in bench/*.escript; do
    [ -e "$script" ] || continue
    echo "### $script"
    if ! escript "$script"; then
        echo "### $script failed" >&2
        status=1
    fi
    echo
done
exit $status

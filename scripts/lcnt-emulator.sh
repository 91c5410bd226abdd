#!/usr/bin/env bash
# Makes sure the lock-counting emulator (erl -emu_type lcnt) is installed for
# the installed ERTS, building it once and reusing the cached build after.
# Needs root and the built escript (rebar3 escriptize).
# Cache: ${BEAMDIAG_CACHE:-/var/cache/beamdiag}
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BEAMDIAG_CACHE:-/var/cache/beamdiag}
escript=_build/default/bin/beamdiag
if [ ! -x "$escript" ]; then
    echo "lcnt-emulator: $escript is missing; run rebar3 escriptize first" >&2
    exit 1
fi
mkdir -p "$dir"
exec "$escript" emu-type build --install --add-deb-src --cache "$dir"

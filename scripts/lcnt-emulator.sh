#!/usr/bin/env bash
# Makes sure the lock-counting emulator (erl -emu_type lcnt) is installed for
# this machine's ERTS and for OTP 27's in the trixie root
# (scripts/otp-root.sh), building each once and reusing the cached build
# after. OTP 29 (sid) gets none: its source package is not served.
# Needs root and the built escript (rebar3 escriptize).
# Cache: ${BEAMDIAG_CACHE:-/var/cache/beamdiag}/<erts version>
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BEAMDIAG_CACHE:-/var/cache/beamdiag}
escript=_build/default/bin/beamdiag
if [ ! -x "$escript" ]; then
    echo "lcnt-emulator: $escript is missing; run rebar3 escriptize first" >&2
    exit 1
fi
mkdir -p "$dir"
nice "$escript" emu-type build --install --add-deb-src --cache "$dir"

# OTP 27: the same command run inside the trixie root with OTP 27's escript
# (it loads the OTP 25 beams), the cache and the escript mounted into it.
# There apt-get source gets only the upstream tarball (the Debian parts are
# not served), which beamdiag emu-type build then builds from.
root=$(scripts/otp-root.sh trixie)
erts=$(basename "$(ls -d "$root"/usr/lib/erlang/erts-* | head -1)")
if [ ! -f "$dir/${erts#erts-}/BUILD_INFO" ]; then
    # A build is coming: the compilers, make and the curses headers (the
    # emulator alone needs neither autoconf nor OpenSSL).
    scripts/otp-root.sh trixie build-essential libncurses-dev >/dev/null
fi
OTP_RUN_BIND="$(cd "$dir" && pwd):/var/cache/beamdiag $(cd "$(dirname "$escript")" && pwd):/opt/beamdiag" \
    scripts/otp-run.sh trixie nice escript /opt/beamdiag/beamdiag \
    emu-type build --install --add-deb-src --cache /var/cache/beamdiag

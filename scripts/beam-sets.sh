#!/usr/bin/env bash
# After each rebar3 compile (post_hooks in rebar.config): beamdiag's beams
# compiled again by other OTP releases' compilers, so that one build runs
# on, and ships its agent to, OTP 25 to 29 (src/session/beamdiag_beams.erl).
# Code compiled by OTP B loads on B to B+2 only: OTP 29 refuses OTP 25's.
# The other compilers come from the cached Debian roots (scripts/otp-root.sh:
# trixie has OTP 27); each set goes beside ebin as otpNN/, which the escript
# carries (escript_incl_extra). A missing root is said here, at build time,
# and the set left out: the build then runs on its own compiler's window
# only, and beamdiag says so at start on any other release.
# Environment: REBAR_BUILD_DIR (set by rebar3), BEAMDIAG_CACHE.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${REBAR_BUILD_DIR:?run by rebar3 as a post_hook of compile}
app=$build/lib/beamdiag
ebin=$app/ebin
[ -d "$ebin" ] || exit 0
cache=${BEAMDIAG_CACHE:-/var/cache/beamdiag}
# The release of the compiler rebar3 ran (ERLANG_TARGET: 25.2.3-x86_64-...).
host=${ERLANG_TARGET:-}
host=${host%%-*}
host=${host%%.*}
[ -n "$host" ] || host=$(erl -noshell -eval 'io:put_chars(erlang:system_info(otp_release)), halt().')

status=0
for set in 27:trixie; do
    rel=${set%%:*}
    suite=${set#*:}
    out=$app/otp$rel
    setcache=$(dirname "$build")/beam-set-cache/otp$rel
    [ "$rel" != "$host" ] || { rm -rf "$out"; continue; }
    root=$cache/roots/$suite
    why=
    if [ ! -f "$root/.beamdiag-ready" ] || [ ! -x "$root/usr/bin/escript" ]; then
        why="no OTP $rel root at $root (scripts/otp-root.sh $suite builds it)"
    elif [ "$(id -u)" -ne 0 ]; then
        why="compiling in the OTP $rel root needs root (scripts/otp-run.sh)"
    fi
    if [ -z "$why" ]; then
        mkdir -p "$out" "$setcache"
        OTP_RUN_BIND="$ebin:/beamdiag-set/in $out:/beamdiag-set/out $setcache:/beamdiag-set/cache $here:/beamdiag-set/scripts" \
            "$here/otp-run.sh" "$suite" escript /beamdiag-set/scripts/beam-set.escript \
            /beamdiag-set/in /beamdiag-set/out /beamdiag-set/cache
        rc=$?
        case $rc in
            0) continue ;;
            1) rm -rf "$out"; echo "beam-sets: the OTP $rel set failed to compile" >&2; status=1; continue ;;
            *) why="running in the OTP $rel root failed (exit $rc)" ;;
        esac
    fi
    rm -rf "$out"
    echo "beam-sets: WARNING: $why; this build holds no code compiled by OTP $rel:" \
         "its escript runs on OTP $host to $((host + 2)) only and, on any other release," \
         "stops at start saying so" >&2
done
exit $status

#!/usr/bin/env bash
# One of `make test`'s slow, cached preparations (scripts/test-run.sh starts
# them in the background at once), at the lowest CPU priority:
#   roots     the OTP 27 and 29 roots (network and disk, one to ten minutes),
#             then the escript again with OTP 27's beam set;
#   lcnt      the lock-counting emulators (a compile, the longest);
#   dialyzer  dialyzer's PLT (about 70 s on a fresh machine, 8 s once built).
#   scripts/test-prepare.sh roots|lcnt|dialyzer
# The kernel's autogroups (sched_autogroup_enabled) schedule each session as
# one group whatever its members' nice values, and the lab nodes of the
# tests each run in a session of their own: a build under `nice -n 19' alone
# took a whole group's share, as much CPU as any lab node, and starved the
# nodes whose CPU the tests measure. So the builds run in a session of their
# own (test-run.sh starts them with setsid and nice), and a job that leads
# its session gives its group nice 19 too; the programs a build's VM spawns
# get theirs from it (beamdiag_emu_os). The roots (network and disk, needed
# first) stay in make test's own session, at nice 19 inside it: its group's
# other members are the Common Test VMs, which mostly wait. Where the file
# is missing (no autogroups) only nice stays.
set -euo pipefail
cd "$(dirname "$0")/.."
REBAR=${REBAR:-rebar3}
if [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ]; then
    { echo 19 > /proc/self/autogroup; } 2>/dev/null || true
fi
case "${1:-}" in
    roots)
        scripts/otp-root.sh trixie elixir rebar3 >/dev/null
        scripts/otp-root.sh sid rebar3 >/dev/null
        # The escript holds OTP 27's code (for OTP 27 to 29) only when the
        # OTP 27 root was there when it was built (scripts/beam-sets.sh): on
        # a fresh machine `make build' came before the roots, so it is built
        # again now, in a build folder of its own, and moved into place in
        # one rename (the CPU lane's suites run the escript meanwhile).
        if [ ! -f _build/default/lib/beamdiag/otp27/beamdiag.set ]; then
            echo "test-prepare: building the escript again, with the OTP 27 root"
            again="$PWD/_build/with-roots"
            REBAR_BASE_DIR="$again" $REBAR compile
            rm -rf _build/default/lib/beamdiag/otp27.new
            cp -a "$again/default/lib/beamdiag/otp27" _build/default/lib/beamdiag/otp27.new
            rm -rf _build/default/lib/beamdiag/otp27
            mv _build/default/lib/beamdiag/otp27.new _build/default/lib/beamdiag/otp27
            REBAR_BASE_DIR="$again" $REBAR escriptize
            mv -f "$again/default/bin/beamdiag" _build/default/bin/beamdiag
        fi
        ;;
    lcnt)
        # Elixir and rebar3 go into the trixie root here too (the Elixir
        # suite's OTP 27 group; a minute on a fresh machine). The OTP 27
        # emulator is built in the trixie root; scripts/otp-root.sh takes a
        # lock per root, so the two jobs never build one root twice.
        scripts/lcnt-emulator.sh
        ;;
    dialyzer)
        # Built here so that `make check' after the tests only analyses;
        # its verdict is make check's.
        $REBAR dialyzer
        ;;
    *)
        echo "usage: scripts/test-prepare.sh roots|lcnt|dialyzer" >&2
        exit 2
        ;;
esac

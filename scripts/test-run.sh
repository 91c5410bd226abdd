#!/usr/bin/env bash
# `make test` after setup and build: the slow, cached preparations (the
# lock-counting emulators, the OTP 27 and 29 roots) start at once in the
# background, at the lowest CPU priority; meanwhile EUnit and the suites
# that need none of them run; then the suites that need them. Each phase's
# wall time is printed at the end, after the per-suite tables that the CT
# hook (test/beamdiag_cth.erl) prints. A phase that fails fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
REBAR=${REBAR:-rebar3}
logs=_build/test/logs
mkdir -p "$logs"
# The CT hook counts skips for a starved host across both CT runs.
export BEAMDIAG_STARVED_FILE="$PWD/$logs/starved.txt"
: > "$BEAMDIAG_STARVED_FILE"

# Suites that need an OTP root or a lock-counting emulator.
late="beamdiag_locks_SUITE beamdiag_otp_SUITE beamdiag_procs_SUITE beamdiag_profile_SUITE
      beamdiag_safety_SUITE beamdiag_elixir_SUITE beamdiag_sick_SUITE beamdiag_sickagent_SUITE"
early=()
for f in test/*_SUITE.erl; do
    s=$(basename "$f" .erl)
    case " $(echo $late) " in *" $s "*) ;; *) early+=("test/$s") ;; esac
done
late_paths=$(for s in $late; do printf 'test/%s,' "$s"; done)

t0=$(date +%s)
prep_log="$logs/prepare.log"
(
    set -e
    nice -n 19 scripts/lcnt-emulator.sh
    nice -n 19 scripts/otp-root.sh sid rebar3 >/dev/null
) >"$prep_log" 2>&1 &
prep=$!

status=0
t1=$(date +%s)
$REBAR do eunit, ct --cover=false --suite="$(IFS=,; echo "${early[*]}")" || status=1
t2=$(date +%s)
echo "test-run: waiting for the emulators and roots (log: $prep_log)"
if ! wait "$prep"; then
    echo "test-run: preparing the emulators or roots failed:" >&2
    tail -20 "$prep_log" >&2
    exit 1
fi
t3=$(date +%s)
$REBAR ct --cover=false --suite="${late_paths%,}" || status=1
t4=$(date +%s)
cat <<TIMES

make test phases (wall time, s):
  EUnit and the suites needing no root or emulator   $((t2 - t1))
  then waiting for the emulators and roots           $((t3 - t2))
  suites needing them                                $((t4 - t3))
  total                                              $((t4 - t0))
TIMES
exit $status

#!/usr/bin/env bash
# `make test` after setup and build: the slow, cached preparations start at
# once in the background, at the lowest CPU priority: the OTP 27 and 29
# roots (network and disk, minutes) in one job, the lock-counting
# emulators (a compile, the longest) in another, dialyzer's PLT in a third. Meanwhile EUnit and the
# suites that need neither run; then, once the roots are there, the suites
# that need a root; last, once the emulators are there, the lock-counting
# suites. On a warm cache both jobs end at once. Each phase's wall time is
# printed at the end, after the per-suite tables that the CT hook
# (test/beamdiag_cth.erl) prints, and last what failed, by phase (the tail
# of a long log is what a CI run shows). A phase that fails fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
REBAR=${REBAR:-rebar3}
logs=_build/test/logs
mkdir -p "$logs"
# The CT hook counts the skips of a starved host, and of a pathology the
# host did not produce, across the three CT runs (test/beamdiag_cth.erl).
export BEAMDIAG_STARVED_FILE="$PWD/$logs/starved.txt"
: > "$BEAMDIAG_STARVED_FILE"
rm -f "$logs/case_times.txt"

# Suites that need an OTP root, and those that need a lock-counting emulator.
roots_only="beamdiag_otp_SUITE beamdiag_profile_SUITE beamdiag_safety_SUITE beamdiag_elixir_SUITE
            beamdiag_sick_SUITE beamdiag_sickagent_SUITE beamdiag_erts_SUITE beamdiag_attach_SUITE
            beamdiag_sickwait_SUITE"
lcnt="beamdiag_locks_SUITE beamdiag_procs_SUITE"
early=()
for f in test/*_SUITE.erl; do
    s=$(basename "$f" .erl)
    case " $(echo $roots_only $lcnt) " in *" $s "*) ;; *) early+=("test/$s") ;; esac
done
paths() { for s in "$@"; do printf 'test/%s,' "$s"; done; }
roots_paths=$(paths $roots_only)
lcnt_paths=$(paths $lcnt)

t0=$(date +%s)
roots_log="$logs/prepare-roots.log"
lcnt_log="$logs/prepare-lcnt.log"
(
    set -e
    nice -n 19 scripts/otp-root.sh trixie elixir rebar3 >/dev/null
    nice -n 19 scripts/otp-root.sh sid rebar3 >/dev/null
) >"$roots_log" 2>&1 &
prep_roots=$!
# Elixir and rebar3 go into the trixie root here too (the Elixir suite's
# OTP 27 group; a minute on a fresh machine). The OTP 27 emulator is built
# in the trixie root; scripts/otp-root.sh
# takes a lock per root, so the two jobs never build one root twice.
nice -n 19 scripts/lcnt-emulator.sh >"$lcnt_log" 2>&1 &
prep_lcnt=$!
# Dialyzer's first run builds its PLT (about 70 s of wall time on a fresh
# machine, 8 s once built): built here, in the background, so that
# `make check' after the tests only analyses. Its verdict is make check's.
dialyzer_log="$logs/prepare-dialyzer.log"
nice -n 19 $REBAR dialyzer >"$dialyzer_log" 2>&1 &
prep_dialyzer=$!

# Waits for a preparation job; its failure ends the run with its log.
await() {
    echo "test-run: waiting for the $2 (log: $3)"
    if ! wait "$1"; then
        echo "test-run: preparing the $2 failed:" >&2
        tail -20 "$3" >&2
        exit 1
    fi
}

# Runs one phase, its output kept in $logs/phase-N.log beside the screen.
status=0
phase=0
run_phase() {
    phase=$((phase + 1))
    "$@" 2>&1 | tee "$logs/phase-$phase.log" || status=1
}
: > "$logs/phase-1.log"; : > "$logs/phase-2.log"; : > "$logs/phase-3.log"
t1=$(date +%s)
# EUnit, then the early suites whatever EUnit said (`rebar3 do' would stop
# at a failed EUnit and leave those suites unrun, their state unknown).
early_phase() {
    local s=0
    $REBAR eunit || s=1
    $REBAR ct --cover=false --suite="$(IFS=,; echo "${early[*]}")" || s=1
    return $s
}
run_phase early_phase
t2=$(date +%s)
await "$prep_roots" "OTP 27 and 29 roots" "$roots_log"
# The escript holds OTP 27's code (for OTP 27 to 29) only when the OTP 27
# root was there when it was built (scripts/beam-sets.sh): on a fresh
# machine `make build' came before the roots, so it is built again now,
# before the suites that run it on OTP 29.
if [ ! -f _build/default/lib/beamdiag/otp27/beamdiag.set ]; then
    echo "test-run: building the escript again, with the OTP 27 root"
    $REBAR escriptize || status=1
fi
t3=$(date +%s)
run_phase $REBAR ct --cover=false --suite="${roots_paths%,}"
t4=$(date +%s)
await "$prep_lcnt" "lock-counting emulators" "$lcnt_log"
t5=$(date +%s)
run_phase $REBAR ct --cover=false --suite="${lcnt_paths%,}"
t6=$(date +%s)
# The PLT is built long before this; only its verdict is left to make check.
wait "$prep_dialyzer" || true
cat <<TIMES

make test phases (wall time, s):
  EUnit and the suites needing no root or emulator   $((t2 - t1))
  then waiting for the roots (and the escript again) $((t3 - t2))
  suites needing a root                              $((t4 - t3))
  then waiting for the lock-counting emulators       $((t5 - t4))
  suites needing them                                $((t6 - t5))
  total                                              $((t6 - t0))
TIMES
if [ -s "$BEAMDIAG_STARVED_FILE" ]; then
    echo
    echo "every skip of this run (CI allows one starved and two not produced; a broken one, whose"
    echo "configuration function failed so that it never ran, fails the run):"
    sed 's/^/  /' "$BEAMDIAG_STARVED_FILE"
    if grep -q '^[^ ]* broken: ' "$BEAMDIAG_STARVED_FILE"; then
        status=1
    fi
fi
if [ "$status" != 0 ]; then
    echo
    echo "make test FAILED; what failed, by phase (logs: $logs/phase-N.log, $logs/ct_run.*):"
    for n in 1 2 3; do
        # EUnit's failing tests and tally, Common Test's failing cases and
        # its tallies, and rebar3's own errors (a compile, a run that
        # stopped: the phase's later suites did not run).
        sed 's/\x1b\[[0-9;]*m//g' "$logs/phase-$n.log" |
            grep -E '^ *(Failed: [1-9]|Failed [1-9][0-9]* tests|.*\*failed\*|%%% .* ==> .*: FAILED|%%% .* ==> .*(error|badmatch|timetrap|exit)|[0-9]+\) [a-z_0-9]+:[a-z_0-9]+/[0-9]+$|[0-9]+ tests, [1-9][0-9]* failures|[0-9]+ tests, [0-9]+ failures, [1-9][0-9]* cancelled|.*\{(setup|cleanup)_failed,|.*\[\{beamdiag_[a-z_0-9]+_tests,[a-z_0-9]+,[0-9]+,|===> .*Error)' |
            head -40 | sed "s/^/  phase $n: /"
        # Where each failed case failed: the assertion's line and expression
        # (or the reason's first line), so that the run's last lines say why.
        sed 's/\x1b\[[0-9;]*m//g' "$logs/phase-$n.log" | awk -v phase="$n" '
            /==> .*: FAILED$/ { if (c != "") print_it(); c = $0; sub(/^%%% /, "", c); sub(/: FAILED$/, "", c); k = 0; l = ""; e = ""; r = ""; next }
            c != "" && k < 25 {
                k++
                if (l == "" && match($0, /\{line,[0-9]+\}/)) l = substr($0, RSTART + 6, RLENGTH - 7)
                if (e == "" && match($0, /\{expression,".*"\}/)) e = substr($0, RSTART + 12, RLENGTH - 13)
                # The reason: its first three lines, joined, whatever their form.
                if (k <= 3) { t = $0; sub(/^%%% [^ ]* ==> ?/, "", t); gsub(/[ \t]+/, " ", t); r = substr(r t, 1, 200) }
                if (k == 25) print_it()
            }
            function print_it() { printf "  phase %s: %s failed%s%s\n", phase, c, (l != "" ? " at line " l : ""), (e != "" ? ": " e : (r != "" ? ": " r : "")); c = "" }
            END { if (c != "") print_it() }'
    done
    # EUnit's failures: each test's assertion and what it got, on one line.
    sed 's/\x1b\[[0-9;]*m//g' "$logs/phase-1.log" | awk '
        /^  [0-9]+\) [a-z_0-9]+:[a-z_0-9]+\/[0-9]+$/ { if (t != "") print_it(); t = $2; r = ""; k = 0; next }
        t != "" && /^ *(Output:|%% )/ { print_it(); next }
        t != "" && k < 8 { k++; x = $0; gsub(/[ \t]+/, " ", x); r = substr(r x, 1, 400) }
        function print_it() { printf "  phase 1: %s failed:%s\n", t, r; t = "" }
        END { if (t != "") print_it() }'
    grep '^[^ ]* broken: ' "$BEAMDIAG_STARVED_FILE" 2>/dev/null | cut -c1-300 | sed 's/^/  never ran: /'
fi
exit $status

#!/usr/bin/env bash
# `make test` after setup and build. The slow, cached preparations start at
# once in the background, at the lowest CPU priority, the builds each in a
# session of its own (scripts/test-prepare.sh): the OTP 27 and 29 roots, the
# lock-counting emulators, dialyzer's PLT. EUnit runs first; then the
# suites run in two lanes at once, because most of a suite's wall time is
# windows waited, not work:
#   - the CPU lane: the suites whose cases burn the host's CPUs or measure
#     how much CPU a node got (saturation, starvation, perf, lock counting,
#     the fuzzer), one after another, so that none of them shares the host
#     with another such suite;
#   - the quiet lane: the suites whose cases hold memory, block on ports,
#     pipes and the distribution, or attach and fail, and assert nothing
#     about CPU share.
# In each lane the suites needing neither root nor emulator come first,
# then, once the roots are there, those needing a root, last (CPU lane)
# the lock-counting suites once the emulators are there. Each step's log
# is shown whole when it ends, with the per-suite table that the CT hook
# (test/beamdiag_cth.erl) prints; then the steps' times, every skip, and
# what failed (the tail of a long log is what a CI run shows). A step that
# fails fails the run.
set -uo pipefail
cd "$(dirname "$0")/.."
# The whole run in a session of its own, at nice 0, whatever the caller's:
# the kernel's autogroups (sched_autogroup_enabled) weigh each session as
# one group, and each lab node is in one of its own (erl_child_setup calls
# setsid). Started from a shell in the root group (no session of its own)
# or under a negative nice, every thread of the Common Test VMs would weigh
# as much as a whole lab node, and the nodes whose CPU the cases measure
# would be starved by the cases' own work. An interrupt stops the session.
if [ "${BEAMDIAG_TEST_SESSION:-}" != run ]; then
    export BEAMDIAG_TEST_SESSION=run
    [ "$(nice)" -ge 0 ] || renice -n 0 -p $$ >/dev/null
    setsid bash "$0" "$@" &
    child=$!
    trap 'kill -TERM -- "-$child" 2>/dev/null' INT TERM HUP
    while :; do
        wait "$child"; s=$?
        kill -0 "$child" 2>/dev/null || exit "$s"
    done
fi
REBAR=${REBAR:-rebar3}
logs=_build/test/logs
mkdir -p "$logs"
# The CT hook counts the skips of a starved host, and of a pathology the
# host did not produce, across every CT run of this `make test'.
export BEAMDIAG_STARVED_FILE="$PWD/$logs/starved.txt"
: > "$BEAMDIAG_STARVED_FILE"
rm -f "$logs/case_times.txt" "$logs/steps.txt" "$logs"/step-*.log "$logs"/*.done
: > "$logs/steps.txt"

# The lanes. A suite that is in neither list runs first in the quiet lane
# (a new suite is quiet until it is said to be otherwise).
cpu_early="beamdiag_lab_SUITE beamdiag_fuzz_SUITE beamdiag_prove_SUITE"
cpu_roots="beamdiag_otp_SUITE beamdiag_sick_SUITE beamdiag_profile_SUITE beamdiag_elixir_SUITE
           beamdiag_erts_SUITE"
cpu_lcnt="beamdiag_locks_SUITE beamdiag_procs_SUITE"
quiet_roots="beamdiag_sickagent_SUITE beamdiag_safety_SUITE beamdiag_sickwait_SUITE
             beamdiag_attach_SUITE"
quiet_early=""
for f in test/*_SUITE.erl; do
    s=$(basename "$f" .erl)
    case " $(echo $cpu_early $cpu_roots $cpu_lcnt $quiet_roots) " in
        *" $s "*) ;;
        *) quiet_early="$quiet_early $s" ;;
    esac
done

t0=$(date +%s)
now() { echo $(($(date +%s) - t0)); }
# The host over the run, for the summary: its CPU counters (/proc/stat's
# first line: busy, idle with I/O wait, steal, in clock ticks) and where
# this run was scheduled.
host_ticks() { awk '/^cpu /{ print $2+$3+$4+$7+$8, $5+$6, $9 }' /proc/stat; }
read -r busy0 idle0 steal0 <<< "$(host_ticks)"
group0="$(cat /proc/self/autogroup 2>/dev/null || echo 'no autogroup')"

# The preparations (scripts/test-prepare.sh) at the lowest priority, the
# builds each in a session of its own (setsid), the roots in this one. Each
# writes its exit status to $logs/NAME.done when it ends; a lane waits for
# that file (await).
roots_log="$logs/prepare-roots.log"
lcnt_log="$logs/prepare-lcnt.log"
dialyzer_log="$logs/prepare-dialyzer.log"
: > "$logs/prepared.txt"
prepare() {
    local name=$1 session=$2
    (
        $session nice -n 19 scripts/test-prepare.sh "$name"
        echo $? > "$logs/$name.done"
        echo "$name $(now)" >> "$logs/prepared.txt"
    ) >"$logs/prepare-$name.log" 2>&1 &
}
prepare roots ""; prep_roots=$!
prepare lcnt "setsid -w"; prep_lcnt=$!
# Dialyzer's verdict is make check's; its prepared line is not printed.
( setsid -w nice -n 19 scripts/test-prepare.sh dialyzer ) >"$dialyzer_log" 2>&1 &
prep_dialyzer=$!

# Shows a finished step's log whole, one step at a time on the screen.
show() {
    flock "$logs/.screen.lock" cat "$1"
}

# Waits for a preparation; its failure ends the lane with its log.
await() {
    local name=$1 what=$2 log=$3 lane=$4 t
    t=$(now)
    while [ ! -s "$logs/$name.done" ]; do sleep 1; done
    echo "wait-$name $lane $t $(now) 0" >> "$logs/steps.txt"
    if [ "$(cat "$logs/$name.done")" != 0 ]; then
        flock "$logs/.screen.lock" sh -c "echo 'test-run: preparing the $what failed:' >&2; tail -20 '$log' >&2"
        return 1
    fi
}

# One Common Test run of a lane: its suites, its own log folder.
step() {
    local lane=$1 name=$2 t s=0 suites=""
    shift 2
    [ $# -gt 0 ] || return 0
    for x in "$@"; do suites="$suites,test/$x"; done
    mkdir -p "$logs/$name"
    t=$(now)
    $REBAR ct --cover=false --logdir "$logs/$name" --suite="${suites#,}" >"$logs/step-$name.log" 2>&1 || s=1
    echo "$name $lane $t $(now) $s" >> "$logs/steps.txt"
    show "$logs/step-$name.log"
    return $s
}

status=0
# EUnit first, alone: it compiles the test profile its own way, and Common
# Test's compile after it (--compile_only) leaves both lanes nothing to
# compile, so that they never write one build folder at once.
t=$(now)
$REBAR eunit 2>&1 | tee "$logs/step-eunit.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "eunit - $t $(now) $([ $status = 0 ] && echo 0 || echo 1)" >> "$logs/steps.txt"
$REBAR ct --compile_only >"$logs/step-compile.log" 2>&1 || { cat "$logs/step-compile.log"; status=1; }

cpu_lane() {
    local s=0
    step cpu cpu-early $cpu_early || s=1
    await roots "OTP 27 and 29 roots" "$roots_log" cpu || return 1
    step cpu cpu-roots $cpu_roots || s=1
    await lcnt "lock-counting emulators" "$lcnt_log" cpu || return 1
    step cpu cpu-lcnt $cpu_lcnt || s=1
    return $s
}
quiet_lane() {
    local s=0
    step quiet quiet-early $quiet_early || s=1
    await roots "OTP 27 and 29 roots" "$roots_log" quiet || return 1
    step quiet quiet-roots $quiet_roots || s=1
    return $s
}
cpu_lane & lane_a=$!
# The quiet lane a few seconds after, so that the two Common Test runs
# never start in the same second.
sleep 3
quiet_lane & lane_b=$!
wait "$lane_a" || status=1
wait "$lane_b" || status=1
# The PLT is built long before this; only its verdict is left to make check.
wait "$prep_dialyzer" || true
wait "$prep_roots" "$prep_lcnt" 2>/dev/null || true

echo
echo "make test steps (s from the start; lanes run at once):"
printf '  %-20s %-6s %6s %6s %6s\n' step lane start end wall
while read -r name lane a b s; do
    printf '  %-20s %-6s %6s %6s %6s%s\n' "$name" "$lane" "$a" "$b" "$((b - a))" \
        "$([ "$s" = 0 ] || echo '  FAILED')"
done < "$logs/steps.txt"
sed 's/^\([a-z]*\) \(.*\)/  the \1 were ready at \2 s/' "$logs/prepared.txt"
echo "  total                                          $(now)"
read -r busy1 idle1 steal1 <<< "$(host_ticks)"
awk -v b=$((busy1 - busy0)) -v i=$((idle1 - idle0)) -v st=$((steal1 - steal0)) \
    -v n="$(nproc)" -v g="$group0" -v ni="$(nice)" 'BEGIN {
    a = b + i + st; if (a == 0) a = 1
    printf "  host over the run: %d CPUs %.2f busy, steal %.3f of CPU time (%.1f s); run in %s, nice %s\n",
        n, b / a, st / a, st / 100, g, ni }'
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
    echo "make test FAILED; what failed, by step (logs: $logs/step-NAME.log, $logs/NAME/ct_run.*):"
    for f in "$logs"/step-*.log; do
        n=$(basename "$f" .log); n=${n#step-}
        # EUnit's failing tests and tally, Common Test's failing cases and
        # its tallies, and rebar3's own errors (a compile, a run that
        # stopped: the step's later suites did not run).
        sed 's/\x1b\[[0-9;]*m//g' "$f" |
            grep -E '^ *(Failed: [1-9]|Failed [1-9][0-9]* tests|.*\*failed\*|%%% .* ==> .*: FAILED|%%% .* ==> .*(error|badmatch|timetrap|exit)|[0-9]+\) [a-z_0-9]+:[a-z_0-9]+/[0-9]+$|[0-9]+ tests, [1-9][0-9]* failures|[0-9]+ tests, [0-9]+ failures, [1-9][0-9]* cancelled|.*\{(setup|cleanup)_failed,|.*\[\{beamdiag_[a-z_0-9]+_tests,[a-z_0-9]+,[0-9]+,|===> .*Error)' |
            head -40 | sed "s/^/  $n: /"
        # Where each failed case failed: the assertion's line and expression
        # (or the reason's first line), so that the run's last lines say why.
        sed 's/\x1b\[[0-9;]*m//g' "$f" | awk -v step="$n" '
            /==> .*: FAILED$/ { if (c != "") print_it(); c = $0; sub(/^%%% /, "", c); sub(/: FAILED$/, "", c); k = 0; l = ""; e = ""; r = ""; next }
            c != "" && k < 25 {
                k++
                if (l == "" && match($0, /\{line,[0-9]+\}/)) l = substr($0, RSTART + 6, RLENGTH - 7)
                if (e == "" && match($0, /\{expression,".*"\}/)) e = substr($0, RSTART + 12, RLENGTH - 13)
                # The reason: its first three lines, joined, whatever their form.
                if (k <= 3) { t = $0; sub(/^%%% [^ ]* ==> ?/, "", t); gsub(/[ \t]+/, " ", t); r = substr(r t, 1, 500) }
                if (k == 25) print_it()
            }
            function print_it() { printf "  %s: %s failed%s%s\n", step, c, (l != "" ? " at line " l : ""), (e != "" ? ": " e : (r != "" ? ": " r : "")); c = "" }
            END { if (c != "") print_it() }'
    done
    # EUnit's failures: each test's assertion and what it got, on one line.
    sed 's/\x1b\[[0-9;]*m//g' "$logs/step-eunit.log" | awk '
        /^  [0-9]+\) [a-z_0-9]+:[a-z_0-9]+\/[0-9]+$/ { if (t != "") print_it(); t = $2; r = ""; k = 0; next }
        t != "" && /^ *(Output:|%% )/ { print_it(); next }
        t != "" && k < 8 { k++; x = $0; gsub(/[ \t]+/, " ", x); r = substr(r x, 1, 400) }
        function print_it() { printf "  eunit: %s failed:%s\n", t, r; t = "" }
        END { if (t != "") print_it() }'
    grep '^[^ ]* broken: ' "$BEAMDIAG_STARVED_FILE" 2>/dev/null | cut -c1-300 | sed 's/^/  never ran: /'
fi
exit $status

#!/bin/sh
# Bounded fuzzing for CI: build the libFuzzer targets (make -C daemon fuzz)
# and run each from the committed seed corpus for FUZZ_TIME seconds
# (default 30), one after the other. Prints executions and executions per
# second; exits non-zero on any crash, sanitizer report, leak or timeout.
#
#   tests/fuzz/run.sh                 both targets
#   FUZZ_TIME=5 tests/fuzz/run.sh proto
#
# New corpus units go to a scratch directory that is deleted afterwards; on
# a failure the log and the failing input are kept in fuzz/out/TARGET/
# (gitignored) and named on stdout. Reproduce with
#   daemon/fuzz_TARGET fuzz/out/TARGET/crash-...
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
time=${FUZZ_TIME:-30}
targets=${*:-session proto}

make -s -C "$root/daemon" fuzz

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work"	# fuzz_session's cache directory goes there too
# What counts as a failure in a fuzzer's log, besides its exit status.
bad='ERROR: (Address|Leak)Sanitizer|runtime error:|assertion failed|deadly signal'
status=0
for t in $targets; do
	d="$work/$t"
	mkdir -p "$d/corpus" "$d/artifacts"
	# Sessions need inputs past the 64 KiB input buffer to reach its
	# compaction and growth (corpus/session/large_frame).
	case $t in
	session) maxlen=131072 ;;
	*) maxlen=4096 ;;
	esac
	rc=0
	UBSAN_OPTIONS=print_stacktrace=1 "$root/daemon/fuzz_$t" \
	    -max_total_time="$time" -max_len=$maxlen -rss_limit_mb=2048 \
	    -detect_leaks=1 -timeout=20 -print_final_stats=1 \
	    -artifact_prefix="$d/artifacts/" \
	    "$d/corpus" "$here/corpus/$t" >"$d/log" 2>&1 || rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$d/log")
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$d/log")
	units=$(ls "$d/corpus" | wc -l)
	seeds=$(ls "$here/corpus/$t" | wc -l)
	if [ "$rc" -ne 0 ] || [ -n "$(ls "$d/artifacts")" ] ||
	    grep -qE "$bad" "$d/log"; then
		out="$root/fuzz/out/$t"
		rm -rf "$out"
		mkdir -p "$out"
		cp "$d/log" "$d"/artifacts/* "$out/" 2>/dev/null || true
		echo "fuzz_$t: FAILED (exit $rc) after ${execs:-?} execs;" \
		    "log and inputs in $out:"
		grep -E "$bad|ERROR|SUMMARY|Test unit written" "$d/log" | head -20
		status=1
	else
		echo "fuzz_$t: ok: $execs execs in ${time} s, $rate execs/s," \
		    "$seeds seeds + $units new units"
	fi
done
exit $status

#!/bin/sh
# Run the daemon's black-box tests against an AddressSanitizer +
# UndefinedBehaviorSanitizer build (make -C daemon sanitize, built with
# clang if there is one: its UBSan checks more than gcc's), and fail if the
# tests fail OR any daemon process wrote a sanitizer report. The tests talk
# to the daemon over TCP and would not notice a report on its stderr, so
# reports go to files (log_path) in a scratch directory checked afterwards.
#
#   tests/fuzz/sanitize_run.sh                       the default test files
#   tests/fuzz/sanitize_run.sh tests/test_daemon.py -k crash
#
# Signals. ASan installs a SIGSEGV/SIGBUS/SIGFPE handler at start-up
# (handle_segv=1): a fault in the daemon proper gets a full report. A
# session process (process isolation) then installs its own handler, which
# turns a crashing client kernel into Rerror ECRASH; ASan lets it
# (allow_user_segv_handler=1, the default, made explicit here), so the
# deliberate crash in test_crashing_kernel_ends_only_its_session is no
# report. With allow_user_segv_handler=0 ASan would keep its handler and
# report that crash as a daemon bug; with handle_segv=0 there would be no
# report for a real fault in the daemon. A fault in a session process
# outside a kernel kills it by the signal (session.c re-raises it), which
# the parent logs as "ended by signal".
#
# Leaks: LeakSanitizer runs when the daemon exits after SIGTERM (the tests
# stop it that way). Session processes end with _exit() and are not
# leak-checked here; the thread-isolation runs and tests/leakcheck.py are.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cc=${SANITIZE_CC:-$(command -v clang || echo cc)}

# -B: the objects in daemon/asan may be from another compiler.
make -B -s -C "$root/daemon" sanitize CC="$cc"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
export METAL_RUNNER_BIN="$root/daemon/metal_runner_asan"
export ASAN_OPTIONS="log_path=$logs/asan:handle_segv=1"\
":allow_user_segv_handler=1:detect_leaks=1:halt_on_error=1:exitcode=23"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"

cd "$root"
rc=0
if [ $# -eq 0 ]; then
	"${TEST_PYTHON:-python3}" -m pytest -q -m "not slow" tests/test_daemon.py \
	    tests/test_hardening.py tests/test_auth.py || rc=$?
else
	"${TEST_PYTHON:-python3}" -m pytest -q "$@" || rc=$?
fi

reports=$(ls "$logs")
if [ -n "$reports" ]; then
	echo "sanitizer reports from the daemon:"
	for f in "$logs"/*; do
		echo "---- $(basename "$f")"
		cat "$f"
	done
	exit 1
fi
[ "$rc" -eq 0 ] || { echo "tests failed (exit $rc)"; exit "$rc"; }
echo "sanitizers: no reports (binary $METAL_RUNNER_BIN, $cc)"

#!/bin/sh
# test.sh: the whole test suite, exactly as CI runs it (.ci/run calls this).
#   1. set up (./setup.sh test: also valgrind on Debian)
#   2. a bounded libFuzzer run over the frame parser and the session, 30 s each
#   3. the suite against an AddressSanitizer + UBSan build of the daemon
#   4. the full pytest suite, slow tests included (valgrind leak check of
#      1,000 sessions per isolation mode)
# On Linux every step is required. macOS has no valgrind and Apple's clang no
# libFuzzer: there steps 2 and the leak check are skipped and say so.
set -eu
cd "$(dirname "$0")"
SETUP_FROM_TEST=1 ./setup.sh test
PY=.venv/bin/python

if clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null <<'C'
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }
C
then
	echo "== fuzzing (30 s per target)"
	FUZZ_TIME=${FUZZ_TIME:-30} tests/fuzz/run.sh
elif [ "$(uname -s)" = Linux ]; then
	echo "test.sh: clang cannot build libFuzzer targets" >&2
	exit 1
else
	echo "== fuzzing: skipped, this clang has no libFuzzer"
fi

echo "== the suite against an ASan + UBSan daemon"
# Left out here (they run in the full suite below): files that never start
# the CPU daemon (checks of runner.m's sources, the Metal emulator's own
# compiler, setup.sh and the README's text) and the LLM server's access
# guard, Python in front of daemon paths the rest covers. They took 12 of
# this phase's 45 minutes on a loaded machine.
TEST_PYTHON=$PY tests/fuzz/sanitize_run.sh tests -m "not slow and not metal" \
	--ignore=tests/test_metal_emulator_msl.py --ignore=tests/test_metal_api_metalcpp.py \
	--ignore=tests/test_metal_api_pyobjc.py --ignore=tests/test_metal_typecheck.py \
	--ignore=tests/test_setup.py --ignore=tests/test_readme.py --ignore=tests/test_llm_access.py

echo "== the full suite"
exec "$PY" -m pytest -q

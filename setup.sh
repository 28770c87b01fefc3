#!/bin/sh
# setup.sh [test]: everything a fresh Debian or macOS machine needs, then the
# daemon. Idempotent: a second run only checks. Installs clang and make
# (Debian: apt-get; macOS: the Xcode command line tools must be present),
# with "test" also valgrind, clang-16 and gcc's libobjc (Debian: the Metal
# emulator, a test harness), systemd-analyze, Avahi (daemon and client
# library) and dbus-daemon, the arm64 and riscv64 cross compilers with their
# C libraries and qemu-user (Debian: cross builds, and runners of those CPUs
# under emulation, a test harness), creates .venv with the client, tinygrad and
# numpy (with "test" also the test dependencies, among them zig, PyPI's
# ziglang: the macOS build checked on Linux), and builds daemon/metal_runner
# (and, for tests on Linux, daemon/metal_runner_emu).
set -eu
cd "$(dirname "$0")"

need() { command -v "$1" >/dev/null 2>&1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

case "$(uname -s)" in
Linux)
	missing=""
	need clang || missing="$missing clang"
	need make || missing="$missing make"
	need cc || missing="$missing gcc"
	need python3 || missing="$missing python3"
	python3 -c 'import venv, ensurepip' 2>/dev/null || missing="$missing python3-venv"
	if [ "${1:-}" = test ]; then
		need valgrind || missing="$missing valgrind"
		need cmake || missing="$missing cmake"
		# The Metal emulator (tests/metal_emulator): clang-16 compiles
		# kernels (_Float16), gcc's libobjc runs runner.m.
		need clang++-16 || missing="$missing clang-16"
		objc=$(cc -print-file-name=libobjc.so 2>/dev/null || true)
		[ -f "$objc" ] || missing="$missing libobjc-$(cc -dumpversion | cut -d. -f1)-dev"
		# Service files and discovery: systemd-analyze verifies the unit;
		# the runner's --advertise is built with Avahi's client library
		# and tested against a private avahi-daemon on a private D-Bus.
		need systemd-analyze || missing="$missing systemd"
		need pkg-config || missing="$missing pkg-config"
		pkg-config --exists avahi-client 2>/dev/null || missing="$missing libavahi-client-dev"
		[ -x /usr/sbin/avahi-daemon ] || missing="$missing avahi-daemon"
		need dbus-daemon || missing="$missing dbus-daemon"
		# advertise_dnssd.c (macOS) is compiled against its dns_sd.h
		# (tests/test_discovery.py, tests/test_macos_build.py)
		pkg-config --exists avahi-compat-libdns_sd 2>/dev/null || missing="$missing libavahi-compat-libdnssd-dev"
		# Cross builds (make -C daemon cross) and their runners under
		# qemu-user (tests/test_qemu_runners.py).
		need qemu-aarch64 && need qemu-riscv64 || missing="$missing qemu-user"
		need aarch64-linux-gnu-gcc || missing="$missing gcc-aarch64-linux-gnu"
		need riscv64-linux-gnu-gcc || missing="$missing gcc-riscv64-linux-gnu"
		[ -f /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || missing="$missing libc6-dev-arm64-cross"
		[ -f /usr/riscv64-linux-gnu/lib/ld-linux-riscv64-lp64d.so.1 ] || missing="$missing libc6-dev-riscv64-cross"
	fi
	if [ -n "$missing" ]; then
		if ! need apt-get; then
			echo "setup.sh: please install:$missing" >&2
			exit 1
		fi
		echo "setup.sh: installing$missing"
		as_root apt-get update -qq
		# shellcheck disable=SC2086
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
	fi
	;;
Darwin)
	if ! need clang || ! need make; then
		echo "setup.sh: run 'xcode-select --install' for clang and make, then again" >&2
		exit 1
	fi
	;;
esac

if [ ! -x .venv/bin/python ]; then
	python3 -m venv .venv
fi
# The main job needs the client, tinygrad and numpy (the examples); the tests
# also their tools, among them zig (about 50 MB), so only "test" fetches those.
if [ "${1:-}" = test ]; then
	extra=test mods="client, tinygrad, numpy, pytest, cffi, zeroconf, ziglang, gguf, openai"
else
	extra=examples mods="client, tinygrad, numpy"
fi
if ! .venv/bin/python -c "import $mods" 2>/dev/null || [ ! -x .venv/bin/metal-client ]; then
	# pip before 21.3 cannot install -e from pyproject.toml alone; a newer
	# one is left as it is (upgrading it cost seconds at every fresh setup)
	.venv/bin/python -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (21, 3))' ||
		.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
	# --no-compile: tinygrad's 40 MB of sources are byte-compiled as
	# imported, not all at install (that halved the install here)
	.venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -e ".[$extra]"
fi
make -s -j"$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)" -C daemon
if [ "${1:-}" = test ] && [ "$(uname -s)" = Linux ]; then
	make -s -C daemon emu	# daemon/metal_runner_emu: the Metal emulator
	make -s -C daemon metal_runner_avahi	# --advertise tests (tests/test_discovery.py)
	make -s -C daemon cross	# daemon/build/{arm64,riscv64}/metal_runner
fi

# What to run next (test.sh, which has its own next step, says SETUP_FROM_TEST=1).
if [ "${1:-}" = test ]; then
	[ -n "${SETUP_FROM_TEST:-}" ] || echo "setup.sh: done. Next: ./test.sh (the whole suite, as CI runs it)"
else
	echo "setup.sh: done. Next: .venv/bin/python examples/train_mlp.py (trains an MLP through a runner it starts)"
	echo "  or: daemon/metal_runner --help (a runner for other machines: see docs/metal.md)"
fi

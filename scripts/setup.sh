#!/usr/bin/env bash
# Installs what bmoe-ci needs on a fresh Debian machine, idempotently: the farm's OpenSSH server, the
# arm64 emulator, the Android Debug Bridge client and a headless browser (for the report tests) from
# Debian, the project and its Python dependencies from PyPI at the versions of the lock (constraints.txt);
# and it starts the engine's builds for the local farm's two targets in the background (see there).
#   scripts/setup.sh          everything (what `make test` needs)
#   scripts/setup.sh gates    all but the browser, which only the report tests use (what `make gates` needs)
set -euo pipefail
cd "$(dirname "$0")/.."
purpose="${1:-all}"
case "$purpose" in all|gates) ;; *) echo "usage: scripts/setup.sh [gates]" >&2; exit 2 ;; esac

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_install() {  # Debian packages, quietly; `apt-get update` once per run of this script
    echo "setup: installing $* (Debian)" >&2
    if [ -z "${apt_updated:-}" ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# the toolchain first (rarely missing): pip may compile, and make runs everything
need_apt=()
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
[ ${#need_apt[@]} -eq 0 ] || apt_install "${need_apt[@]}"

stamp=.cache/bmoe-ci/setup.stamp
# the install is redone when the declared ranges or the lock change (setup.py decides what a wheel carries)
want="$(cat pyproject.toml constraints.txt setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! python3 -c 'import bmoe_ci' 2>/dev/null; then
    echo "setup: installing bmoe-ci and its locked dependencies (PyPI)" >&2
    python3 -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
    mkdir -p "$(dirname "$stamp")"
    echo "$want" > "$stamp"
fi

# The engine's first build for a target also compiles its libc: about a minute of one core per target
# on a new machine (docs/benchmarks.md). Both targets start now, in the background, so that they overlap
# the Debian installs below; the gate run and the tests then find them built, or wait for them through
# the builder's lock instead of compiling them again. Nothing here waits for them: a build that fails is
# compiled again, and its error reported, by whoever needs it (the log is .cache/bmoe-ci/prebuild.log).
# (A target already built costs its `bmoe-ci build` a second.) BMOE_PREBUILD=0 leaves them out.
if [ "${BMOE_PREBUILD:-1}" = 1 ]; then
    mkdir -p .cache/bmoe-ci
    (python3 -m bmoe_ci.cli build --target x86_64-linux-musl & python3 -m bmoe_ci.cli build --target aarch64-linux-musl &
     wait) </dev/null >.cache/bmoe-ci/prebuild.log 2>&1 &
fi

# the farm's OpenSSH server, the arm64 emulator, the Android Debug Bridge and a headless browser
need_apt=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need_apt+=(openssh-server)
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v adb >/dev/null 2>&1 || need_apt+=(adb)  # the farm's Android devices
[ "$purpose" = gates ] || command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the tests render the nightly report in it
[ ${#need_apt[@]} -eq 0 ] || apt_install "${need_apt[@]}"

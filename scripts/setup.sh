#!/usr/bin/env bash
# Installs what bmoe-ci needs on a fresh Debian machine, idempotently: the farm's OpenSSH server, the
# arm64 emulator, the Android Debug Bridge client and a headless browser (for the report tests) from
# Debian, the project and its Python dependencies from PyPI at the versions of the lock (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need_apt+=(openssh-server)
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v adb >/dev/null 2>&1 || need_apt+=(adb)  # the farm's Android devices
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # the tests render the nightly report in it
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} (Debian)" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp=.cache/bmoe-ci/setup.stamp
# the install is redone when the declared ranges or the lock change (setup.py decides what a wheel carries)
want="$(cat pyproject.toml constraints.txt setup.py | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! python3 -c 'import bmoe_ci' 2>/dev/null; then
    echo "setup: installing bmoe-ci and its locked dependencies (PyPI)" >&2
    python3 -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
    mkdir -p "$(dirname "$stamp")"
    echo "$want" > "$stamp"
fi

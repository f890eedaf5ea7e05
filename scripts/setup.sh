#!/usr/bin/env bash
# Installs what bmoe-ci needs on a fresh Debian machine, idempotently: the farm's OpenSSH server, the
# arm64 emulator and a headless browser (for the report tests) from Debian, the project and its pinned
# Python dependencies from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need_apt+=(openssh-server)
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
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
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! python3 -c 'import bmoe_ci' 2>/dev/null; then
    echo "setup: installing bmoe-ci and its pinned dependencies (PyPI)" >&2
    python3 -m pip install -q --disable-pip-version-check -e '.[dev]'
    mkdir -p "$(dirname "$stamp")"
    echo "$want" > "$stamp"
fi

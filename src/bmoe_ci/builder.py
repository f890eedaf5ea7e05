"""The builder: compiles engine/ with zig's hermetic C toolchain for each target, cached by build id.

The build id is a content hash of everything that decides the binary's bytes: every engine source
file, the compiler flags, the fault defines (for fault-injected builds), the zig version and the
target. It is compiled into the binary (`bmoe --version` prints it), so a device can prove which
build it runs, and it names the cache entry, so an unchanged tree compiles nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from bmoe_ci.paths import Places

# Targets the builder knows. Linux targets are static musl binaries that run on the farm; the macOS
# ones are compile-and-link checks for desktops (they cannot run here).
TARGETS: dict[str, bool] = {
    "x86_64-linux-musl": True,
    "aarch64-linux-musl": True,
    "x86_64-macos": False,
    "aarch64-macos": False,
}

# Determinism (docs/design.md, determinism): no fast-math and no FP contraction, so the same sources give the same
# output bytes on x86_64 and aarch64. UBSan is off in release builds (zig enables it in debug modes).
BASE_CFLAGS: tuple[str, ...] = (
    "-std=c11",
    "-D_GNU_SOURCE",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-sanitize=all",
)


class BuildError(RuntimeError):
    """The engine could not be built; the message carries the compiler's full output."""


@dataclass(frozen=True)
class Build:
    target: str
    build_id: str
    path: Path
    compiled: bool  # False when the binary came from the cache
    runnable: bool  # False for compile-only targets
    defines: tuple[str, ...] = field(default=())


#: Spellings of the same architecture; the farm and the targets always use the ``uname -m`` spelling.
ARCH_ALIASES = {"arm64": "aarch64", "armv8": "aarch64", "amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64"}

#: The architectures the engine has a target for (a farm device may have no other).
KNOWN_ARCHES: tuple[str, ...] = tuple(sorted({t.split("-", 1)[0] for t in TARGETS}))


def normalize_arch(arch: str) -> str:
    """``arm64`` -> ``aarch64``, ``amd64`` -> ``x86_64``; anything else lower-cased as is."""
    a = arch.strip().lower()
    return ARCH_ALIASES.get(a, a)


class Platform(Protocol):
    """What decides a device's target: a farm device, or a gate run's device context."""

    @property
    def arch(self) -> str: ...

    @property
    def os(self) -> str: ...


def target_for(device: Platform) -> str:
    """The target that runs on ``device``: ``<arch>-macos`` for a Mac, else ``<arch>-linux-musl``."""
    if device.os.lower() in ("macos", "darwin", "osx"):
        return f"{device.arch}-macos"
    return f"{device.arch}-linux-musl"


def host_target() -> str:
    return f"{normalize_arch(platform.machine())}-linux-musl"


def resolve_target(name: str) -> str:
    target = host_target() if name == "host" else name
    if target not in TARGETS:
        known = ", ".join(["host", *TARGETS])
        raise BuildError(f"unknown target {name!r}; known targets: {known}")
    return target


def zig_command() -> list[str]:
    return [sys.executable, "-m", "ziglang"]


def zig_version() -> str:
    try:
        out = subprocess.run([*zig_command(), "version"], capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise BuildError(
            "the zig toolchain is missing or broken: install it with `pip install 'ziglang>=0.17.1,<0.18'` "
            f"(in a checkout, `pip install -c constraints.txt ziglang` gives the version CI runs on) ({exc})"
        ) from exc
    return out.stdout.strip()


def engine_sources(engine_dir: Path) -> list[Path]:
    src = engine_dir / "src"
    return sorted(p for p in src.iterdir() if p.suffix in (".c", ".h"))


def compute_build_id(target: str, defines: Sequence[str], engine_dir: Path, zig: str) -> str:
    digest = hashlib.sha256()
    for path in engine_sources(engine_dir):
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for part in (*BASE_CFLAGS, "|", *sorted(defines), "|", zig, "|", target):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


#: Seconds between the "still building" lines of a compile; and the most a compile may take.
BUILD_HEARTBEAT_S = 20.0
BUILD_TIMEOUT_S = 900.0


def _compile(
    cmd: Sequence[str], triple: str, say: Callable[[str], None], *, heartbeat: float, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run the compiler, saying every ``heartbeat`` seconds that it still runs (TimeoutExpired past
    ``timeout``, the compiler killed)."""
    started = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        out: list[str] = []

        def drain() -> None:  # the compiler's output, read while it runs (a full pipe would stall it)
            o, e = proc.communicate()
            out.extend((o, e))

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        while True:
            reader.join(timeout=min(heartbeat, max(0.0, started + timeout - time.monotonic())))
            if not reader.is_alive():
                break
            if time.monotonic() - started >= timeout:
                proc.kill()
                reader.join()
                raise subprocess.TimeoutExpired(cmd, timeout)
            say(f"still building {triple}: {time.monotonic() - started:.0f} s")
        return subprocess.CompletedProcess(cmd, proc.returncode, out[0] if out else "", out[1] if out else "")


def build(
    target: str = "host",
    *,
    defines: Sequence[str] = (),
    rebuild: bool = False,
    progress: Callable[[str], None] | None = None,
    engine_dir: Path | None = None,
    cache: Path | None = None,
    places: Places | None = None,
    heartbeat: float = BUILD_HEARTBEAT_S,
) -> Build:
    """Builds (or takes from the cache) the engine for `target`. While compiling, `progress` hears
    ``still building TRIPLE: N s`` every `heartbeat` seconds (a cold build, libc included, takes minutes).

    `defines` are extra preprocessor definitions (`BMOE_FAULT_...=1`) for fault-injected builds;
    they are part of the build id, so a faulty binary can never be mistaken for the real one.
    `engine_dir` and `cache` default to the source tree's engine/ and the bmoe-ci cache of `places`.
    """
    places = places or Places()
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    triple = resolve_target(target)
    engine_dir = engine_dir or places.source_tree() / "engine"
    zig = zig_version()
    build_id = compute_build_id(triple, defines, engine_dir, zig)
    out_dir = (cache or places.cache_dir()) / "engine" / triple / build_id
    binary = out_dir / "bmoe"
    runnable = TARGETS[triple]
    if binary.is_file() and not rebuild:
        return Build(triple, build_id, binary, compiled=False, runnable=runnable, defines=tuple(defines))

    out_dir.mkdir(parents=True, exist_ok=True)
    # one compiler per build id across processes (two gate runs, xdist workers, `mutants --jobs`): the
    # second waits for the first and takes its binary instead of compiling the same bytes again
    with open(out_dir / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file() and not rebuild:
            return Build(triple, build_id, binary, compiled=False, runnable=runnable, defines=tuple(defines))
        return _compile_into(triple, build_id, defines, engine_dir, binary, say, heartbeat, runnable)


def _compile_into(
    triple: str,
    build_id: str,
    defines: Sequence[str],
    engine_dir: Path,
    binary: Path,
    say: Callable[[str], None],
    heartbeat: float,
    runnable: bool,
) -> Build:
    """Compiles the engine into `binary` (written under a temporary name, then renamed into place)."""
    out_dir = binary.parent
    say(f"building bmoe {build_id} for {triple} (the first build of a target also builds its libc)")
    sources = [str(p) for p in engine_sources(engine_dir) if p.suffix == ".c"]
    flags = [
        *BASE_CFLAGS,
        f'-DBMOE_BUILD_ID="{build_id}"',
        f'-DBMOE_TARGET="{triple}"',
        *(f"-D{d}" for d in defines),
        f"-I{engine_dir / 'src'}",
    ]
    link = ["-static"] if triple.endswith("-linux-musl") else []
    with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".bmoe-", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    cmd = [*zig_command(), "cc", "-target", triple, *link, *flags, *sources, "-o", str(tmp_path), "-lm"]
    try:
        proc = _compile(cmd, triple, say, heartbeat=heartbeat, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        tmp_path.unlink(missing_ok=True)
        raise BuildError(f"building for {triple} timed out after {exc.timeout:.0f} s") from exc
    if proc.returncode != 0:
        tmp_path.unlink(missing_ok=True)
        raise BuildError(
            f"compiling the engine for {triple} failed (exit {proc.returncode}):\n"
            f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )
    os.chmod(tmp_path, 0o755)
    os.replace(tmp_path, binary)  # atomic: a concurrent builder never sees a half-written binary
    return Build(triple, build_id, binary, compiled=True, runnable=runnable, defines=tuple(defines))

"""The kernel path never changes a byte (docs/model-math.md, kernels): every path this machine has, and
the scalar one, give the same tokens and logits on every default fixture; on aarch64 (the static arm64
build under qemu-aarch64-static, as the emulated devices run it) the NEON and sdot paths give the x86_64
bytes; and the kernels' C unit test passes on aarch64 too (it checks NEON and sdot against scalar on
random data and edge cases)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bmoe_ci.builder import build

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FIXTURES = ["qwen3moe", "qwen3moe-split4", "gemma4", "wide", "qwen3moe-q8_0", "qwen3moe-q4k", "qwen3moe-nonorm"]
#: each further weight type's fixture (Q4_0 / Q5_0 / IQ4_NL / MXFP4: integer sums against Q8_0 blocks; Q4_1 /
#: Q5_1 against Q8_1 blocks; Q2_K / Q3_K / IQ4_XS against Q8_K; BF16: converted, then the F32 lanes). Q5_K
#: and Q6_K are left to qwen3moe-q4k (its output is Q6_K) and to the aarch64 kernel unit tests below, which
#: hold every type's NEON paths to scalar bit for bit.
TYPE_FIXTURES = [
    "qwen3moe-q4_0",
    "qwen3moe-q5_0",
    "qwen3moe-q4_1",
    "qwen3moe-q5_1",
    "qwen3moe-iq4nl",
    "qwen3moe-mxfp4",
    "qwen3moe-q2k",
    "qwen3moe-q3k",
    "qwen3moe-iq4xs",
    "qwen3moe-bf16",
]
ARM_PATHS = ["neon", "neon-dot"]
PROMPT = "Kernels, any path."


def run(cmd: list[str], model: Path, kernels: str, logits: Path) -> tuple[dict, bytes]:
    env = {**os.environ, "BMOE_KERNELS": kernels}
    proc = subprocess.run(
        [*cmd, "run", "-m", str(model), "--mmap", "-p", PROMPT, "-n", "12", "--json", "--logits-out", str(logits)],
        capture_output=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    data = json.loads(proc.stdout)
    assert data["kernels"] == kernels
    return data, logits.read_bytes()


def same(a: tuple[dict, bytes], b: tuple[dict, bytes]) -> bool:
    return a[0]["tokens"] == b[0]["tokens"] and a[0]["text_hex"] == b[0]["text_hex"] and a[1] == b[1]


def host_paths(engine: Path, model: Path) -> list[str]:
    info = json.loads(subprocess.run([str(engine), "info", "-m", str(model)], capture_output=True, check=True).stdout)
    return list(info["kernels_available"])


@pytest.fixture(scope="module")
def arm_cmd() -> list[str]:
    """How to run the aarch64 build here: directly on an aarch64 host, else under qemu."""
    if platform.machine() in ("aarch64", "arm64"):
        prefix: list[str] = []
    elif shutil.which("qemu-aarch64-static"):
        prefix = ["qemu-aarch64-static"]
    else:
        pytest.skip("no aarch64 CPU and no qemu-aarch64-static: the NEON paths cannot run here")
    return [*prefix, str(build("aarch64-linux-musl", progress=lambda m: print(m, file=sys.stderr)).path)]


@pytest.fixture(scope="module")
def models(fixture_dir: Path) -> dict[str, Path]:
    """The default fixtures and the further types' ones."""
    from bmoe_ci.models import generate

    return {f.name: f.path for f in generate(fixture_dir, names=DEFAULT_FIXTURES + TYPE_FIXTURES)}


@pytest.mark.parametrize("name", DEFAULT_FIXTURES + TYPE_FIXTURES)
def test_every_path_gives_the_same_bytes(
    engine_bin: Path, arm_cmd: list[str], models: dict[str, Path], name: str, tmp_path: Path
) -> None:
    model = models[name]
    paths = host_paths(engine_bin, model)
    assert "scalar" in paths
    base = run([str(engine_bin)], model, "scalar", tmp_path / "scalar.f32")
    assert len(base[0]["tokens"]) == 12
    for path in paths:
        got = run([str(engine_bin)], model, path, tmp_path / f"{path}.f32")
        assert same(got, base), f"{name}: the {path} path differs from the scalar path"
    for path in ["scalar", *ARM_PATHS]:
        got = run(arm_cmd, model, path, tmp_path / f"arm-{path}.f32")
        assert same(got, base), f"{name}: aarch64 {path} differs from x86_64 scalar"


def test_unavailable_or_unknown_path_is_one_clear_error(engine_bin: Path, fixtures: dict[str, Path]) -> None:
    model = fixtures["qwen3moe"]
    have = host_paths(engine_bin, model)
    missing = next((p for p in ["avx2", "avx512-vnni", "neon", "neon-dot"] if p not in have), None)
    cases = [("fast", "unknown kernel path 'fast'")]
    if missing:
        cases.append((missing, f"the {missing} kernels are not available"))
    for value, message in cases:
        proc = subprocess.run(
            [str(engine_bin), "run", "-m", str(model), "-p", "x", "-n", "1"],
            capture_output=True,
            text=True,
            env={**os.environ, "BMOE_KERNELS": value},
        )
        assert proc.returncode == 2
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_kernel_unit_tests_on_aarch64(arm_cmd: list[str], tmp_path: Path) -> None:
    """engine/tests/test_kernels.c and test_kquants.c built for aarch64 with the builder's compiler: NEON
    and sdot against the scalar path, bit for bit, on random data, zeros, subnormals, -128 weights and
    every block type's extremes. The engine sources are compiled once and linked into both."""
    src = REPO / "engine" / "src"
    cc = [
        sys.executable,
        "-m",
        "ziglang",
        "cc",
        "-target",
        "aarch64-linux-musl",
        "-static",
        "-std=c11",
        "-D_GNU_SOURCE",
        "-O1",
        "-ffp-contract=off",
        "-fno-fast-math",
        f"-I{src}",
        f"-I{REPO / 'engine' / 'tests'}",
    ]
    objs = tmp_path / "obj"
    objs.mkdir()
    sources = [str(p) for p in sorted(src.glob("*.c")) if p.name != "main.c"]
    subprocess.run([*cc, "-c", *sources], check=True, capture_output=True, timeout=900, cwd=objs)
    for name in ("test_kernels", "test_kquants"):
        out = tmp_path / name
        test = REPO / "engine" / "tests" / f"{name}.c"
        subprocess.run(
            [*cc, *sorted(str(o) for o in objs.glob("*.o")), str(test), "-o", str(out), "-lm"],
            check=True,
            capture_output=True,
            timeout=900,
        )
        proc = subprocess.run([*arm_cmd[:-1], str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "path neon-dot" in proc.stdout and "path neon\n" in proc.stdout, proc.stdout
        assert f"{name}: " in proc.stdout and " 0 failed" in proc.stdout, proc.stdout

"""The farm file's ``kernels`` key (a device's pinned kernel path): validated with FILE:LINE errors,
and the local farm's pins (every SIMD path of both architectures runs on some device)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bmoe_ci.farm import FarmConfigError, load_farm_file
from bmoe_ci.standins import localfarm

FARM = """\
version: 1
devices:
  - name: a
    kind: desktop
    arch: x86_64
    transport: local
    workdir: wd/a
    kernels: {a}
  - name: b
    kind: phone
    arch: aarch64
    transport: local
    workdir: wd/b
    exec_prefix: [qemu-aarch64-static]
    kernels: {b}
"""


def load(tmp_path: Path, a: str, b: str):
    path = tmp_path / "farm.yaml"
    path.write_text(textwrap.dedent(FARM.format(a=a, b=b)))
    return load_farm_file(path)


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the cwd: farm.yaml:LINE


@pytest.mark.parametrize("a,b", [("avx2", "neon"), ("avx512-vnni", "neon-dot"), ("scalar", "auto")])
def test_every_engine_path_name_is_a_value(tmp_path: Path, a: str, b: str) -> None:
    farm = load(tmp_path, a, b)
    assert (farm.devices["a"].kernels, farm.devices["b"].kernels) == (a, b)


def test_kernels_defaults_to_auto(tmp_path: Path) -> None:
    path = tmp_path / "farm.yaml"
    path.write_text(FARM.format(a="auto", b="auto").replace("    kernels: auto\n", ""))
    assert [d.kernels for d in load_farm_file(path).devices.values()] == ["auto", "auto"]


def test_bad_kernel_paths_name_the_file_line_and_key(tmp_path: Path) -> None:
    with pytest.raises(FarmConfigError) as ei:
        load(tmp_path, "avx512", "[neon]")
    got = [str(i) for i in ei.value.issues]
    assert len(got) == 2, got
    assert got[0].startswith("farm.yaml:8: devices[0].kernels: Input should be 'auto', 'scalar', 'avx2',"), got
    assert "'neon-dot'" in got[0]
    assert got[1].startswith("farm.yaml:15: devices[1].kernels: Input should be 'auto'"), got


def test_the_local_farm_pins_the_path_below_the_cpus_own() -> None:
    vnni = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    assert localfarm.pinned_kernels("x86_64", True, vnni) == ("avx2", "neon")  # qemu's CPU has sdot
    assert localfarm.pinned_kernels("x86_64", True, {"avx2", "fma"}) == ("auto", "neon")  # auto is avx2
    assert localfarm.pinned_kernels("aarch64", False, {"asimd", "asimddp"}) == ("auto", "neon")
    assert localfarm.pinned_kernels("aarch64", False, {"asimd"}) == ("auto", "auto")  # auto is neon


def test_cpu_flags_reads_x86_flags_and_arm_features(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp\n")
    assert localfarm.cpu_flags(x86) == {"fpu", "avx2", "avx512_vnni"}
    assert localfarm.cpu_flags(arm) == {"fp", "asimd", "asimddp"}
    assert localfarm.cpu_flags(tmp_path / "none") == set()


def test_the_template_pins_both_ssh_devices() -> None:
    text = localfarm.template_path().read_text()
    assert 'kernels: "${SSH_HOST_KERNELS}"' in text and 'kernels: "${SSH_ARM64_KERNELS}"' in text
    assert text.count("kernels:") == 2  # host, phone-emu and the adb device run the engine's own choice

"""Everything pulled from a device is verified, as pushes are: its size and sha256 computed on the device,
checked on the controller, read once more when they do not match, and an infrastructure error naming the
file when it still does not (never a short file handed to a gate).

A read cut short on the link used to reach the gates as a malformed route trace (G8b, REPLAY: "N fields,
expected 14"). (The nightly's short trace, read while the file on the device was whole, was another engine
rewriting it: see tests/test_farm_breaker.py; no check of what was read can see that, killing it can.)"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import time
from pathlib import Path

import pytest
from adb_link import adb_link, needs_adb

from bmoe_ci.farm import DeviceSession, InfraError, load_farm_file
from bmoe_ci.farm.pull import _READ as READ_SCRIPT
from bmoe_ci.farm.pull import pull, read_files
from bmoe_ci.farm.transports.local import LocalTransport

ARCH = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())


def _device(tmp_path: Path, extra: str = ""):
    farm = tmp_path / "farm.yaml"
    farm.write_text(
        f"version: 1\ndevices:\n  - name: d\n    kind: desktop\n    arch: {ARCH}\n    transport: local\n"
        f"    workdir: {tmp_path / 'work'}\n{extra}"
    )
    return load_farm_file(farm).device("d")


class CuttingTransport(LocalTransport):
    """A local device whose link cuts the first ``cuts`` outputs (or downloads) in half."""

    def __init__(self, device, cuts: int = 1):
        super().__init__(device)
        self.cuts = cuts

    def _run(self, argv, timeout, **kw):
        r = super()._run(argv, timeout, **kw)
        if self.cuts > 0 and list(argv[:3]) == ["sh", "-c", READ_SCRIPT]:
            self.cuts -= 1
            r = dataclasses.replace(r, stdout=r.stdout[: len(r.stdout) // 2])
        return r

    def _get(self, remote, local):
        n = super()._get(remote, local)
        if self.cuts > 0:
            self.cuts -= 1
            data = local.read_bytes()
            local.write_bytes(data[: len(data) // 2])
        return n


def _traces(work: Path, n: int = 3, rows: int = 400) -> list[str]:
    paths = []
    for i in range(n):
        p = work / f"trace-{i}.csv"
        p.write_text("# route_trace v3\n" + "".join(f"0,1,{r},0,0,{r % 8},0.5,0,1024,0,0,0,0,0\n" for r in range(rows)))
        paths.append(str(p))
    return paths


def test_files_read_back_are_the_devices_bytes_and_a_missing_one_is_none(tmp_path: Path) -> None:
    t = LocalTransport(_device(tmp_path))
    t.connect()
    paths = _traces(tmp_path / "work")
    odd = tmp_path / "work" / "odd name\n\x1e.csv"  # a name with a newline and the old marker byte
    odd.write_bytes(b"no trailing newline")
    got = read_files(t, [*paths, str(odd), str(tmp_path / "work" / "absent.csv")], timeout=30)
    for p in paths:
        assert got[p] == Path(p).read_bytes()
    assert got[str(odd)] == b"no trailing newline"
    assert got[str(tmp_path / "work" / "absent.csv")] is None


def test_a_read_cut_short_on_the_link_is_read_again(tmp_path: Path) -> None:
    t = CuttingTransport(_device(tmp_path), cuts=1)
    t.connect()
    paths = _traces(tmp_path / "work")
    got = read_files(t, paths, timeout=30)
    assert all(got[p] == Path(p).read_bytes() for p in paths)
    assert t.cuts == 0  # the first answer was cut, and it did not reach the caller


def test_a_read_that_stays_short_is_an_infrastructure_error_naming_the_file(tmp_path: Path) -> None:
    t = CuttingTransport(_device(tmp_path), cuts=2)
    t.connect()
    paths = _traces(tmp_path / "work")
    with pytest.raises(InfraError) as err:
        read_files(t, paths, timeout=30)
    assert err.value.kind == "transfer"
    assert "trace-" in err.value.reason and "read twice" in err.value.reason
    assert "bytes arrived" in err.value.reason or "nothing came back" in err.value.reason


def test_a_pull_cut_short_is_pulled_again_or_an_infrastructure_error(tmp_path: Path) -> None:
    dev = _device(tmp_path)
    (tmp_path / "work").mkdir()
    src = tmp_path / "work" / "ref.logits.f32"
    src.write_bytes(bytes(range(256)) * 1000)
    once = CuttingTransport(dev, cuts=1)
    got = pull(once, str(src), "a/logits.f32", root=tmp_path / "results", timeout=30)
    assert got.read_bytes() == src.read_bytes() and once.cuts == 0
    always = CuttingTransport(dev, cuts=2)
    with pytest.raises(InfraError) as err:
        pull(always, str(src), "b/logits.f32", root=tmp_path / "results", timeout=30)
    assert err.value.kind == "transfer" and "ref.logits.f32" in err.value.reason and "twice" in err.value.reason
    assert not (tmp_path / "results" / "b" / "logits.f32").exists()  # no short copy left for anyone to read
    with pytest.raises(InfraError, match="no such file"):
        pull(LocalTransport(dev), str(tmp_path / "work" / "gone"), "c", root=tmp_path / "results", timeout=30)


def test_a_session_pull_names_its_step(tmp_path: Path) -> None:
    s = DeviceSession(
        _device(tmp_path), results_dir=tmp_path / "results", transport=CuttingTransport(_device(tmp_path), 2)
    )
    s.connect()
    (tmp_path / "work" / "x.bin").write_bytes(b"x" * 1000)
    with pytest.raises(InfraError) as err:
        s.pull(str(tmp_path / "work" / "x.bin"), "x.bin")
    assert err.value.line().startswith("d: pull x.bin: transfer: ")


@needs_adb
def test_over_adb_a_pull_or_a_read_cut_short_on_the_far_end(tmp_path: Path) -> None:
    """The stand-in adbd cuts the first pull and the output of one shell command at the far end (adb says
    all went well): each is read again and arrives whole; cut twice, an infrastructure error."""
    work = tmp_path / "phone"
    work.mkdir()
    data = hashlib.sha256(b"seed").digest() * 5000
    (work / "logits.f32").write_bytes(data)
    traces = _traces(work)
    # shell commands: 1 connect's set-up, 2 the pull's size and hash, 3 the size and hash again (after the
    # cut pull), 4 the read of the traces (cut), 5 its second read
    with adb_link(tmp_path / "link", "--cut-pull", "1", "--cut-output", "4") as link:
        farm = tmp_path / "farm.yaml"
        farm.write_text("version: 1\ndevices:\n" + link.device_yaml("phone", ARCH, work, "    retries: 0\n"))
        s = DeviceSession(load_farm_file(farm).device("phone"), results_dir=tmp_path / "results")
        s.connect()
        started = time.monotonic()
        assert s.pull(str(work / "logits.f32"), "logits.f32").read_bytes() == data
        got = s.read_files(traces)
        assert all(got[p] == Path(p).read_bytes() for p in traces)
        assert time.monotonic() - started < 60
    # cut twice: shell command 2 (the read) and 3 (the read again), then both pulls
    cuts = ("--cut-output", "2", "--cut-output", "3", "--cut-pull", "1", "--cut-pull", "2")
    with adb_link(tmp_path / "link2", *cuts) as link:
        farm.write_text("version: 1\ndevices:\n" + link.device_yaml("phone", ARCH, work, "    retries: 0\n"))
        s = DeviceSession(load_farm_file(farm).device("phone"), results_dir=tmp_path / "results")
        s.connect()
        with pytest.raises(InfraError) as err:
            s.read_files(traces)
        assert err.value.kind == "transfer" and "trace-" in err.value.reason and "read twice" in err.value.reason
        with pytest.raises(InfraError) as err:
            s.pull(str(work / "logits.f32"), "again.f32")
        assert err.value.kind == "transfer" and "logits.f32" in err.value.reason

"""Every input file is bounded in size and depth and read as the kind of file it claims to be, with one
line naming the file and the reason: a 400 MB farm file used to be read whole (853 MiB of memory),
/dev/zero as one gave a MemoryError, a FIFO hung the command, and a deeply nested results file a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bmoe_ci.farm import FarmConfigError, load_farm_file
from bmoe_ci.inputs import InputError, parse_json, read_json
from gate_run import REPO, host_farm


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_a_huge_farm_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:  # sparse: 400 MB claimed, nothing written
        fh.truncate(400 << 20)
    started = time.monotonic()
    with pytest.raises(FarmConfigError) as err:
        load_farm_file(big)
    assert "larger than 1048576 bytes" in _one_line(err.value) and time.monotonic() - started < 1


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory"])
def test_a_farm_file_that_is_not_a_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        path = tmp_path / "farm.yaml"
        os.mkfifo(path)  # nobody writes: reading it would wait for ever
    elif kind == "directory":
        path = tmp_path / "farm.yaml"
        path.mkdir()
    else:
        path = Path(kind)
    started = time.monotonic()
    with pytest.raises(FarmConfigError) as err:
        load_farm_file(path)
    assert "not a file" in _one_line(err.value) and time.monotonic() - started < 1


def test_json_is_bounded_in_depth_and_refuses_nan(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="nested deeper than 64"):
        parse_json("[" * 100_000 + "]" * 100_000, "deep.json")
    text = '{"a": "' + "[" * 70 + '"}'
    assert parse_json(text, "s") == {"a": "[" * 70}  # brackets in a string are not nesting
    for bad in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(InputError, match="not a number JSON allows"):
            parse_json(f'{{"x": {bad}}}', "n.json")
    (tmp_path / "ok.json").write_text('{"x": [1, 2.5]}')
    assert read_json(tmp_path / "ok.json") == {"x": [1, 2.5]}


def test_a_deeply_nested_results_file_is_one_line_for_bmoe_ci_report(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "host").mkdir(parents=True)
    (results / "host" / "device.json").write_text('{"records": ' + "[" * 200_000 + "]" * 200_000 + "}")
    (results / "summary.json").write_text("[" * 200_000 + "]" * 200_000)
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "report", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, proc.stderr[-2000:]


def test_a_sane_farm_file_still_loads(tmp_path: Path) -> None:
    assert load_farm_file(host_farm(tmp_path)).names == ["host"]

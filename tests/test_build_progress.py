"""A cold build says what it is doing: it used to be silent for three minutes at the default verbosity
and under -q. Now a compiling target is announced at every verbosity but -qq, and while it compiles a
line comes every few seconds at the normal verbosity."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from bmoe_ci import builder
from bmoe_ci.gaterun.prepare import _build_message
from bmoe_ci.gaterun.progress import Progress


@pytest.fixture
def slow_zig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "zig"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = version ]; then echo 0.0-fake; exit 0; fi\n'
        'out=; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\n'
        'sleep 2.5; printf "#!/bin/sh\\n" > "$out"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(builder, "zig_command", lambda: [str(fake)])


def test_a_compile_says_it_still_runs(tmp_path: Path, slow_zig: None) -> None:
    said: list[str] = []
    b = builder.build("host", cache=tmp_path / "cache", heartbeat=0.8, progress=said.append)
    assert b.compiled and b.path.is_file()
    assert said[0].startswith("building bmoe ")
    still = [m for m in said if m.startswith("still building ")]
    assert len(still) >= 2, said
    cached = builder.build("host", cache=tmp_path / "cache", heartbeat=0.8, progress=said.append)
    assert not cached.compiled and len(said) == 1 + len(still)  # a cached target says nothing here


@pytest.mark.parametrize(("verbosity", "expected"), [(0, 3), (-1, 1), (-2, 0)])
def test_under_q_a_compiling_target_is_one_line(verbosity: int, expected: int) -> None:
    out = io.StringIO()
    progress = Progress(verbosity=verbosity, stream=out)
    for msg in ("building bmoe abc for x86_64-linux-musl", "still building x86_64-linux-musl: 20 s", "still ... 40 s"):
        _build_message(progress, msg)
    assert len(out.getvalue().splitlines()) == expected, out.getvalue()


def test_the_real_toolchain_is_still_the_default() -> None:
    assert builder.zig_command()[0] == sys.executable

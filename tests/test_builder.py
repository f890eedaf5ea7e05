"""The builder: build ids are content hashes, the cache compiles nothing twice, errors are shown whole."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bmoe_ci.builder import BuildError, build, compute_build_id, host_target, resolve_target, zig_version
from bmoe_ci.paths import Places


@pytest.fixture
def engine_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "engine"
    shutil.copytree(Places.from_environ(os.environ).source_tree() / "engine" / "src", dst / "src")
    return dst


def test_build_id_is_a_content_hash(engine_copy: Path) -> None:
    zig = zig_version()
    target = host_target()
    base = compute_build_id(target, (), engine_copy, zig)
    assert base == compute_build_id(target, (), engine_copy, zig)
    assert base != compute_build_id("aarch64-linux-musl", (), engine_copy, zig)
    assert base != compute_build_id(target, ("BMOE_FAULT_X=1",), engine_copy, zig)
    assert base != compute_build_id(target, (), engine_copy, zig + "-other")
    source = engine_copy / "src" / "main.c"
    source.write_text(source.read_text() + "\n/* a comment changes the bytes */\n")
    assert base != compute_build_id(target, (), engine_copy, zig)


def test_cached_build_compiles_nothing_and_embeds_its_id(engine_copy: Path, tmp_path: Path) -> None:
    first = build("host", engine_dir=engine_copy, cache=tmp_path / "cache", progress=lambda _: None)
    second = build("host", engine_dir=engine_copy, cache=tmp_path / "cache", progress=lambda _: None)
    assert first.compiled and not second.compiled
    assert first.path == second.path and first.build_id == second.build_id
    version = subprocess.run([str(second.path), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"bmoe 0.1.0 build {first.build_id} target {first.target}"
    forced = build("host", engine_dir=engine_copy, cache=tmp_path / "cache", rebuild=True, progress=lambda _: None)
    assert forced.compiled


def test_compiler_errors_are_shown_in_full(engine_copy: Path, tmp_path: Path) -> None:
    (engine_copy / "src" / "broken.c").write_text("int broken(void) { return undeclared_name; }\n")
    with pytest.raises(BuildError) as err:
        build("host", engine_dir=engine_copy, cache=tmp_path / "cache", progress=lambda _: None)
    text = str(err.value)
    assert "broken.c" in text and "undeclared_name" in text and "failed" in text


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(BuildError, match="aarch64-linux-musl"):
        resolve_target("riscv64-plan9")
    assert resolve_target("host") == host_target()


def test_cli_build_prints_target_id_and_path(capsys: pytest.CaptureFixture[str]) -> None:
    from bmoe_ci.cli import main

    assert main(["build", "--target", "host"]) == 0
    target, build_id, path, state = capsys.readouterr().out.strip().split("\t")
    assert target == host_target() and len(build_id) == 16 and Path(path).is_file()
    assert state in ("compiled", "cached")
    with pytest.raises(SystemExit) as usage:
        main(["build", "--target", "nonsense"])
    assert usage.value.code == 2

"""Nothing outside what bmoe-ci made is deleted or followed on a device: `bmoe-ci farm gc` followed a
`store` symlink and deleted the files it led to; a gate run deleted what a user already had in an
existing work directory's `store/` and `runs/`, and replaced a file of theirs with a fixture link."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bmoe_ci.farm import DeviceSession, InfraError, PushItem, load_farm_file
from gate_run import host_farm


def _session(tmp_path: Path) -> DeviceSession:
    s = DeviceSession(load_farm_file(host_farm(tmp_path)).device("host"), run_id="r1")
    s.connect()
    s.lock()
    return s


def _item(tmp_path: Path, name: str | None = None) -> PushItem:
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(1000))
    return PushItem(f, name=name)


def test_a_store_that_is_a_symlink_is_neither_followed_by_gc_nor_pushed_into(tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("years of work")
    (elsewhere / ("a" * 64)).write_text("named like a stored file")
    work = tmp_path / "work"
    work.mkdir()
    (work / "store").symlink_to(elsewhere)
    s = _session(tmp_path)
    try:
        for step in (lambda: s.gc(1), lambda: s.push_files([_item(tmp_path)])):
            with pytest.raises(InfraError) as err:
                step()
            assert err.value.kind == "setup" and "store is a symlink" in err.value.reason
    finally:
        s.close()
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted(["thesis.tex", "a" * 64])


def test_a_users_files_in_an_existing_store_or_runs_are_left_alone(tmp_path: Path) -> None:
    for sub in ("store", "runs"):
        case = tmp_path / sub
        (case / "work" / sub).mkdir(parents=True)
        mine = case / "work" / sub / "notes.txt"
        mine.write_text("mine")
        s = _session(case)
        try:
            with pytest.raises(InfraError) as err:
                s.push_files([_item(case)])
            assert "holds notes.txt, which bmoe-ci did not make" in err.value.reason
            with pytest.raises(InfraError):
                s.gc(1)
        finally:
            s.close()
        assert mine.read_text() == "mine"


def test_a_store_of_an_older_bmoe_ci_without_the_marker_is_adopted(tmp_path: Path) -> None:
    item = _item(tmp_path)
    sha = hashlib.sha256(item.local.read_bytes()).hexdigest()
    store = tmp_path / "work" / "store"
    store.mkdir(parents=True)
    (store / sha).write_bytes(item.local.read_bytes())
    (store / ".tmp-leftover").write_text("")
    (tmp_path / "work" / "runs").mkdir()
    (tmp_path / "work" / "runs" / "r0").write_text(sha + "\n")
    s = _session(tmp_path)
    try:
        report = s.push_files([item])
        assert report.bytes_pushed == 0 and report.swept == 1
        assert s.gc(1).removed == []
    finally:
        s.close()
    assert (store / ".bmoe-ci").is_file() and (tmp_path / "work" / "runs" / ".bmoe-ci").is_file()


def test_a_named_link_never_replaces_a_users_file_or_follows_a_symlinked_directory(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "fixtures").mkdir(parents=True)
    theirs = work / "fixtures" / "m.gguf"
    theirs.write_text("their own model")
    s = _session(tmp_path)
    try:
        with pytest.raises(InfraError, match="is not a link bmoe-ci made"):
            s.push_files([_item(tmp_path, name="fixtures/m.gguf")])
        assert theirs.read_text() == "their own model"
        outside = tmp_path / "outside"
        outside.mkdir()
        (work / "linked").symlink_to(outside)
        with pytest.raises(InfraError, match="linked is a symlink"):
            s.push_files([_item(tmp_path, name="linked/m.gguf")])
        assert list(outside.iterdir()) == []
    finally:
        s.close()

"""Leases are broken on what the breaking controller saw itself, on its own monotonic clock, never on
another machine's wall clock: a controller whose clock ran 250 s ahead used to break a live run's lease
(that run then got a gate FAIL); a lease with a heartbeat from the future, or a NaN TTL, never expired."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from bmoe_ci.farm import DeviceBusy, load_farm_file
from bmoe_ci.farm.lock import LOCK_DIR, DeviceLock
from bmoe_ci.farm.transports import open_transport
from gate_run import host_farm

TTL = 4.0


def _transport(tmp_path: Path):
    t = open_transport(load_farm_file(host_farm(tmp_path)).device("host"))
    t.connect()
    return t


def _owner(beat: float, ttl: float | str = TTL, seq: int = 0) -> str:
    text = json.dumps(
        {
            "host": "another-machine",
            "boot": "x",
            "pid": 4242,
            "pid_start": None,
            "run_id": "their-run",
            "since": time.time() - 30,
            "beat": beat,
            "token": "t",
            "ttl": ttl,
            "seq": seq,
        }
    )
    return text.replace('"NaN"', "NaN")


def _hold(tmp_path: Path, owner: str) -> Path:
    lock = tmp_path / "work" / LOCK_DIR
    lock.mkdir(parents=True)
    (lock / "owner").write_text(owner + "\n")
    return lock


def test_a_live_lease_whose_holders_clock_differs_by_250s_is_never_broken(tmp_path: Path) -> None:
    t = _transport(tmp_path)
    lock = _hold(tmp_path, _owner(time.time() - 250))
    stop = threading.Event()

    def renew() -> None:  # the other run, alive, renewing every second with its clock 250 s behind ours
        seq = 0
        while not stop.wait(1.0):
            seq += 1
            tmp = lock / "owner.tmp"
            tmp.write_text(_owner(time.time() - 250, seq=seq) + "\n")
            tmp.replace(lock / "owner")

    holder = threading.Thread(target=renew, daemon=True)
    holder.start()
    try:
        started = time.monotonic()
        with pytest.raises(DeviceBusy) as busy:
            DeviceLock(t, "our-run", ttl=TTL).acquire(wait=0, poll=0.2)
        took = time.monotonic() - started
    finally:
        stop.set()
        holder.join()
    assert "their-run" in str(busy.value)
    assert took < TTL  # seen renewed within a renewal or two, then busy
    assert json.loads((lock / "owner").read_text())["run_id"] == "their-run"  # still theirs


def test_a_fresh_live_lease_is_busy_at_once(tmp_path: Path) -> None:
    t = _transport(tmp_path)
    _hold(tmp_path, _owner(time.time()))
    started = time.monotonic()
    with pytest.raises(DeviceBusy):
        DeviceLock(t, "our-run", ttl=TTL).acquire(wait=0)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(
    "owner",
    [_owner(time.time() + 1000), _owner(time.time(), ttl="NaN"), _owner(time.time() - 10_000), "{garbage"],
    ids=["heartbeat from the future", "NaN ttl", "old heartbeat", "unreadable owner"],
)
def test_a_dead_lease_is_broken_after_the_ttl_on_our_own_clock(tmp_path: Path, owner: str) -> None:
    t = _transport(tmp_path)
    _hold(tmp_path, owner)
    lease = DeviceLock(t, "our-run", ttl=TTL)
    started = time.monotonic()
    lease.acquire(wait=0, poll=0.2)
    took = time.monotonic() - started
    assert lease.owner is not None and lease.broke, lease.broke
    assert "by this controller's own clock" in lease.broke[0]
    assert TTL - 0.5 <= took < TTL + 5  # watched for the TTL itself, no longer, no less
    lease.release()

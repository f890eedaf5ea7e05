"""A device's finished tests as they come: ``<device>/records.jsonl``, one line per test.

Rewriting a device's ``device.json`` and ``junit.xml`` after every finished test costs time that grows
with the run (each rewrite serialises every record so far): on a gate run of a few thousand tests it was
the controller's biggest cost. So the controller appends each finished test to this journal (one short
write, whatever the run's size) and rewrites the two files only now and then and at the end. Whoever
reads a results directory merges the journal into what the files hold (:func:`merge_journal`), so a run
killed between two rewrites still loses nothing that finished.

Each line is one JSON object: the test's record and what it added to the device's totals (engine and
wall seconds, its output digest, kernel paths, XDEV fingerprints). A line cut short by a kill is the
last one and is ignored; a line that does not parse ends the reading there.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from bmoe_ci import inputs
from bmoe_ci.reports.records import DeviceRun, ReportError, TestRecord, device_dir

JOURNAL = "records.jsonl"
_RECORD = TypeAdapter(TestRecord)


@dataclass(kw_only=True)
class JournalEntry:
    """One finished test, and what it added to its device's totals."""

    record: TestRecord
    engine_s: float = 0.0
    wall_s: float = 0.0
    output: tuple[str, str] | None = None  # (fixture, digest)
    kernels: list[str] = field(default_factory=list)
    digests: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_line(self) -> bytes:
        data = asdict(self)
        return (json.dumps(data, separators=(",", ":")) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalEntry:
        """One line's entry, its record validated as device.json's are; ValueError on anything else."""
        out = data.get("output")
        seconds = (float(data.get("engine_s", 0.0)), float(data.get("wall_s", 0.0)))
        if not all(math.isfinite(x) and x >= 0 for x in seconds):
            raise ValueError(f"seconds {seconds} are not finite and non-negative")
        digests = data.get("digests") or {}
        if not isinstance(digests, dict):
            raise ValueError("digests is not an object")
        return cls(
            record=_RECORD.validate_python(data["record"], strict=False),
            engine_s=seconds[0],
            wall_s=seconds[1],
            output=(str(out[0]), str(out[1])) if out else None,
            kernels=[str(k) for k in data.get("kernels", [])],
            digests=digests,
        )


def journal_path(results_dir: Path | str, device: str) -> Path:
    return device_dir(results_dir, device) / JOURNAL


def start_journal(results_dir: Path | str, device: str) -> None:
    """An empty journal for a new run (an earlier run's in the same directory is not this run's)."""
    path = journal_path(results_dir, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def append_entry(results_dir: Path | str, entry: JournalEntry) -> None:
    """One line, in one write to a file opened for appending: a kill leaves at most the last line cut."""
    fd = os.open(journal_path(results_dir, entry.record.device), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, entry.to_line())
    finally:
        os.close(fd)


def read_entries(path: Path) -> list[JournalEntry]:
    """The whole lines of a journal, in order ([] when there is none); reading stops at the first line
    that does not parse or validate (a kill cut it: every line before it is whole). A journal that is
    not a regular file, or is larger than any results file may be, is a :class:`ReportError`."""
    if not path.exists():
        return []
    try:
        text = inputs.read_bytes(path, what="journal", limit=inputs.MAX_JSON_BYTES).decode("utf-8", errors="replace")
    except inputs.InputError as exc:
        raise ReportError(str(exc)) from None
    entries = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                break
            entries.append(JournalEntry.from_dict(data))
        except (ValueError, TypeError, KeyError, IndexError):  # pydantic's ValidationError is a ValueError
            break
    return entries


def finished_tests(dev_dir: Path) -> int:
    """How many tests a device has finished so far in a run (running or killed): its journal's whole
    lines. What watches a run from outside counts this, not device.json, which lags by up to a rewrite."""
    return len(read_entries(dev_dir / JOURNAL))


def merge_journal(run: DeviceRun, dev_dir: Path) -> int:
    """Add to *run* (read from device.json or junit.xml) the journal's tests it does not hold yet, with
    what they added to the device's totals; returns how many were added. A test is known by its
    classname and name, so a record the files already hold is never counted twice."""
    path = dev_dir / JOURNAL
    held = {(r.classname, r.name) for r in run.records}
    added = 0
    for entry in read_entries(path):
        rec = entry.record
        if rec.device != run.device or (rec.classname, rec.name) in held:
            continue
        held.add((rec.classname, rec.name))
        run.records.append(rec)
        run.engine_s = round(run.engine_s + entry.engine_s, 3)
        run.wall_s = round(run.wall_s + entry.wall_s, 3)
        if entry.output is not None:
            run.outputs[entry.output[0]] = entry.output[1]
        run.kernels = sorted(set(run.kernels) | set(entry.kernels))
        run.digests.update(entry.digests)
        added += 1
    return added

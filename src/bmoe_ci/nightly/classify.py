"""Classification of tonight's results against the previous runs: pure functions over history rows.

Each test of tonight (device, gate, fixture and test name) gets at most one class:

``new failure``    fails tonight, did not fail the last time it ran (passed, skipped, errored or is new)
``still failing``  failed last time too; ``since`` is the first run of the unbroken failing streak
``fixed``          passes tonight, failed the last time it ran
``flaky``          (replaces the three above) in the last ``window`` runs it both passed and failed with
                   the same engine build, or flipped between pass and fail at least ``flips`` times
                   between runs of the same engine build
``new error``      an infrastructure error tonight (kept apart from failures) that was not an error the
                   last time; for a device not reached at all, only its ``infrastructure`` case
and each device of the pool that gave no verdict tonight is ``device missing``.

Cross-device agreement: tonight's disagreements (devices whose output for a fixture and entry differs
from the others), and per device the outputs that changed since its previous run, with whether its
engine build changed too (expected) or not (a device or toolchain problem).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from bmoe_ci.nightly.history import DeviceRow, OutputRow, ResultRow, is_infra

Key = tuple[str, str, str, str]  # (device, gate, fixture, test name)


@dataclass(frozen=True)
class FlakyPolicy:
    """When a (device, gate, fixture) counts as flaky; ``bmoe-ci nightly --flaky-window/--flaky-flips``."""

    window: int = 10
    flips: int = 3

    def __post_init__(self) -> None:
        if self.window < 2 or self.flips < 1:
            raise ValueError("flaky policy: --flaky-window must be at least 2 and --flaky-flips at least 1")


@dataclass(frozen=True, kw_only=True)
class Finding:
    device: str
    arch: str
    gate: str
    fixture: str
    name: str
    message: str = ""
    since: str | None = None  # still failing: the first run of the streak
    last_outcome: str | None = None  # what it was the last time it ran (None: never ran before)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "last_outcome"}


@dataclass(frozen=True, kw_only=True)
class MissingDevice:
    device: str
    arch: str
    reason: str
    since: str | None  # first run of the unbroken streak of absence

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Disagreement:
    fixture: str
    entry: str
    field: str
    values: dict[str, str]  # device -> value or digest
    minority: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class OutputChange:
    device: str
    arch: str
    fixture: str
    entry: str
    before: str
    after: str
    previous_run: str
    build_changed: bool  # True: expected (the engine changed); False: a device or toolchain problem

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class Classification:
    new_failures: list[Finding] = field(default_factory=list)
    still_failing: list[Finding] = field(default_factory=list)
    fixed: list[Finding] = field(default_factory=list)
    flaky: list[Finding] = field(default_factory=list)
    new_errors: list[Finding] = field(default_factory=list)
    devices_missing: list[MissingDevice] = field(default_factory=list)


def _key(row: ResultRow) -> Key:
    return (row.device, row.gate, row.fixture, row.name)


def _finding(row: ResultRow, **extra: Any) -> Finding:
    return Finding(
        device=row.device,
        arch=row.arch,
        gate=row.gate,
        fixture=row.fixture,
        name=row.name,
        message=row.message,
        **extra,
    )


def is_flaky(history: list[ResultRow], policy: FlakyPolicy) -> bool:
    """*history*: one key's rows, oldest first, tonight last. Only pass and fail count (an error says
    nothing about the engine, a skip did not run it)."""
    verdicts = [r for r in history if r.outcome in ("pass", "fail")][-policy.window :]
    by_build: dict[str, set[str]] = defaultdict(set)
    for r in verdicts:
        by_build[r.engine_build_id].add(r.outcome)
    if any(len(outcomes) == 2 for outcomes in by_build.values()):
        return True
    flips = sum(1 for a, b in pairwise(verdicts) if a.outcome != b.outcome and a.engine_build_id == b.engine_build_id)
    return flips >= policy.flips


def classify(
    tonight: list[ResultRow],
    previous: list[ResultRow],
    devices: list[DeviceRow],
    previous_devices: dict[str, list[DeviceRow]],
    policy: FlakyPolicy | None = None,
) -> Classification:
    """Classify *tonight*'s rows against *previous* (older runs' rows, oldest first).

    *devices*: tonight's device states (every device of the pool); *previous_devices*: per previous
    run id, oldest first, its device states (for how long a device has been missing)."""
    policy = policy or FlakyPolicy()
    past: dict[Key, list[ResultRow]] = defaultdict(list)
    for row in previous:
        past[_key(row)].append(row)
    out = Classification()
    missing = {d.device for d in devices if not d.reached}
    for row in sorted(tonight, key=lambda r: (r.device, r.gate, r.fixture, r.name)):
        before = past.get(_key(row), [])
        last = before[-1] if before else None
        last_outcome = last.outcome if last else None
        if row.outcome == "error":
            if row.device in missing and not is_infra(row.gate):
                continue  # a device that was not reached: its one infrastructure case says it all
            if last_outcome != "error":
                out.new_errors.append(_finding(row, last_outcome=last_outcome))
            continue
        if is_infra(row.gate) or row.outcome == "skip":
            continue
        if row.outcome in ("pass", "fail") and is_flaky([*before, row], policy):
            out.flaky.append(_finding(row, last_outcome=last_outcome))
        elif row.outcome == "fail" and last_outcome == "fail":
            since = row.run
            for old in reversed(before):
                if old.outcome != "fail":
                    break
                since = old.run
            out.still_failing.append(_finding(row, since=since, last_outcome=last_outcome))
        elif row.outcome == "fail":
            out.new_failures.append(_finding(row, last_outcome=last_outcome))
        elif row.outcome == "pass" and last_outcome == "fail":
            out.fixed.append(_finding(row, last_outcome=last_outcome))
    for dev in devices:
        if dev.in_pool and not dev.reached:
            since = dev.run
            for run_id in reversed(list(previous_devices)):
                old_dev = {d.device: d for d in previous_devices[run_id]}.get(dev.device)
                if old_dev is None or old_dev.reached:
                    break
                since = run_id
            out.devices_missing.append(
                MissingDevice(device=dev.device, arch=dev.arch, reason=dev.infra_error or "unreachable", since=since)
            )
    return out


def disagreements_from_outputs(outputs: list[OutputRow]) -> list[Disagreement]:
    """Tonight's cross-device disagreements computed from the per-device outputs (used when the
    summary carries no ``disagreements`` of its own). The minority is every device outside the
    largest group of identical outputs (all of them but the first group on a tie)."""
    groups: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for o in outputs:
        groups[(o.fixture, o.entry)][o.sha256].append(o.device)
    found = []
    for (fixture, entry), by_sha in sorted(groups.items()):
        if len(by_sha) < 2:
            continue
        ordered = sorted(by_sha.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        minority = sorted(d for _, devs in ordered[1:] for d in devs)
        values = {d: sha for sha, devs in by_sha.items() for d in devs}
        found.append(
            Disagreement(
                fixture=fixture, entry=entry, field="sha256", values=dict(sorted(values.items())), minority=minority
            )
        )
    return found


def disagreements_from_summary(summary: dict[str, Any]) -> list[Disagreement] | None:
    """The summary's own ``disagreements`` (the XDEV gate), or None when the summary holds no XDEV verdict
    (results recorded without per-entry digests): then the caller compares the per-device outputs."""
    raw = summary.get("disagreements")
    judged = any(
        g == "XDEV" and o != "skip" for d in summary.get("devices", {}).values() for g, o in d.get("gates", {}).items()
    )
    if raw is None or (not raw and not judged):
        return None
    return [
        Disagreement(
            fixture=str(d["fixture"]),
            entry=str(d.get("entry", "")),
            field=str(d.get("field", "")),
            values={str(k): str(v) for k, v in d.get("values", {}).items()},
            minority=sorted(str(m) for m in d.get("minority", [])),
        )
        for d in raw
    ]


def output_changes(tonight: list[OutputRow], previous: list[OutputRow]) -> list[OutputChange]:
    """Per device, fixture and entry: the output that differs from the device's most recent earlier
    output. *previous*: older runs' rows, oldest first."""
    last: dict[tuple[str, str, str], OutputRow] = {}
    for o in previous:
        last[(o.device, o.fixture, o.entry)] = o
    changes = []
    for o in sorted(tonight, key=lambda o: (o.device, o.fixture, o.entry)):
        old = last.get((o.device, o.fixture, o.entry))
        if old is not None and old.sha256 != o.sha256:
            changes.append(
                OutputChange(
                    device=o.device,
                    arch=o.arch,
                    fixture=o.fixture,
                    entry=o.entry,
                    before=old.sha256,
                    after=o.sha256,
                    previous_run=old.run,
                    build_changed=old.engine_build_id != o.engine_build_id,
                )
            )
    return changes


def changed_archs(changes: list[OutputChange]) -> dict[str, dict[str, list[str]]]:
    """Per architecture, the fixtures whose output changed: ``{arch: {"expected": [...],
    "unexpected": [...]}}`` (expected: the engine build changed with it)."""
    out: dict[str, dict[str, set[str]]] = defaultdict(lambda: {"expected": set(), "unexpected": set()})
    for c in changes:
        out[c.arch]["expected" if c.build_changed else "unexpected"].add(f"{c.fixture}/{c.entry}")
    return {a: {k: sorted(v) for k, v in d.items()} for a, d in sorted(out.items())}

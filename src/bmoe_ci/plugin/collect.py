"""Turns pytest's per-phase reports into one result record per test and device (controller side).

Classification (docs/design.md, outcomes): an assertion in the test body is a gate *failure*; an infrastructure
problem (InfraError, marked by the worker as `bmoe.infra`) or any error in setup/teardown is an
*error*; a skip keeps its reason. A test whose phases never all arrived (a crashed xdist worker)
is an error too.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bmoe_ci.gaterun.context import GateRun
from bmoe_ci.reports import DeviceRun, RunMeta, TestRecord, console_matrix, exit_code, finalize, write_device_junit
from bmoe_ci.reports.journal import JournalEntry, append_entry, start_journal
from bmoe_ci.reports.plan import PlannedTest, read_plan, reconcile, write_pending_plan, write_plan
from bmoe_ci.reports.records import RUN_JSON
from bmoe_ci.reports.summary import CONSOLE_WIDTH, SUMMARY_JSON, human_bytes

#: The record of a test whose xdist worker died while running it (xdist runs it again elsewhere; that
#: second run is not recorded: a test is never retried).
CRASHED = (
    "infrastructure: the test process crashed (xdist worker lost) while running this test; "
    "xdist's second run of it is not a verdict"
)

#: A device's junit.xml and device.json are rewritten at most this often while its tests run (each
#: finished test goes to its journal at once: bmoe_ci.reports.journal), and once more at the end.
SNAPSHOT_EVERY_S = 5.0


@dataclass
class _Pending:
    props: dict[str, str]
    outcome: str = "pass"
    message: str = ""
    details: str = ""
    duration: float = 0.0
    stdout: str = ""
    artifacts: list[str] = field(default_factory=list)


def _props(report: pytest.TestReport) -> dict[str, str]:
    return {str(k): str(v) for k, v in report.user_properties if str(k).startswith("bmoe.")}


def _one_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0] if crash.message else ""
    if isinstance(report.longrepr, tuple):  # skip: (path, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


def reason_line(message: str, device_dir: Path) -> str:
    """A failure's first line as the reports show it: the reason, not how Python spelled it
    (``AssertionError: `` is dropped, other exception names stay: they say something) and without the
    absolute path of its artifacts directory, which the record links instead
    (``(artifacts in /abs/.../artifacts/test_x[...])``, ``(all in ...)``, ``; artifacts in ...``)."""
    text = message[len("AssertionError: ") :] if message.startswith("AssertionError: ") else message
    where = re.escape(str(device_dir))
    text = re.sub(rf"\s*\((?:artifacts|all) in {where}[^)]*\)", "", text)
    text = re.sub(rf"[;,]\s*(?:artifacts|all) in {where}[^)]*", "", text)
    return text.replace(str(device_dir) + "/", "")


def begin_run(results_dir: Path, run_id: str) -> None:
    """Mark *results_dir* as holding a run that has not planned its tests yet. An earlier session's
    plan, run.json (whose `finished` says a session ended) and summary in the same directory would
    be read as this run's if it were killed: the pending plan replaces the one, the others go."""
    write_pending_plan(results_dir, run_id)
    for stale in (RUN_JSON, SUMMARY_JSON):
        (results_dir / stale).unlink(missing_ok=True)


class RecordCollector:
    def __init__(self, run: GateRun, absolute_attachments: bool = False, planned: list[PlannedTest] | None = None):
        self.run = run
        self.absolute = absolute_attachments  # JUnit attachments by absolute path
        self.pending: dict[str, _Pending] = {}
        self.crashed: set[str] = set()  # node ids whose xdist worker died under them
        self.records: dict[str, list[TestRecord]] = {d.name: [] for d in run.devices}
        self.engine_s: dict[str, float] = {d.name: 0.0 for d in run.devices}
        self.wall_s: dict[str, float] = {d.name: d.setup_s for d in run.devices}
        self.outputs: dict[str, dict[str, str]] = {d.name: {} for d in run.devices}
        self.digests: dict[str, dict[str, dict[str, Any]]] = {d.name: {} for d in run.devices}
        self.kernels: dict[str, set[str]] = {}
        self.snapshot_at: dict[str, float] = {}  # device -> when its files were last rewritten (monotonic)
        # on disk from the start: a run killed now still has every device, and a plan that says the
        # tests were not collected yet (the real one replaces it before the first test starts)
        begin_run(Path(run.results_dir), run.run_id)
        if planned is not None:  # the selected tests, known before the devices were readied
            write_plan(run.results_dir, run.run_id, planned)
        for d in run.devices:
            start_journal(run.results_dir, d.name)
            self._snapshot(d.name)

    def add(self, report: pytest.TestReport) -> None:
        props = _props(report)
        if report.nodeid in self.crashed:
            return  # xdist's second run of a test whose worker was lost: the crash is its record
        if report.when == "???":  # xdist: the worker died running this test (its report carries no labels)
            self.crashed.add(report.nodeid)
            if report.nodeid in self.pending:
                p = self.pending[report.nodeid]
                p.outcome, p.message = "error", CRASHED
                p.details = CRASHED
                self._finish(report.nodeid)
            # else: it died before its set-up was reported; the plan records it as not run (an error)
            return
        if "bmoe.device" not in props:
            return  # not a gate test
        p = self.pending.setdefault(report.nodeid, _Pending(props))
        p.props.update(props)
        p.duration += report.duration
        if report.capstdout:
            p.stdout += report.capstdout
        infra = props.get("bmoe.infra") == "1"
        if report.skipped and p.outcome == "pass":
            p.outcome, p.message = "skip", _one_line(report)
        elif report.failed:
            if infra or report.when != "call":
                if p.outcome != "error":
                    p.outcome, p.message, p.details = "error", _one_line(report), report.longreprtext
            elif p.outcome == "pass":
                p.outcome, p.message, p.details = "fail", _one_line(report), report.longreprtext
        if report.when == "teardown":
            self._finish(report.nodeid)

    def _finish(self, nodeid: str) -> None:
        p = self.pending.pop(nodeid)
        device = p.props["bmoe.device"]
        entry = JournalEntry(
            record=self._record(device, p),
            engine_s=float(p.props.get("bmoe.engine_s", 0)),
            wall_s=p.duration,
        )
        if "bmoe.output" in p.props:
            fixture, _, digest = p.props["bmoe.output"].partition("=")
            entry.output = (fixture, digest)
        if "bmoe.kernels" in p.props:
            entry.kernels = [k for k in p.props["bmoe.kernels"].split(",") if k]
        if "bmoe.digests" in p.props:  # fixture -> entry -> fingerprint, from the plan's runs (XDEV)
            entry.digests = json.loads(p.props["bmoe.digests"])
        self.engine_s[device] = self.engine_s.get(device, 0.0) + entry.engine_s
        self.wall_s[device] = self.wall_s.get(device, 0.0) + entry.wall_s
        if entry.output is not None:
            self.outputs[device][entry.output[0]] = entry.output[1]
        self.kernels.setdefault(device, set()).update(entry.kernels)
        self.digests.setdefault(device, {}).update(entry.digests)
        self.records.setdefault(device, []).append(entry.record)
        # each finished test on disk at once (the journal); the whole files now and then
        append_entry(self.run.results_dir, entry)
        if time.monotonic() - self.snapshot_at.get(device, 0.0) >= SNAPSHOT_EVERY_S:
            self._snapshot(device)

    def _record(self, device: str, p: _Pending) -> TestRecord:
        artifacts = [a for a in p.props.get("bmoe.artifacts", "").split("\n") if a]
        device_dir = (Path(self.run.results_dir) / device).absolute()
        return TestRecord(
            device=device,
            gate=p.props["bmoe.gate"],
            fixture=p.props.get("bmoe.fixture") or None,
            name=p.props["bmoe.name"],
            classname=p.props.get("bmoe.classname", "gates"),
            outcome=p.outcome,  # type: ignore[arg-type]
            duration_s=p.duration,
            message=reason_line(p.message, device_dir),
            details=p.details,
            system_out=p.stdout or None,
            artifacts=artifacts,
        )

    def _snapshot(self, device: str) -> None:
        write_device_junit(self.run.results_dir, self._device_run(device), absolute=self.absolute)
        self.snapshot_at[device] = time.monotonic()

    def _device_run(self, name: str) -> DeviceRun:
        d = self.run.device(name)
        return DeviceRun(
            device=d.name,
            arch=d.arch,
            os=d.os,
            kind=d.kind,
            engine_build_id=d.build_id,
            target=d.target,
            kernels=sorted(self.kernels.get(d.name, ())),
            fixtures=dict(self.run.fixtures),
            pushed_bytes=d.pushed_bytes,
            verified_files=d.verified_files,
            repushed=list(d.repushed),
            retries=list(d.retries),
            engine_s=round(self.engine_s.get(d.name, 0.0), 3),
            wall_s=round(self.wall_s.get(d.name, 0.0), 3),
            outputs=self.outputs.get(d.name, {}),
            infra_error=d.infra_error,
            started=self.run.started,
            records=self.records.get(d.name, []),
            faults=list(self.run.faults),
            digests=self.digests.get(d.name, {}),
        )

    def finish(
        self, wall_s: float, *, width: int = CONSOLE_WIDTH, xdev_fixtures: list[str] | None = None
    ) -> tuple[str, int]:
        """Writes the results; returns the console text (laid out for a terminal *width* columns wide)
        and the summary's exit code. *xdev_fixtures*: the fixtures whose XDEV verdict the selection kept
        (None: every one; plugin/marks.py)."""
        for nodeid in list(self.pending):  # phases that never completed
            self.pending[nodeid].outcome = "error"
            self.pending[nodeid].message = "the test did not finish"
            self._finish(nodeid)
        runs = [self._device_run(d.name) for d in self.run.devices]
        plan = read_plan(self.run.results_dir)
        if plan is not None:  # tests that never ran (stopped session) are errors, not absent
            reconcile(runs, plan)
        meta = RunMeta(
            run=self.run.run_id,
            started=self.run.started,
            finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            engine_builds=self.run.engine_builds,
            compiled=self.run.compiled,
            fixtures=self.run.fixtures,
            notes=list(self.run.notes),
            faults=list(self.run.faults),
            devices=[d.name for d in self.run.devices],
            xdev_fixtures=xdev_fixtures,
        )
        for d in self.run.devices:  # what passing tests left: the devices' artifacts/ dirs, when empty
            shared = Path(self.run.results_dir) / d.name / "artifacts"
            with contextlib.suppress(OSError):
                if shared.is_dir() and not shared.is_symlink() and not any(shared.iterdir()):
                    shared.rmdir()
        data = finalize(self.run.results_dir, runs, meta, absolute=self.absolute)
        lines = [console_matrix(data, width)]
        built = ", ".join(self.run.compiled) or "nothing (every target from the cache)"
        pushed = sum(d.pushed_bytes for d in self.run.devices)
        engine = sum(self.engine_s.values())
        busiest = max(self.engine_s.values(), default=0.0)
        lines.append(f"built: {built}; pushed: {human_bytes(pushed)}")
        lines.append(
            f"time: session wall {wall_s:.1f} s; engine on the devices {engine:.1f} s in all, "
            f"{busiest:.1f} s on the busiest device (per-device overhead in summary.md)"
        )
        lines.append(f"results: {self.run.results_dir}")
        return "\n".join(lines), exit_code(data)

"""One engine run on a device, as every caller sees it: :func:`run_engine` and :class:`EngineResult`.

The gate suite (one entry of a plan, or a single run), `bmoe-ci ab`, and the release's replay and
quality runs all run the pushed engine with `--json` and read one JSON object back. How that object is
parsed, what a crash is (the engine died of a signal: a verdict on the engine) and what an
infrastructure problem is (the device or link failed: no verdict) is decided here, once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bmoe_ci.farm import DeviceSession, Ending, InfraError, RunResult


@dataclass
class EngineResult:
    """One engine run's outcome."""

    argv: tuple[str, ...]
    data: dict[str, Any]  # the JSON result object (`ok`, `tokens`, `counters`, ...) or {} on a crash
    crashed: str | None = None  # signal name when the engine died
    exit_code: int | None = None
    stderr: str = ""
    infra: InfraError | None = field(default=None, compare=False)  # set when the run gave no verdict
    duration: float = 0.0  # seconds, on the controller (0 for an entry of a plan)

    @property
    def ok(self) -> bool:
        return self.crashed is None and self.infra is None and bool(self.data.get("ok"))

    @property
    def exited_0(self) -> bool:
        """The engine process exited with status 0 (whatever its result object says)."""
        return self.infra is None and self.crashed is None and self.exit_code == 0

    @property
    def clean(self) -> bool:
        """:attr:`ok`, and the process exited 0: what the measuring commands (`ab`, the release) ask of a
        run before they use its numbers."""
        return self.ok and self.exited_0

    def describe(self) -> str:
        if self.infra is not None:
            return f"infrastructure error: {self.infra}"
        if self.crashed:
            # the reason, not the command line: the engine's arguments are in the test's artifacts (the
            # run's JSON), and a long absolute command line would push the reason out of every report
            last = next((ln.strip() for ln in reversed(self.stderr.splitlines()) if ln.strip()), "")
            return f"engine crashed ({self.crashed})" + (f": {last[:200]}" if last else "")
        if not self.data.get("ok"):
            err = self.data.get("error") or {}
            return f"engine error ({err.get('kind')}): {err.get('message')}"
        return "ok"

    def why(self, limit: int = 300) -> str:
        """Why the run did not succeed, in one piece of text: the engine's own error message, else the
        infrastructure error, else the tail of its stderr, else its exit status."""
        message = (self.data.get("error") or {}).get("message") if self.data else None
        text = message or (str(self.infra) if self.infra is not None else "") or self.stderr.strip()[-limit:]
        return text or (f"killed by {self.crashed}" if self.crashed else f"exit {self.exit_code}")


def parse_result(text: str) -> dict[str, Any]:
    """The engine's JSON result object; a line that is not one becomes a `protocol` error object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"ok": False, "error": {"kind": "protocol", "message": f"not JSON: {text[:200]!r}"}}
    return value if isinstance(value, dict) else {"ok": False, "error": {"kind": "protocol"}}


def crash_of(r: RunResult) -> str | None:
    """The signal the command died of (an engine crash), or None."""
    return r.signal_name if r.outcome is Ending.SIGNALED else None


def from_run(argv: Sequence[str], r: RunResult) -> EngineResult:
    """The :class:`EngineResult` of one finished engine process (`argv`: the engine's arguments)."""
    if r.outcome is Ending.INFRA:
        infra = r.infra or InfraError(r.device, "disconnect", r.describe())
        return EngineResult(tuple(argv), {}, None, None, r.stderr.decode(errors="replace"), infra, r.duration)
    data = parse_result(r.stdout.decode(errors="replace").strip() or "{}")
    return EngineResult(
        tuple(argv), data, crash_of(r), r.exit_code, r.stderr.decode(errors="replace"), None, r.duration
    )


def run_engine(
    session: DeviceSession, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> EngineResult:
    """Run the session's pushed engine once with ``argv`` (under the device's exec prefix; ``timeout`` is
    scaled by its ``timeout_scale``) and read its JSON result. Never raises for an infrastructure
    problem: :attr:`EngineResult.infra` says it."""
    return from_run(argv, session.run_engine(list(argv), timeout, env=env))


__all__ = ["EngineResult", "crash_of", "from_run", "parse_result", "run_engine"]

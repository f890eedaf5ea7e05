"""The data model of a run's results: one record per test and device, one run per device, the run.

Everything here is plain typed dataclasses. ``device.json`` and ``run.json`` are their lossless JSON
form; loading validates types (pydantic) and names the file on any problem, so a results directory
can be rebuilt from disk alone.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

from pydantic import TypeAdapter, ValidationError

from bmoe_ci import inputs

Outcome = Literal["pass", "fail", "error", "skip"]
OUTCOMES: tuple[str, ...] = get_args(Outcome)

DEVICE_SCHEMA = "bmoe-ci.device/1"
RUN_SCHEMA = "bmoe-ci.run/1"

DEVICE_JSON = "device.json"
RUN_JSON = "run.json"

# The synthetic test case that carries a device's infrastructure error (or its emptiness).
INFRA_GATE = "INFRA"
INFRA_NAME = "infrastructure"
INFRA_CLASSNAME = "bmoe_ci.infra"
NO_RESULTS = "no test results were recorded for this device"

_XDIST_GROUP = re.compile(r"@[^@\[\]]+$")
_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9_.+-]+$")


class ReportError(Exception):
    """A results directory or file that cannot be used; the message is one line naming the file."""


def strip_xdist_group(name: str) -> str:
    """``G1[qwen3moe]@pixel8`` -> ``G1[qwen3moe]``: xdist's ``--dist loadgroup`` suffix is not a name.

    Only a trailing ``@group`` outside the parameter brackets is removed, so ``G1[a@b]`` stays.
    """
    return _XDIST_GROUP.sub("", name)


def one_line(text: str | None, limit: int = 300) -> str:
    """The first non-blank line of *text*, stripped and cut to *limit* characters."""
    if not text:
        return ""
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def aggregate(outcomes: Iterable[str]) -> Outcome:
    """Any error -> error, else any fail -> fail, else any pass -> pass, else skip.

    Nothing at all is an error: an empty set of results must never read as a pass.
    """
    seen = set(outcomes)
    if not seen or "error" in seen:
        return "error"
    if "fail" in seen:
        return "fail"
    if "pass" in seen:
        return "pass"
    return "skip"


def check_device_name(device: str) -> str:
    """A device name is also a directory name under the results directory: keep it one safe component."""
    if not device or device in (".", "..") or not _SAFE_COMPONENT.match(device):
        raise ValueError(
            f"device name {device!r} is not usable as a results directory name "
            "(letters, digits, '_', '.', '+', '-' only)"
        )
    return device


def check_artifact_path(path: str) -> str:
    """Artifacts are relative to the device's results directory and must stay inside it."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or "\\" in path or any(part == ".." for part in pure.parts):
        raise ValueError(f"artifact path {path!r} must be relative to the device directory, without '..'")
    return str(pure)


@dataclass(kw_only=True)
class TestRecord:
    """One test on one device.

    ``outcome``: ``fail`` is an assertion (the engine's output is wrong), ``error`` an infrastructure
    or harness problem (unreachable, timeout, the process died), ``skip`` carries its reason in
    ``message``. ``artifacts`` are paths relative to ``results/<run>/<device>/``.
    """

    __test__ = False  # not a pytest test class

    device: str
    gate: str
    fixture: str | None = None
    name: str
    classname: str
    outcome: Outcome
    duration_s: float = 0.0
    message: str = ""
    details: str = ""
    system_out: str | None = None
    system_err: str | None = None
    artifacts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_device_name(self.device)
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if not self.gate:
            raise ValueError(f"test {self.name!r}: empty gate id")
        self.name = strip_xdist_group(self.name)
        if not self.name:
            raise ValueError("empty test name")
        self.message = one_line(self.message)
        self.duration_s = max(0.0, float(self.duration_s))
        self.artifacts = [check_artifact_path(p) for p in self.artifacts]


@dataclass(kw_only=True)
class DeviceRun:
    """Everything one device did in one run, lossless (this is ``device.json``)."""

    device: str
    arch: str
    os: str = ""
    kind: str = ""
    engine_build_id: str = ""
    target: str = ""
    kernels: list[str] = field(default_factory=list)  # the kernel paths its engine ran (engine JSON's kernels)
    fixtures: dict[str, str] = field(default_factory=dict)
    pushed_bytes: int = 0
    verified_files: int = 0  # distinct stored files whose hash the device checked
    repushed: list[str] = field(default_factory=list)  # files found corrupted, then re-pushed
    retries: list[str] = field(default_factory=list)  # retried transient connect/upload failures
    engine_s: float = 0.0
    wall_s: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)
    infra_error: str | None = None
    started: str | None = None
    records: list[TestRecord] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # engine faults built in (a fault build, never plain green)
    # fixture -> plan entry -> field -> value: what XDEV compares across devices (reports/xdev.py)
    digests: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_device_name(self.device)
        for rec in self.records:
            if rec.device != self.device:
                raise ValueError(f"record {rec.name!r} is for device {rec.device!r}, not {self.device!r}")
        if self.infra_error is not None:
            self.infra_error = one_line(self.infra_error) or "infrastructure error (no reason given)"

    def reported_records(self) -> list[TestRecord]:
        """The records as reported: plus one ``error`` case when the device had an infrastructure
        error, or when it recorded nothing at all (an empty device never reads as a pass)."""
        out = list(self.records)
        if self.infra_error is not None or not self.records:
            out.append(
                TestRecord(
                    device=self.device,
                    gate=INFRA_GATE,
                    name=INFRA_NAME,
                    classname=INFRA_CLASSNAME,
                    outcome="error",
                    message=self.infra_error or NO_RESULTS,
                    details=self.infra_error or NO_RESULTS,
                )
            )
        return out

    def counts(self) -> Counts:
        return Counts.of(r.outcome for r in self.reported_records())

    @property
    def status(self) -> Outcome:
        return aggregate(r.outcome for r in self.reported_records())

    def to_dict(self) -> dict[str, Any]:
        return {"schema": DEVICE_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> DeviceRun:
        return _validate(_DEVICE_ADAPTER, data, DEVICE_SCHEMA)


@dataclass(kw_only=True)
class RunMeta:
    """The run as a whole (this is ``run.json``). Timestamps are ISO 8601 strings."""

    run: str
    started: str | None = None
    finished: str | None = None
    engine_builds: dict[str, str] = field(default_factory=dict)
    compiled: list[str] = field(default_factory=list)
    fixtures: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. devices the selection skipped (quarantined)
    faults: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # the selection, in farm-file order (how reports list them)
    # the fixtures whose XDEV verdict the selection kept (-m/-k); None: every fixture (nothing narrowed it)
    xdev_fixtures: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": RUN_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> RunMeta:
        return _validate(_RUN_ADAPTER, data, RUN_SCHEMA)


@dataclass
class Counts:
    tests: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    @classmethod
    def of(cls, outcomes: Iterable[str]) -> Counts:
        c = cls()
        for o in outcomes:
            c.tests += 1
            if o == "pass":
                c.passed += 1
            elif o == "fail":
                c.failed += 1
            elif o == "error":
                c.errors += 1
            else:
                c.skipped += 1
        return c

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.tests + other.tests,
            self.passed + other.passed,
            self.failed + other.failed,
            self.errors + other.errors,
            self.skipped + other.skipped,
        )


_DEVICE_ADAPTER = TypeAdapter(DeviceRun)
_RUN_ADAPTER = TypeAdapter(RunMeta)


def _validate(adapter: TypeAdapter[Any], data: Any, schema: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    data = dict(data)
    found = data.pop("schema", schema)
    if found != schema:
        raise ValueError(f"schema {found!r}, expected {schema!r}")
    try:
        return adapter.validate_python(data, strict=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise ValueError(f"{where}: {err['msg']}") from None


# ---------------------------------------------------------------------------- files


def atomic_write(path: Path, data: bytes) -> None:
    """Write *data* to *path* through a temporary file and a rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def read_json(path: Path) -> Any:
    """A JSON file of a results directory: a regular file, bounded in size and depth, no NaN
    (bmoe_ci.inputs); any problem is a :class:`ReportError` naming the file."""
    try:
        return inputs.read_json(path, what="results file")
    except inputs.InputError as exc:
        raise ReportError(str(exc)) from None


def device_dir(results_dir: Path | str, device: str) -> Path:
    return Path(results_dir) / check_device_name(device)


def write_device_json(results_dir: Path | str, run: DeviceRun) -> Path:
    path = device_dir(results_dir, run.device) / DEVICE_JSON
    write_json(path, run.to_dict())
    return path


def read_device_json(path: Path) -> DeviceRun:
    try:
        return DeviceRun.from_dict(read_json(path))
    except ValueError as exc:
        raise ReportError(f"{path}: {exc}") from None


def write_run_json(results_dir: Path | str, meta: RunMeta) -> Path:
    path = Path(results_dir) / RUN_JSON
    write_json(path, meta.to_dict())
    return path


def read_run_json(path: Path) -> RunMeta:
    try:
        return RunMeta.from_dict(read_json(path))
    except ValueError as exc:
        raise ReportError(f"{path}: {exc}") from None


# ---------------------------------------------------------------------------- damaged files

_WS = re.compile(r"[ \t\n\r]*")


def _salvage_array(text: str, i: int, dec: json.JSONDecoder) -> list[Any]:
    """The complete elements of a JSON array cut short, from just after its ``[``."""
    out: list[Any] = []
    while True:
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return out
        out.append(value)
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] != ",":
            return out
        i += 1


def salvage_json_object(text: str) -> dict[str, Any]:
    """The members of a JSON object that are complete in *text*, a file cut short (a writer killed
    mid-write, as versions before atomic writes could be): every whole key/value up to the cut, and of
    a list cut short its whole elements. Nothing after the first damaged member is trusted."""
    dec = json.JSONDecoder()
    out: dict[str, Any] = {}
    i = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "{":
        return out
    i += 1
    while True:
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        try:
            key, i = dec.raw_decode(text, i)
        except ValueError:
            return out
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        if not isinstance(key, str) or text[i : i + 1] != ":":
            return out
        i = _WS.match(text, i + 1).end()  # type: ignore[union-attr]
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            if text[i : i + 1] == "[":
                out[key] = _salvage_array(text, i + 1, dec)
            return out
        out[key] = value
        i = _WS.match(text, i).end()  # type: ignore[union-attr]
        if text[i : i + 1] != ",":
            return out
        i += 1


_RECORD_ADAPTER = TypeAdapter(TestRecord)


def salvage_device_json(path: Path, device: str) -> tuple[DeviceRun, int]:
    """What a damaged ``device.json`` still holds: the device's facts when they are whole and valid,
    and every whole, valid record (an invalid one is skipped, not fatal). Returns the run and the
    number of records read; what is lost is for the plan to count (reports/plan.py)."""
    try:
        text = inputs.read_bytes(path, what="device.json", limit=inputs.MAX_JSON_BYTES).decode(
            "utf-8", errors="replace"
        )
    except inputs.InputError:
        text = ""
    data = salvage_json_object(text)
    raw = data.pop("records", [])
    data.pop("schema", None)
    data["device"] = device
    records: list[TestRecord] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            rec = _RECORD_ADAPTER.validate_python(item, strict=False)
        except (ValidationError, ValueError):
            continue
        if rec.device == device:
            records.append(rec)
    try:
        run = DeviceRun.from_dict({**data, "records": []})
    except ValueError:
        run = DeviceRun(device=device, arch=str(data.get("arch", "")) if isinstance(data.get("arch"), str) else "")
    run.records = records
    return run, len(records)

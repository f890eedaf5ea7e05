"""The nightly history: one SQLite file (``<DIR>/history.sqlite``) that outlives raw run directories.

Schema version 2 (``PRAGMA user_version``; docs/ci.md documents every table). A version 1 file is
migrated in place on open (version 2 added ``runs.faults``, so the trend can mark fault nights). Every write is one
``BEGIN IMMEDIATE`` transaction in WAL mode with a busy timeout, so two nightlies sharing a directory
queue behind each other instead of corrupting the file or failing on a lock.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bmoe_ci.reports.records import INFRA_GATE, DeviceRun, RunMeta

HISTORY_FILE = "history.sqlite"
SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 60_000
GREEDY_ENTRY = "greedy"  # the entry name of a device's reference output (summary.json `outputs`)

_SCHEMA = """
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    pool          TEXT NOT NULL,
    started       TEXT,
    finished      TEXT,
    git_commit    TEXT NOT NULL DEFAULT '',
    git_dirty     INTEGER NOT NULL DEFAULT 0,
    farm_sha256   TEXT NOT NULL DEFAULT '',
    results_dir   TEXT NOT NULL DEFAULT '',
    verdicts      INTEGER NOT NULL DEFAULT 1,
    recorded      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')),
    faults        TEXT NOT NULL DEFAULT ''
);
CREATE TABLE run_builds (
    run      TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    target   TEXT NOT NULL,
    build_id TEXT NOT NULL,
    compiled INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, target)
);
CREATE TABLE device_state (
    run             TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    device          TEXT NOT NULL,
    arch            TEXT NOT NULL DEFAULT '',
    in_pool         INTEGER NOT NULL DEFAULT 1,
    reached         INTEGER NOT NULL,
    infra_error     TEXT,
    engine_build_id TEXT NOT NULL DEFAULT '',
    engine_s        REAL NOT NULL DEFAULT 0,
    wall_s          REAL NOT NULL DEFAULT 0,
    facts           TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run, device)
);
CREATE TABLE results (
    run       TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    device    TEXT NOT NULL,
    arch      TEXT NOT NULL DEFAULT '',
    gate      TEXT NOT NULL,
    fixture   TEXT NOT NULL DEFAULT '',
    name      TEXT NOT NULL,
    outcome   TEXT NOT NULL CHECK (outcome IN ('pass', 'fail', 'error', 'skip')),
    duration  REAL NOT NULL DEFAULT 0,
    message   TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run, device, name)
);
CREATE TABLE outputs (
    run     TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    device  TEXT NOT NULL,
    fixture TEXT NOT NULL,
    entry   TEXT NOT NULL,
    sha256  TEXT NOT NULL,
    PRIMARY KEY (run, device, fixture, entry)
);
CREATE TABLE mutation_scores (
    run             TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    device          TEXT NOT NULL,
    arch            TEXT NOT NULL DEFAULT '',
    caught          INTEGER NOT NULL,
    total           INTEGER NOT NULL,
    PRIMARY KEY (run, device)
);
CREATE INDEX results_key ON results (device, gate, fixture);
CREATE INDEX runs_pool ON runs (pool, started);
"""

# version -> the statements that take a file of that version to the next one
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE runs ADD COLUMN faults TEXT NOT NULL DEFAULT ''",),
}


def _expected_columns() -> dict[str, set[str]]:
    """Table -> columns of :data:`_SCHEMA` (read off the schema text)."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"CREATE TABLE (\w+) \((.*?)\n\);", _SCHEMA, re.S):
        cols = {
            line.split()[0]
            for line in m.group(2).splitlines()
            if line.strip() and not line.strip().startswith("PRIMARY")
        }
        out[m.group(1)] = cols
    return out


def _columns_of_version(version: int) -> dict[str, set[str]]:
    """Table -> columns a bmoe-ci history of schema ``version`` has: :data:`_SCHEMA`'s, less what the
    migrations from ``version`` on add (read off their statements, so the two cannot drift apart)."""
    out = _expected_columns()
    for v in range(version, SCHEMA_VERSION):
        for statement in _MIGRATIONS[v]:
            if m := re.fullmatch(r"ALTER TABLE (\w+) ADD COLUMN (\w+) .*", statement, re.S):
                out[m.group(1)].discard(m.group(2))
            elif m := re.match(r"CREATE (?:TABLE|INDEX) (\w+)", statement):
                out.pop(m.group(1), None)
            else:  # pragma: no cover - a migration this check cannot read is a programming error
                raise AssertionError(f"history migration {v}: cannot tell what it adds: {statement}")
    return out


class HistoryError(Exception):
    """The history file cannot be used (newer schema, not a database); one line naming the file."""


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What the history keeps of one run (see :func:`run_record`)."""

    id: str
    pool: str
    started: str | None = None
    finished: str | None = None
    git_commit: str = ""
    git_dirty: bool = False
    farm_sha256: str = ""
    results_dir: str = ""
    verdicts: bool = True
    engine_builds: dict[str, str] = field(default_factory=dict)
    compiled: tuple[str, ...] = ()
    devices: tuple[DeviceRun, ...] = ()
    pool_devices: tuple[str, ...] = ()  # every device of the pool, reached or not
    mutation_scores: tuple[MutationScore, ...] = ()
    faults: tuple[str, ...] = ()  # engine faults built in (a fault night: never read as the real engine)


@dataclass(frozen=True, kw_only=True)
class MutationScore:
    device: str
    arch: str
    caught: int
    total: int


@dataclass(frozen=True, kw_only=True)
class ResultRow:
    """One (device, gate, fixture) outcome of one run, with the facts classification needs."""

    run: str
    started: str | None
    device: str
    arch: str
    gate: str
    fixture: str
    name: str
    outcome: str
    message: str
    engine_build_id: str


@dataclass(frozen=True, kw_only=True)
class DeviceRow:
    run: str
    device: str
    arch: str
    in_pool: bool
    reached: bool
    infra_error: str | None
    engine_build_id: str
    engine_s: float
    wall_s: float
    facts: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class OutputRow:
    run: str
    device: str
    arch: str
    fixture: str
    entry: str
    sha256: str
    engine_build_id: str


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """A run as the trend chart and the classification see it."""

    id: str
    pool: str
    started: str | None
    verdicts: bool
    engine_builds: dict[str, str]
    tests: int
    passed: int
    failed: int
    errors: int
    engine_s: dict[str, float]
    mutation: tuple[int, int] | None  # (caught, total) summed over devices, None when not measured
    faults: tuple[str, ...] = ()  # a fault night's injected faults (empty: the real engine)

    @property
    def rate(self) -> float | None:
        """The pass rate over what can pass: passed / (passed + failed + errors), skips left out (a
        test skipped by design, for a fixture it does not apply to, is not one that failed to pass);
        None when nothing ran."""
        ran = self.passed + self.failed + self.errors
        return self.passed / ran if ran else None


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One test on one device in one run: a point of its history."""

    run: str
    started: str | None
    outcome: str
    message: str
    engine_build_id: str
    faults: tuple[str, ...]


def gave_verdict(run: DeviceRun) -> bool:
    """A device was reached when it gave at least one verdict (pass or fail), or had no infrastructure
    error at all. One that failed preflight reports every test as an error: it was not reached."""
    return run.infra_error is None or any(r.outcome in ("pass", "fail") for r in run.records)


def device_facts(run: DeviceRun) -> dict[str, Any]:
    """The per-device facts the report shows: what preflight confirmed and what the session moved."""
    return {
        "os": run.os,
        "kind": run.kind,
        "target": run.target,
        "engine_build_id": run.engine_build_id,
        "pushed_bytes": run.pushed_bytes,
        "fixtures": len(run.fixtures),
        "started": run.started,
    }


def run_record(
    meta: RunMeta,
    devices: list[DeviceRun],
    *,
    pool: str,
    pool_devices: list[str] | None = None,
    git_commit: str = "",
    git_dirty: bool = False,
    farm_sha256: str = "",
    results_dir: str = "",
    verdicts: bool = True,
    mutation_scores: tuple[MutationScore, ...] = (),
    faults: tuple[str, ...] | None = None,
) -> RunRecord:
    """A :class:`RunRecord` from a results directory's contents (``load_results``)."""
    return RunRecord(
        id=meta.run,
        pool=pool,
        started=meta.started,
        finished=meta.finished,
        git_commit=git_commit,
        git_dirty=git_dirty,
        farm_sha256=farm_sha256,
        results_dir=results_dir,
        verdicts=verdicts,
        engine_builds=dict(meta.engine_builds),
        compiled=tuple(meta.compiled),
        devices=tuple(devices),
        pool_devices=tuple(pool_devices if pool_devices is not None else [d.device for d in devices]),
        mutation_scores=mutation_scores,
        faults=tuple(sorted(set(meta.faults if faults is None else faults) | {f for d in devices for f in d.faults})),
    )


class History:
    """The history store of one nightly directory. Use as a context manager or call :meth:`close`."""

    def __init__(self, directory: Path | str):
        self.path = Path(directory) / HISTORY_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise HistoryError(f"{self.path}: not a regular file (a symlink, a directory or a device)")
        self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # a damaged file, or another application's database, is refused here, before any gate runs
            checked = self.conn.execute("PRAGMA quick_check").fetchall()
            if checked != [("ok",)]:
                raise HistoryError(f"{self.path}: a damaged database ({'; '.join(str(r[0]) for r in checked[:3])})")
            self._check_ours()
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise HistoryError(f"{self.path}: not a usable history database: {exc}") from None
        except HistoryError:
            self.conn.close()
            raise

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the lock is taken at BEGIN, so concurrent writers queue (busy timeout)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _check_ours(self) -> None:
        """The file is empty, or a bmoe-ci history with every table and column its schema version has (an
        older version is then migrated in place): never another application's database, which bmoe-ci
        would otherwise write its tables into, nor a damaged one it would half-read."""
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if (version == 0 and not tables) or version > SCHEMA_VERSION:
            return  # new, or from a newer bmoe-ci (_migrate says so)
        expected = _columns_of_version(version) if version else {}  # an older history is migrated (_migrate)
        if version == 0 or not set(expected) <= tables:
            shown = ", ".join(sorted(tables)[:6]) or "no tables"
            raise HistoryError(
                f"{self.path}: not a bmoe-ci history (schema version {version}, tables {shown}); "
                "give --history a directory of its own"
            )
        for table, columns in expected.items():
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if not columns <= have:
                raise HistoryError(
                    f"{self.path}: table {table} lacks column(s) {', '.join(sorted(columns - have))}: "
                    f"not a bmoe-ci history of schema version {version}"
                )

    def _migrate(self) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == SCHEMA_VERSION:
                return
            if version > SCHEMA_VERSION:
                raise HistoryError(
                    f"{self.path}: schema version {version} is newer than this bmoe-ci ({SCHEMA_VERSION})"
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                return
            for v in range(version, SCHEMA_VERSION):  # in the same transaction: all of it or nothing
                for statement in _MIGRATIONS[v]:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # ------------------------------------------------------------------------ writing

    def record(self, run: RunRecord) -> None:
        """Store one run (replacing a run of the same id, e.g. a re-import), in one transaction."""
        reached = {d.device for d in run.devices}
        with self._write() as conn:
            conn.execute("DELETE FROM runs WHERE id = ?", (run.id,))
            conn.execute(
                "INSERT INTO runs (id, pool, started, finished, git_commit, git_dirty, farm_sha256, results_dir,"
                " verdicts, faults) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.id,
                    run.pool,
                    run.started,
                    run.finished,
                    run.git_commit,
                    int(run.git_dirty),
                    run.farm_sha256,
                    run.results_dir,
                    int(run.verdicts),
                    ",".join(run.faults),
                ),
            )
            conn.executemany(
                "INSERT INTO run_builds (run, target, build_id, compiled) VALUES (?, ?, ?, ?)",
                [(run.id, t, b, int(t in run.compiled)) for t, b in sorted(run.engine_builds.items())],
            )
            for dev in run.devices:
                conn.execute(
                    "INSERT INTO device_state (run, device, arch, in_pool, reached, infra_error, engine_build_id,"
                    " engine_s, wall_s, facts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run.id,
                        dev.device,
                        dev.arch,
                        int(dev.device in run.pool_devices),
                        int(gave_verdict(dev)),
                        dev.infra_error,
                        dev.engine_build_id,
                        dev.engine_s,
                        dev.wall_s,
                        json.dumps(device_facts(dev), sort_keys=True),
                    ),
                )
                conn.executemany(
                    "INSERT OR REPLACE INTO results (run, device, arch, gate, fixture, name, outcome, duration,"
                    " message) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            run.id,
                            dev.device,
                            dev.arch,
                            r.gate,
                            r.fixture or "",
                            r.name,
                            r.outcome,
                            r.duration_s,
                            r.message,
                        )
                        for r in dev.reported_records()
                    ],
                )
                conn.executemany(
                    "INSERT INTO outputs (run, device, fixture, entry, sha256) VALUES (?, ?, ?, ?, ?)",
                    [(run.id, dev.device, f, GREEDY_ENTRY, sha) for f, sha in sorted(dev.outputs.items())],
                )
            for name in run.pool_devices:
                if name not in reached:
                    conn.execute(
                        "INSERT INTO device_state (run, device, in_pool, reached, infra_error) VALUES (?, ?, 1, 0, ?)",
                        (run.id, name, "no results from this device"),
                    )
            conn.executemany(
                "INSERT INTO mutation_scores (run, device, arch, caught, total) VALUES (?, ?, ?, ?, ?)",
                [(run.id, m.device, m.arch, m.caught, m.total) for m in run.mutation_scores],
            )

    def forget_results_dir(self, run_id: str) -> None:
        """The raw directory of *run_id* was removed (retention); its rows stay."""
        with self._write() as conn:
            conn.execute("UPDATE runs SET results_dir = '' WHERE id = ?", (run_id,))

    # ------------------------------------------------------------------------ reading

    def run_ids(self, pool: str | None = None, *, before: str | None = None, limit: int | None = None) -> list[str]:
        """Run ids, oldest first, of *pool* (every pool when None), optionally only those started before
        run *before*, and only the last *limit* of them."""
        sql = "SELECT id FROM runs WHERE (? IS NULL OR pool = ?)"
        params: list[Any] = [pool, pool]
        if before is not None:
            sql += " AND (COALESCE(started, ''), id) < (SELECT COALESCE(started, ''), id FROM runs WHERE id = ?)"
            params.append(before)
        sql += " ORDER BY COALESCE(started, '') DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [r[0] for r in reversed(self.conn.execute(sql, params).fetchall())]

    def results(self, run_ids: list[str]) -> list[ResultRow]:
        marks = ",".join("?" * len(run_ids))
        rows = self.conn.execute(
            "SELECT r.run, runs.started, r.device, r.arch, r.gate, r.fixture, r.name, r.outcome, r.message,"
            " COALESCE(d.engine_build_id, '') FROM results r JOIN runs ON runs.id = r.run"
            " LEFT JOIN device_state d ON d.run = r.run AND d.device = r.device"
            f" WHERE r.run IN ({marks}) ORDER BY COALESCE(runs.started, ''), r.run, r.device, r.name",
            run_ids,
        ).fetchall()
        return [
            ResultRow(
                run=r[0],
                started=r[1],
                device=r[2],
                arch=r[3],
                gate=r[4],
                fixture=r[5],
                name=r[6],
                outcome=r[7],
                message=r[8],
                engine_build_id=r[9],
            )
            for r in rows
        ]

    def devices(self, run_id: str) -> list[DeviceRow]:
        rows = self.conn.execute(
            "SELECT run, device, arch, in_pool, reached, infra_error, engine_build_id, engine_s, wall_s, facts"
            " FROM device_state WHERE run = ? ORDER BY device",
            (run_id,),
        ).fetchall()
        return [
            DeviceRow(
                run=r[0],
                device=r[1],
                arch=r[2],
                in_pool=bool(r[3]),
                reached=bool(r[4]),
                infra_error=r[5],
                engine_build_id=r[6],
                engine_s=r[7],
                wall_s=r[8],
                facts=json.loads(r[9]),
            )
            for r in rows
        ]

    def outputs(self, run_ids: list[str]) -> list[OutputRow]:
        marks = ",".join("?" * len(run_ids))
        rows = self.conn.execute(
            "SELECT o.run, o.device, COALESCE(d.arch, ''), o.fixture, o.entry, o.sha256,"
            " COALESCE(d.engine_build_id, '') FROM outputs o"
            " LEFT JOIN device_state d ON d.run = o.run AND d.device = o.device"
            f" WHERE o.run IN ({marks}) ORDER BY o.run, o.device, o.fixture, o.entry",
            run_ids,
        ).fetchall()
        return [
            OutputRow(run=r[0], device=r[1], arch=r[2], fixture=r[3], entry=r[4], sha256=r[5], engine_build_id=r[6])
            for r in rows
        ]

    def run_summaries(self, run_ids: list[str]) -> list[RunSummary]:
        """Per run, in the order given: totals (the INFRA case counts as an error), engine time per
        device, mutation score."""
        out = []
        for rid in run_ids:
            row = self.conn.execute("SELECT pool, started, verdicts, faults FROM runs WHERE id = ?", (rid,)).fetchone()
            if row is None:
                continue
            counts = dict.fromkeys(("pass", "fail", "error", "skip"), 0)
            for outcome, n in self.conn.execute(
                "SELECT outcome, COUNT(*) FROM results WHERE run = ? GROUP BY outcome", (rid,)
            ):
                counts[outcome] = n
            builds = dict(self.conn.execute("SELECT target, build_id FROM run_builds WHERE run = ?", (rid,)))
            engine_s = dict(
                self.conn.execute(
                    "SELECT device, engine_s FROM device_state WHERE run = ? AND reached = 1 ORDER BY device", (rid,)
                )
            )
            mut = self.conn.execute(
                "SELECT SUM(caught), SUM(total), COUNT(*) FROM mutation_scores WHERE run = ?", (rid,)
            ).fetchone()
            out.append(
                RunSummary(
                    id=rid,
                    pool=row[0],
                    started=row[1],
                    verdicts=bool(row[2]),
                    engine_builds=builds,
                    tests=sum(counts.values()),
                    passed=counts["pass"],
                    failed=counts["fail"],
                    errors=counts["error"],
                    engine_s=engine_s,
                    mutation=(mut[0], mut[1]) if mut[2] else None,
                    faults=_faults(row[3]),
                )
            )
        return out

    def history_of(self, pool: str, names: list[str], run_ids: list[str]) -> dict[tuple[str, str], list[Outcome]]:
        """(device, test name) -> its outcomes in *run_ids* (runs of *pool*, oldest first), for the tests
        *names*: the history a report shows per test."""
        out: dict[tuple[str, str], list[Outcome]] = {}
        if not names or not run_ids:
            return out
        order = {rid: i for i, rid in enumerate(run_ids)}
        for chunk in _chunks(names):
            rows = self.conn.execute(
                "SELECT r.device, r.name, r.run, runs.started, r.outcome, r.message,"
                " COALESCE(d.engine_build_id, ''), runs.faults FROM results r JOIN runs ON runs.id = r.run"
                " LEFT JOIN device_state d ON d.run = r.run AND d.device = r.device"
                f" WHERE runs.pool = ? AND r.name IN ({','.join('?' * len(chunk))})",
                [pool, *chunk],
            ).fetchall()
            for device, name, run, started, outcome, message, build, faults in rows:
                if run in order:
                    out.setdefault((device, name), []).append(
                        Outcome(
                            run=run,
                            started=started,
                            outcome=outcome,
                            message=message,
                            engine_build_id=build,
                            faults=_faults(faults),
                        )
                    )
        for points in out.values():
            points.sort(key=lambda o: order[o.run])
        return out

    def last_passed(self, pool: str, names: list[str], before: str | None = None) -> dict[tuple[str, str], Outcome]:
        """(device, test name) -> the most recent run of *pool* in which it passed (before run *before*,
        when given: tonight's own pass is no news), over the whole history, not only the report's
        window."""
        out: dict[tuple[str, str], Outcome] = {}
        limit = ""
        params_tail: list[Any] = []
        if before is not None:
            limit = (
                " AND (COALESCE(runs.started, ''), runs.id) < (SELECT COALESCE(started, ''), id FROM runs WHERE id = ?)"
            )
            params_tail = [before]
        for chunk in _chunks(names):
            rows = self.conn.execute(
                "SELECT r.device, r.name, r.run, runs.started, r.message, COALESCE(d.engine_build_id, ''),"
                " runs.faults FROM results r JOIN runs ON runs.id = r.run"
                " LEFT JOIN device_state d ON d.run = r.run AND d.device = r.device"
                f" WHERE runs.pool = ? AND r.outcome = 'pass' AND r.name IN ({','.join('?' * len(chunk))}){limit}"
                " ORDER BY COALESCE(runs.started, ''), runs.id",
                [pool, *chunk, *params_tail],
            ).fetchall()
            for device, name, run, started, message, build, faults in rows:  # oldest first: the last one stays
                out[(device, name)] = Outcome(
                    run=run,
                    started=started,
                    outcome="pass",
                    message=message,
                    engine_build_id=build,
                    faults=_faults(faults),
                )
        return out

    def started(self, run_id: str) -> str | None:
        """When run *run_id* started (None when unknown or no such run): a nightly's date, for readers
        that judge how old a run's results are."""
        row = self.conn.execute("SELECT started FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row[0] if row else None

    def results_dir(self, run_id: str) -> str:
        row = self.conn.execute("SELECT results_dir FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row[0] if row else ""

    def git_commit(self, run_id: str) -> str:
        """The commit *run_id* tested ('' when unknown: not recorded, or imported without one)."""
        row = self.conn.execute("SELECT git_commit FROM runs WHERE id = ?", (run_id,)).fetchone()
        return row[0] if row else ""


def is_infra(gate: str) -> bool:
    return gate == INFRA_GATE


def _faults(text: str | None) -> tuple[str, ...]:
    return tuple(f for f in (text or "").split(",") if f)


def _chunks(names: list[str], size: int = 500) -> list[list[str]]:
    """*names* in pieces SQLite takes as one IN (...) list (it allows 999 parameters by default)."""
    unique = list(dict.fromkeys(names))
    return [unique[i : i + size] for i in range(0, len(unique), size)]

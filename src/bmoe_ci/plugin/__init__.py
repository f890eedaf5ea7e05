"""The pytest plugin of the gate suite (entry point `bmoe`).

    pytest gates --bmoe-device pixel8
    pytest gates --bmoe-device pool:nightly -n 4
    pytest gates --bmoe-device host -m g8b          # one gate, by its catalogue id

Options, ini keys and environment variables: plugin/options.py (every option is prefixed `--bmoe-`;
the short names are aliases only while no other plugin owns them). The plugin is inert unless the
session runs the gate suite (a path inside `gates/`, or `--bmoe-device` on the command line).
Then, on the controller only (session fixtures run once per xdist worker: docs/design.md, the gate
suite under pytest-xdist):
  * pytest_sessionstart  reads the farm file, the selection and the fixture specs, so that the tests
                         can be parametrised (all that happens under --collect-only, --fixtures and
                         --setup-plan);
  * once the tests are collected and selected (pytest_collection_finish without xdist; under xdist
    pytest_xdist_node_collection_finished, the workers having handed over the selected tests): builds,
    generates fixtures, leases/pushes/preflights the devices those tests need, only the fixtures they
    need (bmoe_ci.gaterun.prepare), and hands the prepared run to the workers as JSON;
  * pytest_runtest_logreport  turns each test's phases into one record per device;
  * pytest_sessionfinish  writes per-device JUnit, the merged JUnit and the summary, releases locks.
Tests are parametrised over (device, fixture) and grouped per device (`xdist_group`), so with
`--dist loadgroup` every test of one device runs on one worker, in order. What the controller tells
the user goes through one Progress object (bmoe_ci.gaterun.progress), to pytest's terminal reporter.

Everything that is not pytest lives in the gate run library, bmoe_ci.gaterun; this package only
adapts it to pytest's hooks, fixtures and reports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pydantic import TypeAdapter

from bmoe_ci.builder import BuildError
from bmoe_ci.farm import FarmError, InfraError, default_run_id
from bmoe_ci.faults import CatalogueError, load_catalogue
from bmoe_ci.gaterun.context import DeviceContext, GateRun
from bmoe_ci.gaterun.progress import Progress
from bmoe_ci.gaterun.runner import DeviceRunner
from bmoe_ci.gaterun.state import GateState, PlanNeeds, plan_line
from bmoe_ci.gaterun.suite import ENV_RUN_ID
from bmoe_ci.models import SpecError
from bmoe_ci.paths import Places
from bmoe_ci.plugin import options
from bmoe_ci.plugin.collect import RecordCollector, begin_run
from bmoe_ci.plugin.marks import mark_gate_item, normalize_markexpr, register_catalogue, xdev_fixtures
from bmoe_ci.plugin.options import GateOptions
from bmoe_ci.plugin.suite import pytest_load_initial_conftests  # noqa: F401 (`pytest gates` anywhere)
from bmoe_ci.reports.evidence import ARTIFACTS, safe_name
from bmoe_ci.reports.plan import PlannedTest
from bmoe_ci.reports.records import atomic_write, write_json

if TYPE_CHECKING:
    from bmoe_ci.gaterun.prepare import Prepared

RUN_KEY = pytest.StashKey[GateRun]()
STATE_KEY = pytest.StashKey["GateState"]()


def run_id_from(environ: Mapping[str, str]) -> str:
    """``$BMOE_CI_RUN_ID`` when set (it must be usable as a directory name), else a fresh run id."""
    given = environ.get(ENV_RUN_ID, "").strip()
    if not given:
        return default_run_id()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", given):
        raise pytest.UsageError(f"${ENV_RUN_ID} {given!r}: not usable as a run id (letters, digits, '.', '_', '-')")
    return given


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def _gate_suite_requested(config: pytest.Config, places: Places) -> bool:
    if options.given_on_command_line(config):
        return True
    try:
        gates = (places.source_tree() / "gates").resolve()
    except RuntimeError:
        return False
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0]).resolve()
        if path == gates or gates in path.parents:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gate(id): the gate catalogue id this test checks (docs/gates.md)")
    config.addinivalue_line(
        "markers",
        "entries(*ids, where=None): the entries of its fixture's plan a gate test reads (by id, or those "
        "where(id, argv) accepts); a gate test without it reads every entry",
    )
    register_catalogue(config)
    # the environment is read here, in the plugin's hook, and only passed down from here on
    places = Places.from_environ(os.environ)
    if not _gate_suite_requested(config, places):
        return
    if getattr(config.option, "markexpr", ""):  # `-m G8b`, as the catalogue spells it, is `-m g8b`
        config.option.markexpr = normalize_markexpr(config.option.markexpr)
    if getattr(config.option, "numprocesses", None):
        config.option.dist = "loadgroup"  # one device's tests on one worker, in order
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # xdist decided the worker's `loadgroup` flag from the command line before any plugin ran;
        # the controller schedules by group (set above), so the worker must tag node ids by group too.
        config.option.loadgroup = True
        config.stash[STATE_KEY] = GateState(
            GateRun.from_json(workerinput["bmoe_gate_run"]),
            places=places,
            prepared_file=Path(workerinput["bmoe_handoff"]) / PREPARED_JSON,
        )
    else:
        foreign = options.foreign_short_options(config)
        if foreign:
            names = ", ".join(foreign)
            raise pytest.UsageError(
                f"{names}: another installed plugin defines {'this option' if len(foreign) == 1 else 'these options'}"
                f" here, so the gate suite does not get it; use "
                + ", ".join(options.option(n.lstrip("-")) for n in foreign)
            )
        gate_options = options.from_config(config, os.environ)
        config.pluginmanager.register(Controller(config, gate_options, reporter_progress(config)), "bmoe-controller")


def reporter_progress(config: pytest.Config) -> Progress:
    """A Progress that writes to the config's terminal reporter (looked up when writing: it may be
    registered after this call), at the config's verbosity."""
    pluginmanager = config.pluginmanager
    return Progress(lambda: pluginmanager.get_plugin("terminalreporter"), int(config.get_verbosity()))


class Controller:
    """Controller-side hooks: prepare devices, ship the context to workers, collect, report."""

    def __init__(self, config: pytest.Config, opts: GateOptions, progress: Progress):
        self.config = config
        self.opts = opts
        self.progress = progress
        self.prepared: Prepared | None = None
        self.collector: RecordCollector | None = None
        self.started = time.monotonic()
        self.crashed: set[str] = set()  # node ids whose xdist worker was lost while running them
        self.came_from = ""
        self.handoff: Path | None = None  # files between this controller and its xdist workers
        self._prepare_done = False
        self.results = Path()
        self.run_id = ""
        self.faults: list[str] = []
        self.plans: dict[str, list[dict]] = {}  # device -> the plans its tests ran (bmoe.plans)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # tryfirst: xdist starts its workers in its own (trylast) pytest_sessionstart, and each worker
        # needs the prepared run (pytest_configure_node). Imported here: every pytest run loads this
        # plugin, and only a gate run needs the preparation (the builder, the fixtures, numpy)
        from bmoe_ci.gaterun.prepare import plan_only, results_dir_problem

        config, opts = self.config, self.opts
        run_id = run_id_from(os.environ)
        results = Path(opts.results or Path("results") / run_id).resolve()
        # bad options are refused before any device is touched
        problem = results_dir_problem(results)
        if problem:
            raise pytest.UsageError(f"{options.option('results')} {opts.results or results}: {problem}")
        if opts.lock_wait < 0:
            raise pytest.UsageError(f"{options.option('lock-wait')} {opts.lock_wait:g}: must be 0 or more seconds")
        try:
            # an unknown fault would build a normal engine and report it green: refuse it first
            faults = (
                [f.name for f in load_catalogue(places=opts.places).resolve(list(opts.faults))] if opts.faults else []
            )
        except CatalogueError as exc:
            # the catalogue names the option as `bmoe-ci mutants` spells it
            msg = str(exc)
            raise pytest.UsageError(
                options.option("fault") + msg[len("--fault") :] if msg.startswith("--fault ") else msg
            ) from exc
        origins = [
            f"{what} {value} from {where}"
            for what, value, where in (
                ("farm", opts.farm, opts.farm_from),
                ("devices", " ".join(opts.selectors), opts.selectors_from),
                ("fixtures", " ".join(opts.fixtures or ()), opts.fixtures_from),
            )
            if where not in ("command line", "default")
        ]
        # a setting the user did not type: say where it came from, and in any error it causes (under
        # -q the step line is not shown, and the error alone would not say why that farm or device)
        came_from = f" ({'; '.join(origins)})" if origins else ""
        self.came_from = came_from
        if origins:
            self.progress.step("; ".join(origins))
        if opts.fixtures:  # an unknown fixture is a usage error, said once, before anything is built
            from bmoe_ci.models import load_specs

            try:
                load_specs(places=opts.places).select(list(opts.fixtures))
            except SpecError as exc:
                raise pytest.UsageError(f"{options.option('fixture')}: {exc}{came_from}") from exc
        if results.is_dir() and not options.dry_run(config):
            # a directory used before: a run killed while preparing must not read as the earlier one
            begin_run(results, run_id)
        try:
            # the tests are parametrised over the selection; what they need is readied once they are
            # collected and selected (-k, -m), so that only that is built, leased and pushed
            run = plan_only(
                selectors=opts.selectors,
                farm_file=opts.farm,
                results_dir=results,
                run_id=run_id,
                fixture_names=opts.fixtures,
                faults=faults,
                progress=self.progress,
                places=opts.places,
                looking=options.dry_run(config),
            )
        except FarmError as exc:
            raise pytest.UsageError(f"{exc}{came_from}") from exc
        except SpecError as exc:
            pytest.exit(f"bmoe-ci: cannot prepare the gate run: {exc}", returncode=3)
        config.stash[RUN_KEY] = run
        if options.dry_run(config):
            return  # only looking at the tests: touch nothing
        self.results, self.run_id, self.faults = results, run_id, faults
        self.handoff = Path(tempfile.mkdtemp(prefix="bmoe-ci-run-"))
        config.stash[STATE_KEY] = GateState(run, places=opts.places)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Without xdist: the tests are collected and selected here; ready what they need."""
        if not _xdist_controller(self.config) and self.handoff is not None:
            self._prepare(planned_tests(session.items))

    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """Under xdist: the first worker to have collected wrote what the selected tests are (every worker
        collects the same); ready what they need before xdist hands out the first test."""
        if self.handoff is None or self._prepare_done:
            return
        path = self.handoff / PLANNED_JSON
        planned = _PLANNED.validate_json(path.read_bytes()) if path.is_file() else []
        self._prepare(planned)

    def _prepare(self, planned: list[PlannedTest]) -> None:
        from bmoe_ci.gaterun.prepare import prepare

        self._prepare_done = True
        if not planned:
            self.progress.notice("no gate test selected: nothing built, leased or pushed")
            return
        needs: dict[str, set[str]] = {}
        for t in planned:
            needs.setdefault(t.device, set()).update([t.fixture] if t.fixture else [])
        opts = self.opts
        try:
            self.prepared = prepare(
                selectors=opts.selectors,
                farm_file=opts.farm,
                results_dir=self.results,
                run_id=self.run_id,
                fixture_names=opts.fixtures,
                rebuild=opts.rebuild,
                faults=self.faults,
                lock_wait=opts.lock_wait,
                progress=self.progress,
                places=opts.places,
                needs=needs,
            )
        except FarmError as exc:
            pytest.exit(f"bmoe-ci: {exc}{self.came_from}", returncode=pytest.ExitCode.USAGE_ERROR)
        except (BuildError, SpecError) as exc:
            # Not a verdict on any device: the suite cannot start. Say why, without a traceback.
            pytest.exit(f"bmoe-ci: cannot prepare the gate run: {exc}", returncode=3)
        self.results.mkdir(parents=True, exist_ok=True)
        run = self.prepared.run
        self.config.stash[RUN_KEY] = run
        self.config.stash[STATE_KEY].set_prepared(run, self.prepared.sessions)
        if self.handoff is None:
            raise RuntimeError("bmoe-ci: no handoff directory: the gate run is prepared only by the controller")
        write_json(self.handoff / PREPARED_JSON, json.loads(run.to_json()))  # for the xdist workers
        ready = {d.name for d in run.devices}
        self.collector = RecordCollector(run, opts.absolute_attachments, [t for t in planned if t.device in ready])

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        if report.nodeid in self.crashed and report.when != "???":
            return "", "", ""  # xdist's second run of a test whose worker was lost: not a verdict, not counted
        # pytest counts a failed call phase as a failure: an infrastructure error is an error there too,
        # as in the JUnit files and the matrix
        if is_infra(report) and report.when in ("call", "???"):
            return "error", "E", "ERROR"
        return None

    def pytest_configure_node(self, node) -> None:
        node.workerinput["bmoe_gate_run"] = self.config.stash[RUN_KEY].to_json()
        node.workerinput["bmoe_handoff"] = str(self.handoff)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "???":  # xdist lost the worker running this test (and will run it again)
            self.crashed.add(report.nodeid)
        if self.collector is not None:
            self.collector.add(report)
        for key, value in report.user_properties:
            if key == "bmoe.plans":  # plans a test ran, here or on an xdist worker
                device = str(dict(report.user_properties).get("bmoe.device", "?"))
                for plan in json.loads(str(value)):
                    # one line per plan with -v, where pytest gives each test a line of its own too;
                    # at the normal verbosity a line here would cut pytest's line of dots in two, so
                    # the plans are summed up per device after the tests (plans_lines)
                    self.progress.detail(plan_line(device, plan))
                    self.plans.setdefault(device, []).append(plan)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.handoff is not None:
            shutil.rmtree(self.handoff, ignore_errors=True)
        if self.prepared is None or self.collector is None:
            return
        self.prepared.close()  # release every device lock, whatever happened
        width = self.config.get_terminal_writer().fullwidth
        xdev = xdev_fixtures(self.config, list(self.collector.run.fixtures))
        self.summary, verdict = self.collector.finish(time.monotonic() - self.started, width=width, xdev_fixtures=xdev)
        if verdict != 0 and session.exitstatus == pytest.ExitCode.OK:
            # a verdict derived from the results, not from a test of this session (XDEV), or a device
            # that recorded nothing: the run is not green
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        summary = getattr(self, "summary", None)
        if summary is not None:
            terminalreporter.write_sep("=", "bmoe-ci gate matrix")
            if self.progress.verbosity == 0:  # -v said each plan as it ended; -q says none
                for line in plans_lines(self.plans):
                    terminalreporter.write_line(line)
            terminalreporter.write_line(summary)


def plans_lines(plans: dict[str, list[dict]]) -> list[str]:
    """Per device, the engine plans its tests ran: ``plans: host 11 (264 entries), 13.2 s; the slowest
    trained 2.1 s``, and every plan that did not end well on a line of its own (plan_line)."""
    out = []
    for device, done in plans.items():
        entries = sum(int(p.get("entries", 0)) for p in done)
        seconds = sum(float(p.get("seconds", 0.0)) for p in done)
        slowest = max(done, key=lambda p: float(p.get("seconds", 0.0)))
        what = str(slowest.get("key", "")).removeprefix("fixture:")
        out.append(
            f"plans: {device} {len(done)} ({entries} entries), {seconds:.1f} s; "
            f"the slowest {what} {float(slowest.get('seconds', 0.0)):.1f} s"
        )
        out += [plan_line(device, p) for p in done if p.get("outcome", "ok") != "ok" or int(p.get("crashed", 0))]
    return out


#: What the controller and its xdist workers hand each other (in a directory of the controller's): the
#: selected tests, written by the workers once collected; the prepared run, written by the controller.
PLANNED_JSON = "planned.json"
PREPARED_JSON = "prepared.json"
_PLANNED = TypeAdapter(list[PlannedTest])


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def planned_tests(items: list[pytest.Item]) -> list[PlannedTest]:
    """The selected gate tests, as the run's plan lists them."""
    planned = []
    for item in items:
        props = {str(k): str(v) for k, v in item.user_properties if str(k).startswith("bmoe.")}
        if "bmoe.device" in props:
            planned.append(
                PlannedTest(
                    device=props["bmoe.device"],
                    gate=props["bmoe.gate"],
                    fixture=props.get("bmoe.fixture") or None,
                    name=props["bmoe.name"],
                    classname=props.get("bmoe.classname", "gates"),
                )
            )
    return planned


def plan_needs(items: list[pytest.Item]) -> dict[tuple[str, str], PlanNeeds]:
    """(device, fixture) -> the plan entries the selected tests read (their `entries` markers)."""
    needs: dict[tuple[str, str], PlanNeeds] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "device" not in callspec.params or "fixture" not in callspec.params:
            continue
        marker = item.get_closest_marker("entries")
        need = needs.setdefault((str(callspec.params["device"]), str(callspec.params["fixture"])), PlanNeeds())
        if marker is None:
            need.add(None)
        else:
            need.add(tuple(map(str, marker.args)), marker.kwargs.get("where"))
    return needs


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The selected tests, known now: which plan entries each device and fixture needs (for the `runs`
    fixture), and on an xdist worker what they are, for the controller (before this worker reports its
    collection: tryfirst)."""
    state = session.config.stash.get(STATE_KEY, None)
    if state is None or _xdist_controller(session.config):
        return
    state.needs = plan_needs(session.items)
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None:
        handoff = Path(workerinput["bmoe_handoff"])
        atomic_write(handoff / PLANNED_JSON, _PLANNED.dump_json(planned_tests(session.items)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE_KEY, None)
    if state is not None:
        state.close_worker_sessions()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash.get(STATE_KEY, None)
    run = state.run if state is not None else metafunc.config.stash.get(RUN_KEY, None)
    if run is None or "device" not in metafunc.fixturenames:
        return
    # the device by name: its context (engine and model paths) is the prepared run's, ready only once
    # the selected tests are known (the `device` fixture below)
    devices = run.devices
    if "fixture" in metafunc.fixturenames:
        params = [
            pytest.param(d.name, f, id=f"{d.name}-{f}", marks=pytest.mark.xdist_group(d.name))
            for d in devices
            for f in run.fixtures
        ]
        metafunc.parametrize(("device", "fixture"), params, indirect=["device"])
    else:
        params = [pytest.param(d.name, id=d.name, marks=pytest.mark.xdist_group(d.name)) for d in devices]
        metafunc.parametrize("device", params, indirect=True)


@pytest.fixture
def gate_state(request: pytest.FixtureRequest) -> GateState:
    state = request.config.stash.get(STATE_KEY, None)
    if state is None:
        pytest.fail("the gate suite was not prepared (run it as `pytest gates`)", pytrace=False)
    return state


@pytest.fixture
def device(gate_state: GateState, request: pytest.FixtureRequest) -> DeviceContext:
    """The device a test runs on, as the run prepared it."""
    return gate_state.device(str(request.param))


@pytest.fixture
def runner(gate_state: GateState, device: DeviceContext, request: pytest.FixtureRequest) -> Iterator[DeviceRunner]:
    """The device's engine runner; engine time spent for this test is recorded on the test."""
    r = gate_state.runner(device)
    yield r
    request.node.user_properties.append(("bmoe.engine_s", r.take_engine_seconds()))
    kernels = r.take_kernels()
    if kernels:  # the kernel paths the device's engine ran (the device's records name them)
        request.node.user_properties.append(("bmoe.kernels", ",".join(kernels)))
    plans = r.take_plans_done()
    if plans:  # for the controller's progress lines (it may be another process: xdist)
        request.node.user_properties.append(("bmoe.plans", json.dumps([p.to_json() for p in plans])))


#: What each test's phases gave (for the artifacts fixture's teardown)
PHASES_KEY = pytest.StashKey[dict[str, str]]()


@pytest.fixture
def artifacts(gate_state: GateState, device: DeviceContext, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory for this test's artifacts, its own: nothing else writes there (a gate writes there
    when it fails). Removed at its teardown when the test passed; otherwise what it left there is
    recorded on the test (paths relative to the device's results directory), so the reports link it from
    the failure (reports/evidence.py). The device's ``artifacts/`` directory, which every test of the
    device shares, is never removed by a test (another may be writing into it)."""
    device_dir = Path(gate_state.run.results_dir) / device.name
    path = device_dir / ARTIFACTS / safe_name(request.node.name)
    yield path
    if not path.is_dir() or path.is_symlink():
        return
    if request.node.stash.get(PHASES_KEY, {}).get("call") == "passed":
        shutil.rmtree(path, ignore_errors=True)
        return
    files = sorted(p.relative_to(device_dir).as_posix() for p in path.rglob("*") if p.is_file())
    if files:
        request.node.user_properties.append(("bmoe.artifacts", "\n".join(files)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Give each gate test its gate id's marker (`-m g8b`, `-k G8b`: plugin/marks.py), and label it with
    what the controller's records need (these cross xdist as user_properties): device, gate id,
    fixture, and the test case name used in JUnit."""
    mark_gate_item(item)
    marker = item.get_closest_marker("gate")
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None or "device" not in callspec.params:
        return
    gate = str(marker.args[0])
    sub = str(marker.args[1]) if len(marker.args) > 1 else ""
    fixture = callspec.params.get("fixture")
    label = fixture or callspec.params.get("case_id") or ""
    name = f"{gate}{'-' + sub if sub else ''}[{label}]" if label else f"{gate}{'-' + sub if sub else ''}"
    module = getattr(item, "module", None)
    item.user_properties.extend(
        [
            ("bmoe.device", str(callspec.params["device"])),
            ("bmoe.gate", gate),
            ("bmoe.fixture", fixture or ""),
            ("bmoe.name", name),
            ("bmoe.classname", module.__name__ if module is not None else "gates"),
        ]
    )


def full_tracebacks(config: pytest.Config) -> bool:
    """Did the user ask for tracebacks (``-v``, ``--tb=long``)? Otherwise an infrastructure error is
    reported as its one line."""
    return config.get_verbosity() > 0 or config.getoption("tbstyle", "auto") == "long"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.config.stash.get(STATE_KEY, None) is None:
        return report  # not a gate run: pytest's reports as they are
    item.stash.setdefault(PHASES_KEY, {})[report.when] = report.outcome
    if call.excinfo is not None and isinstance(infra := call.excinfo.value, InfraError):
        report.user_properties.append(("bmoe.infra", "1"))
        if not full_tracebacks(item.config):
            # one line naming device, step, kind and cause: the same for a test that called the engine in
            # its own body (CFG, DET, G8w, REF) as for one whose fixture did, and the same on every phase
            report.longrepr = infra.line()
    return report


def is_infra(report: pytest.TestReport) -> bool:
    """An infrastructure error: an InfraError in any phase, or a test whose xdist worker was lost."""
    return report.failed and (report.when == "???" or ("bmoe.infra", "1") in list(report.user_properties))

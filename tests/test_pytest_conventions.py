"""The gate suite's pytest conventions: prefixed options and their short aliases (never a crash beside
another plugin that owns a short name), ini keys and environment variables with their precedence,
one marker per gate id (-m / -k), --collect-only that touches nothing, and the progress lines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from bmoe_ci.plugin.marks import gate_markers, marker_name
from bmoe_ci.plugin.options import GateOptions, resolve
from gate_run import REPO, host_farm, run_gates

SRC = REPO / "src"


def _env(**extra: str) -> dict[str, str]:
    """The environment of a child pytest: this checkout's package first; no BMOE_FARM / BMOE_DEVICE
    from whoever runs the tests unless a test sets them."""
    env = {k: v for k, v in os.environ.items() if k not in ("BMOE_FARM", "BMOE_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _pytest(
    *args: str, env: dict[str, str] | None = None, python: str = sys.executable, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env or _env(),
    )


def _collected(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Node ids printed by `--collect-only -q`."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [ln for ln in proc.stdout.splitlines() if "::" in ln]


def _farm(tmp_path: Path, *names: str) -> Path:
    """A local farm file whose devices are called `names`, each with its own work directory."""
    base = host_farm(tmp_path).read_text()
    head, device = base.split("devices:\n", 1)
    text = (
        head
        + "devices:\n"
        + "".join(
            device.replace("name: host", f"name: {n}").replace(str(tmp_path / "work"), str(tmp_path / f"work-{n}"))
            for n in names
        )
    )
    path = tmp_path / f"farm-{'-'.join(names)}.yaml"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------- precedence


def test_precedence_is_command_line_then_environment_then_ini_then_default(tmp_path: Path) -> None:
    none: dict[str, object] = {}
    ini = {"bmoe_farm": "lab.yaml", "bmoe_device": ["pool:nightly"], "bmoe_fixture": ["gemma4"]}
    env = {"BMOE_FARM": "/env/farm.yaml", "BMOE_DEVICE": "pixel8,host  phone"}
    cli = {"farm": "cli.yaml", "device": ["host"], "fixture": ["qwen3moe"]}

    assert resolve(cli=none, environ={}, ini={}, ini_dir=None) == GateOptions()
    only_ini = resolve(cli=none, environ={}, ini=ini, ini_dir=tmp_path)
    assert only_ini.farm == str(tmp_path / "lab.yaml")  # relative to the ini file
    assert only_ini.selectors == ("pool:nightly",) and only_ini.fixtures == ("gemma4",)
    assert (only_ini.farm_from, only_ini.selectors_from) == ("ini bmoe_farm", "ini bmoe_device")
    with_env = resolve(cli=none, environ=env, ini=ini, ini_dir=tmp_path)
    assert with_env.farm == "/env/farm.yaml" and with_env.selectors == ("pixel8,host", "phone")
    assert with_env.fixtures == ("gemma4",)  # no environment variable for fixtures
    everything = resolve(cli=cli, environ=env, ini=ini, ini_dir=tmp_path)
    assert everything.farm == "cli.yaml" and everything.selectors == ("host",)
    assert everything.fixtures == ("qwen3moe",)
    # empty values are unset, and an absolute ini path stays as it is
    blank = resolve(
        cli={"device": []},
        environ={"BMOE_FARM": " ", "BMOE_DEVICE": ""},
        ini={"bmoe_farm": "/abs/farm.yaml"},
        ini_dir=tmp_path,
    )
    assert blank.farm == "/abs/farm.yaml" and blank.selectors == ("all",)


def test_ini_and_environment_choose_the_farm_and_devices_of_a_real_collection(tmp_path: Path) -> None:
    # three farms, one device each, so the collected ids say which farm and selection won
    ini_farm, env_farm, cli_farm = _farm(tmp_path, "alpha"), _farm(tmp_path, "beta"), _farm(tmp_path, "gamma")
    ini = tmp_path / "pytest.ini"
    ini.write_text(f"[pytest]\nbmoe_farm = {ini_farm.name}\nbmoe_fixture = qwen3moe\n")  # relative to pytest.ini
    base = ("gates/test_batch.py", "-c", str(ini), "--rootdir", str(REPO), "--collect-only", "-q")

    def ids(*args: str, **env: str) -> set[str]:
        return {n.split("[", 1)[1].rstrip("]") for n in _collected(_pytest(*base, *args, env=_env(**env)))}

    assert ids() == {"alpha-qwen3moe"}
    assert ids(BMOE_FARM=str(env_farm)) == {"beta-qwen3moe"}
    assert ids("--bmoe-farm", str(cli_farm), BMOE_FARM=str(env_farm)) == {"gamma-qwen3moe"}
    assert ids("--farm", str(cli_farm)) == {"gamma-qwen3moe"}  # the short alias, nothing else owns it
    two = _farm(tmp_path, "one", "two")
    assert ids("--bmoe-farm", str(two)) == {"one-qwen3moe", "two-qwen3moe"}
    assert ids("--bmoe-farm", str(two), BMOE_DEVICE="two") == {"two-qwen3moe"}
    ini.write_text(f"[pytest]\nbmoe_farm = {two}\nbmoe_device = one\n")
    assert ids("--bmoe-fixture", "gemma4") == {"one-gemma4"}
    assert ids("--bmoe-fixture", "gemma4", BMOE_DEVICE="two") == {"two-gemma4"}
    assert ids("--bmoe-fixture", "gemma4", "--device", "one,two", BMOE_DEVICE="two") == {"one-gemma4", "two-gemma4"}


# ------------------------------------------------------------------------------- --collect-only


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root: relative path -> (size, mtime in ns)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_collect_only_builds_leases_and_pushes_nothing(tmp_path: Path) -> None:
    farm = _farm(tmp_path, "host", "host2")
    cache, results = tmp_path / "cache", tmp_path / "results"
    env = _env(BMOE_CI_CACHE=str(cache))
    common = (
        "gates",
        "--bmoe-farm",
        str(farm),
        "--bmoe-device",
        "all",
        "--bmoe-results",
        str(results),
        "--bmoe-fixture",
        "qwen3moe",
        "--bmoe-fixture",
        "gemma4",
        "--bmoe-rebuild",
    )
    proc = _pytest(*common, "--collect-only", "-q", env=env)
    nodes = _collected(proc)
    params = {n.split("[", 1)[1].rstrip("]") for n in nodes if "[" in n}
    assert {"host-qwen3moe", "host-gemma4", "host2-qwen3moe", "host2-gemma4"} <= params, params
    assert len(nodes) > 40
    # the other modes that look at the tests without running them touch nothing either
    for mode in (("--fixtures",), ("--setup-plan", "-q"), ("--fixtures-per-test",), ("--markers",)):
        r = _pytest(*common, *mode, env=env)
        assert r.returncode == 0, (mode, r.stdout[-2000:] + r.stderr[-2000:])
    # no work directory (no lease, no store, no push), no results, no engine build, no fixture
    assert not (tmp_path / "work-host").exists() and not (tmp_path / "work-host2").exists()
    assert not results.exists()
    assert not (cache / "engine").exists() and not (cache / "fixtures").exists()
    assert not (cache / "farm-health.json").exists()


def test_collect_only_on_the_embedded_local_farm_leaves_its_devices_as_they_were(tmp_path: Path) -> None:
    from bmoe_ci.farm import load_farm_file
    from bmoe_ci.models import load_specs
    from bmoe_ci.standins import localfarm

    state = tmp_path / "farm"
    # a cache of the child's own: the shared one is written by the other workers' gate runs meanwhile
    cache = tmp_path / "cache"
    with localfarm.running(state) as farm_file:  # a local farm of the test's own: every transport
        farm = load_farm_file(farm_file)
        devices = state / "devices"
        before = _tree(devices)
        env = {**_env(), "BMOE_CI_STATE": str(state), "BMOE_CI_CACHE": str(cache)}
        nodes = _collected(_pytest("gates", "--bmoe-device", "all", "--collect-only", "-q", env=env))
        params = {n.split("[", 1)[1].rstrip("]") for n in nodes if "[" in n}
        fixtures = load_specs().defaults
        assert fixtures and {f"{d}-{f}" for d in farm.devices for f in fixtures} <= params
        assert _tree(devices) == before  # nothing pushed, no lease taken or renewed
        assert not list(devices.glob("*/.bmoe-ci-lock"))
        assert not (cache / "engine").exists() and not (cache / "fixtures").exists()  # nothing built or made


# ----------------------------------------------------------------------------------- gate markers


def test_marker_names_are_what_k_and_m_expressions_accept() -> None:
    assert marker_name("G8b") == "g8b" and marker_name("G8a'") == "g8a-prime"
    assert marker_name("BATCH-STDERR") == "batch-stderr"
    assert gate_markers("DET", "io-lanes") == ["det", "det-io-lanes"]


# Collects the gate suite several times in ONE process (pytest.main), each time recording the selected
# tests and their gate(...) arguments: the selection runs exactly as on the command line.
_SELECT = textwrap.dedent("""
    import json, sys
    import pytest

    class Probe:
        def __init__(self):
            self.items = {}
        def pytest_collection_finish(self, session):
            for item in session.items:
                m = item.get_closest_marker("gate")
                self.items[item.nodeid] = [str(a) for a in m.args] if m else []

    farm, selections = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    for key, extra in selections.items():
        probe = Probe()
        rc = pytest.main(["gates", "-p", "no:cacheprovider", "--collect-only", "-qq", "--strict-markers",
                          "--bmoe-farm", farm, "--bmoe-device", "all", "--bmoe-fixture", "qwen3moe",
                          "--bmoe-fixture", "gemma4", *extra], plugins=[probe])
        out[key] = {"rc": int(rc), "items": probe.items}
    print("SELECTED " + json.dumps(out))
""")


def test_gates_are_selected_by_their_id_with_m_and_k(tmp_path: Path) -> None:
    farm = _farm(tmp_path, "host", "host2")
    selections: dict[str, list[str]] = {"all": []}
    exact_k = ("G8b", "G5", "G2", "G8w", "CFG", "SCORE", "BATCH-STDERR", "INV")
    for gate in exact_k:
        selections[f"-k {gate}"] = ["-k", gate]
    selections["-k G8a"] = ["-k", "G8a"]
    ids = (
        "G1",
        "G2",
        "G5",
        "G8a",
        "G8a'",
        "G8b",
        "G8c",
        "G8d",
        "G8e",
        "G8w",
        "REPLAY",
        "INV",
        "CFG",
        "DET",
        "REF",
        "BATCH-STDERR",
        "SCORE",
        "TOK",
        "BAD-DATA",
    )
    for gate in ids:
        selections[f"-m {gate}"] = ["-m", marker_name(gate)]
    selections["-m det-kernels"] = ["-m", "det-kernels"]
    selections["-m g8b or g8c"] = ["-m", "g8b or g8c"]
    proc = subprocess.run(
        [sys.executable, "-c", _SELECT, str(farm), json.dumps(selections)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_env(),
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SELECTED ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(line[len("SELECTED ") :])
    for key, run in got.items():
        assert run["rc"] == 0, (key, run)  # --strict-markers accepted every marker

    everything: dict[str, list[str]] = got["all"]["items"]

    def of(gate: str, sub: str | None = None) -> set[str]:
        return {n for n, g in everything.items() if g and g[0] == gate and (sub is None or g[1:] == [sub])}

    def selected(key: str) -> set[str]:
        return set(got[key]["items"])

    assert {g[0] for g in everything.values() if g} == set(ids)  # every gate of the suite was checked
    for gate in ids:
        expected = of(gate)
        assert expected and selected(f"-m {gate}") == expected, gate
    for gate in exact_k:
        assert selected(f"-k {gate}") == of(gate), (gate, selected(f"-k {gate}") ^ of(gate))
    assert selected("-m det-kernels") == of("DET", "kernels") and len(of("DET", "kernels")) == 4
    assert selected("-m g8b or g8c") == of("G8b") | of("G8c")
    # -k matches substrings: G8a also selects G8a' (marker g8a-prime); -m g8a does not
    assert selected("-k G8a") == of("G8a") | of("G8a'")
    assert selected("-m G8a") == of("G8a")
    # on both devices and both fixtures
    params = {n.split("[", 1)[1].rstrip("]") for n in selected("-m G8b")}
    assert params == {"host-qwen3moe", "host-gemma4", "host2-qwen3moe", "host2-gemma4"}


# ------------------------------------------------------------------------- aliases and other plugins


def test_short_aliases_work_when_no_other_plugin_owns_them(tmp_path: Path) -> None:
    farm = _farm(tmp_path, "host", "host2")
    nodes = _collected(
        _pytest(
            "gates/test_batch.py",
            "--farm",
            str(farm),
            "--device",
            "host2",
            "--fixture",
            "gemma4",
            "--collect-only",
            "-q",
        )
    )
    assert [n.split("[", 1)[1] for n in nodes] == ["host2-gemma4]"]
    # mixed with the prefixed names: a repeatable option collects both
    nodes = _collected(
        _pytest(
            "gates/test_batch.py",
            "--farm",
            str(farm),
            "--device",
            "host",
            "--bmoe-device",
            "host2",
            "--bmoe-fixture",
            "gemma4",
            "--collect-only",
            "-q",
        )
    )
    assert sorted(n.split("[", 1)[1] for n in nodes) == ["host-gemma4]", "host2-gemma4]"]
    help_text = _pytest("gates", "--help").stdout
    assert "--bmoe-device=SEL" in help_text and "--device=SEL" in help_text and "alias of --bmoe-device" in help_text


_INDEX_UNREACHABLE = re.compile(
    r"Could not find a version that satisfies|No matching distribution found|NewConnectionError|"
    r"Temporary failure in name resolution|Network is unreachable|Failed to establish a new connection|"
    r"ConnectTimeout|ReadTimeout|ProxyError|SSLError",
)


@pytest.fixture(scope="module")
def playwright_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv seeing this interpreter's packages (pytest, the bmoe-ci plugin's dependencies) with
    pytest-playwright installed into it from the package index (no browsers)."""
    root = tmp_path_factory.mktemp("playwright-venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(root)
    python = str(root / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "pytest-playwright"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if pip.returncode != 0:
        tail = (pip.stdout + pip.stderr).strip()[-600:]
        if _INDEX_UNREACHABLE.search(pip.stdout + pip.stderr):
            pytest.skip(f"pip cannot reach the package index to install pytest-playwright: {tail}")
        pytest.fail(f"pip install pytest-playwright failed (exit {pip.returncode}): {tail}")
    return python


def test_pytest_help_works_beside_pytest_playwright(playwright_python: str, tmp_path: Path) -> None:
    plugins = subprocess.run(
        [playwright_python, "-c", "import pytest_playwright, bmoe_ci.plugin; print(bmoe_ci.plugin.__file__)"],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert plugins.returncode == 0 and plugins.stdout.strip().startswith(str(SRC)), plugins.stderr
    for args in (("--help",), ("gates", "--help")):
        r = _pytest(*args, python=playwright_python)
        assert r.returncode == 0, (args, r.stdout[-2000:] + r.stderr[-3000:])
        assert "--bmoe-device=SEL" in r.stdout and "--browser=" in r.stdout
        assert "--device=DEVICE" in r.stdout  # playwright's
        assert "alias of --bmoe-device" not in r.stdout  # the name is playwright's: no alias of ours
    # the gate suite runs with the prefixed names (aliases that nobody else owns still work) ...
    farm = _farm(tmp_path, "host", "host2")
    nodes = _collected(
        _pytest(
            "gates/test_batch.py",
            "--bmoe-farm",
            str(farm),
            "--bmoe-device",
            "host2",
            "--fixture",
            "qwen3moe",
            "--collect-only",
            "-q",
            python=playwright_python,
        )
    )
    assert [n.split("[", 1)[1] for n in nodes] == ["host2-qwen3moe]"]
    # ... and `--device` (playwright's here) is refused, instead of running on every device of the farm
    r = _pytest(
        "gates/test_batch.py", "--bmoe-farm", str(farm), "--device", "host2", "--collect-only", python=playwright_python
    )
    assert r.returncode == 4 and "use --bmoe-device" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


# ------------------------------------------------------------------------------------------ progress


def test_progress_lines_follow_the_verbosity(tmp_path: Path) -> None:
    farm = _farm(tmp_path, "host", "host2")
    det = ("gates/test_determinism.py",)
    normal = run_gates(
        tmp_path, farm=farm, device="all", modules=det, results=tmp_path / "r1", extra=("--verbosity=0",)
    )  # after run_gates' -q
    assert normal.returncode == 0, normal.output[-3000:]
    lines = [ln for ln in normal.output.splitlines() if ln.startswith("bmoe-ci: ")]
    text = "\n".join(lines)
    assert re.search(r"^bmoe-ci: build \S+-linux-musl: (cached|compiled), [\d.]+ s \(build \w+\)$", text, re.M), text
    assert re.search(r"^bmoe-ci: fixtures: qwen3moe (cached|generated) \([\d.]+ MiB\); [\d.]+ s$", text, re.M), text
    # new work directories: everything is uploaded (the engine, the fixture, the three scoring inputs, and
    # gate TOK's six vocabulary files and its texts)
    for device in ("host", "host2"):
        assert re.search(
            rf"^bmoe-ci: {device}: pushed [\d.]+ MiB in 12 of 12 files \([\d.]+ MiB/s, 0 already there\), "
            r"12 verified, [\d.]+ s$",
            text,
            re.M,
        ), text
        assert re.search(rf"^bmoe-ci: {device}: preflight ok, [\d.]+ s \(uname ", text, re.M), text
        # the plans are summed up per device after the tests, not said one by one among pytest's dots
        assert re.search(
            rf"^plans: {device} 1 \(\d+ entries\), [\d.]+ s; the slowest qwen3moe [\d.]+ s$", normal.output, re.M
        ), normal.output[-3000:]
    assert "plan of" not in normal.output, normal.output[-3000:]
    # the matrix fits pytest's terminal (80 columns here), sizes read as the progress lines give them
    tail = normal.output.split("bmoe-ci gate matrix", 1)[1].split("\noutputs: ", 1)[0]
    matrix = tail.split("\nbmoe-ci run ", 1)[1].splitlines()[1:]  # after the headline, a sentence
    assert matrix and max(map(len, matrix)) <= 80, "\n".join(matrix)
    assert re.search(r"^built: .*; pushed: [\d.]+ (MiB|KiB|B)$", normal.output, re.M), normal.output[-3000:]
    # pytest's line of dots for the module is whole: no line of ours cut it in two
    assert re.search(r"^gates/test_determinism\.py \.+ +\[100%\]$", normal.output, re.M), normal.output[-3000:]
    # quiet: one line for the whole preparation, none per step; warm devices push nothing
    quiet = run_gates(tmp_path, farm=farm, device="all", modules=det, results=tmp_path / "r2")  # -q
    assert quiet.returncode == 0, quiet.output[-3000:]
    lines = [ln for ln in quiet.output.splitlines() if ln.startswith("bmoe-ci: ")]
    assert len(lines) == 1 and re.match(
        r"bmoe-ci: 2 of 2 device\(s\) ready in [\d.]+ s: compiled \S+; "
        r"fixtures 0 made, 1 cached; pushed 0\.0 MiB$",
        lines[0],
    ), lines
    # with -v, each plan as it ends (pytest gives each test its own line too); under xdist the
    # controller prints each device's plan once, the workers nothing
    spread = run_gates(
        tmp_path, farm=farm, device="all", modules=det, results=tmp_path / "r3", extra=("--verbosity=1", "-n", "2")
    )
    assert spread.returncode == 0, spread.output[-3000:]
    plans = [ln for ln in spread.output.splitlines() if re.match(r"bmoe-ci: host2? x qwen3moe: plan of", ln)]
    assert len(plans) == 2, spread.output[-3000:]
    assert re.search(r"^bmoe-ci: host: push: all 12 files already on the device, 12 verified", spread.output, re.M)

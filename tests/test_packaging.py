"""Packaging: the wheel carries the source tree and runs the gate suite from any directory, with its
caches in the user's cache directory; `bmoe-ci --version` says where the code runs from; a second clone
is told when it runs the first one's code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bmoe_ci.builder import host_target
from bmoe_ci.paths import Places
from bmoe_ci.plugin.suite import _positional_indices, names_suite, rewrite_args

REPO = Path(__file__).resolve().parents[1]
WARNING = "bmoe-ci: warning:"  # the second-clone warning's prefix

# What the wheel must carry under bmoe_ci/_tree (setup.py's TREE), as files every one of which must be there.
TREE_FILES = (
    "engine/faults.toml",
    "fixtures/fixtures.yaml",
    "fixtures/trained/trained.gguf",
    "fixtures/trained/choices.jsonl",
    "devices/local.yaml",
    "gates/__init__.py",
    "gates/conftest.py",
    "gates/plan.py",
    "gates/data/score.txt",
)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would make a child import this checkout or use its caches."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER") and not k.startswith("BMOE_CI_")
    }
    env.update(extra)
    return env


def zig_global_cache() -> str:
    """Where zig keeps the libc it builds once per target (zig's own rule: $ZIG_GLOBAL_CACHE_DIR, else
    $XDG_CACHE_HOME/zig, else ~/.cache/zig). The end-to-end test moves HOME and XDG_CACHE_HOME; pinning
    zig to the cache it already has spares it a libc build of several minutes."""
    if os.environ.get("ZIG_GLOBAL_CACHE_DIR"):
        return os.environ["ZIG_GLOBAL_CACHE_DIR"]
    xdg = os.environ.get("XDG_CACHE_HOME")
    return str(Path(xdg) / "zig") if xdg else str(Path.home() / ".cache" / "zig")


def project_copy(dest: Path) -> Path:
    """The project's files (tracked, and new ones not ignored) copied to ``dest``: the wheel is built
    from what git would carry, and the build leaves nothing (build/, egg-info) in the checkout."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist): everything but the usual litter
        shutil.copytree(
            REPO,
            dest,
            ignore=shutil.ignore_patterns(".git", ".cache", "results", "build", "dist", "__pycache__", "*.egg-info"),
        )
        return dest
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _head() -> str | None:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built offline with the setuptools of this environment (the dev extra's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = project_copy(tmp / "src")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        # the copy has no .git: the builder says which commit it is (what a build from an sdist does)
        env=clean_env(BMOE_CI_COMMIT=_head() or ""),
    )
    assert proc.returncode == 0, (
        "building the wheel failed (it needs setuptools>=70.1 here, which the dev extra installs: "
        f"scripts/setup.sh):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )
    wheels = list((tmp / "dist").glob("bmoe_ci-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_carries_the_source_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = "bmoe_ci/_tree/"
    engine = sorted(p.name for p in (REPO / "engine" / "src").iterdir() if p.suffix in (".c", ".h"))
    assert engine and all(f"{tree}engine/src/{n}" in names for n in engine)
    assert all(tree + rel in names for rel in TREE_FILES), sorted(n for n in names if n.startswith(tree))
    built = json.loads(zipfile.ZipFile(wheel).read(tree + "build.json"))
    assert built["commit"] == _head(), built  # the commit it was built from (None outside git)
    gate_modules = sorted(p.name for p in (REPO / "gates").glob("test_*.py"))
    assert gate_modules and all(f"{tree}gates/{n}" in names for n in gate_modules)
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert not any(n.startswith(tree + "fixtures/train/") for n in names)  # the training scripts stay out
    assert "bmoe_ci/plugin/suite.py" in names and "bmoe_ci/origin.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]" in text and "bmoe = bmoe_ci.plugin" in text and "bmoe-ci = bmoe_ci.cli:main" in text


def _site_files(site: Path) -> set[str]:
    return {
        str(p.relative_to(site)) for p in (site / "bmoe_ci").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.skipif(
    shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists(),
    reason="needs Debian's openssh-server (scripts/setup.sh installs it)",
)
@pytest.mark.skipif(
    host_target().startswith("x86_64") and shutil.which("qemu-aarch64-static") is None,
    reason="needs Debian's qemu-user-static (scripts/setup.sh installs it)",
)
def test_the_installed_wheel_runs_the_gates_from_an_empty_directory(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
        timeout=300,
        env=clean_env(),
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    installed = _site_files(site)
    home, cache, empty = tmp_path / "home", tmp_path / "xdg-cache", tmp_path / "empty"
    for d in (home, cache, empty):
        d.mkdir()
    env = clean_env(
        HOME=str(home),
        XDG_CACHE_HOME=str(cache),
        ZIG_GLOBAL_CACHE_DIR=zig_global_cache(),
        PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    )

    def run(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(cmd), cwd=empty, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    version = run("bmoe-ci", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.count("\n") == 1 and "installed wheel" in version.stdout and str(site) in version.stdout
    head = _head()  # the commit it was built from, as a checkout's --version names its own
    assert f"installed wheel built from git {head[:12]}, " in version.stdout if head else "unknown" in version.stdout

    up = run("bmoe-ci", "farm", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        gates = run(
            str(python),
            "-m",
            "pytest",
            "gates",
            "--bmoe-device",
            "host",
            "--bmoe-fixture",
            "qwen3moe",
            "-q",
            "-p",
            "no:cacheprovider",
            timeout=1200,
        )
    finally:
        down = run("bmoe-ci", "farm", "down")
    out = gates.stdout + gates.stderr
    assert gates.returncode == 0, out[-4000:]
    assert " passed" in gates.stdout and "PASS" in gates.stdout, out[-4000:]
    assert down.returncode == 0, down.stdout + down.stderr
    assert WARNING not in gates.stderr, gates.stderr  # an empty directory is no checkout

    # the caches and the farm's state went to the user's cache directory, nothing into site-packages
    ours = cache / "bmoe-ci"
    assert list((ours / "engine" / host_target()).glob("*/bmoe")), sorted(ours.rglob("*"))[:20]
    assert list((ours / "fixtures").glob("qwen3moe*.gguf"))
    assert (ours / "farm" / "farm.json").is_file()
    assert _site_files(site) == installed
    assert not list(venv.rglob(".cache")) and not (site / "bmoe_ci" / "_tree" / "results").exists()
    assert list((empty / "results").glob("*/summary.json"))  # the results, where the user ran it


def _fake_checkout(root: Path, *, with_package: bool) -> Path:
    """A bmoe-ci checkout as far as bmoe_ci.origin can tell; with this tree's Python package if asked."""
    (root / "engine" / "src").mkdir(parents=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    if with_package:
        shutil.copytree(
            REPO / "src" / "bmoe_ci", root / "src" / "bmoe_ci", ignore=shutil.ignore_patterns("__pycache__")
        )
    else:
        (root / "src" / "bmoe_ci").mkdir(parents=True)
        (root / "src" / "bmoe_ci" / "__init__.py").write_text('__version__ = "0.0.0"\n')
    return root


def test_a_second_clone_is_told_it_runs_the_first_ones_code(tmp_path: Path) -> None:
    first = _fake_checkout(tmp_path / "first", with_package=True)
    second = _fake_checkout(tmp_path / "second", with_package=False)
    (second / "engine" / "src" / "deep").mkdir()
    env = clean_env(PYTHONPATH=str(first / "src"), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")

    def stderr_of(cwd: Path, *cmd: str) -> str:
        proc = subprocess.run(
            [sys.executable, *cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert proc.returncode in (0, 5), proc.stdout + proc.stderr  # 5: pytest found no tests
        return proc.stderr

    # the console script's code, from a subdirectory of the second clone
    err = stderr_of(second / "engine" / "src" / "deep", "-m", "bmoe_ci.cli", "--version")
    lines = [line for line in err.splitlines() if WARNING in line]
    assert len(lines) == 1, err
    assert f"checkout {second}" in lines[0] and f"checkout {first}" in lines[0]
    assert "pip install -e ." in lines[0] and f"PYTHONPATH={second / 'src'}" in lines[0]
    # the pytest plugin
    err = stderr_of(second, "-m", "pytest", "-p", "bmoe_ci.plugin", "-p", "no:cacheprovider", "--co", "-q")
    assert sum("warning: the working directory is in the checkout" in line for line in err.splitlines()) == 1, err
    assert f"checkout {first}" in err
    # in the first clone itself, and outside any checkout, nothing is said
    assert WARNING not in stderr_of(first, "-m", "bmoe_ci.cli", "--version")
    assert WARNING not in stderr_of(tmp_path, "-m", "bmoe_ci.cli", "--version")
    assert WARNING not in stderr_of(
        first, "-m", "pytest", "-p", "bmoe_ci.plugin", "-p", "no:cacheprovider", "--co", "-q"
    )


def test_version_names_the_checkout_and_its_commit(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bmoe_ci.cli", "--version"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(REPO / "src")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    from bmoe_ci import __version__

    assert proc.stdout.startswith(f"bmoe-ci {__version__} (checkout {REPO}, ")
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""
    if (REPO / ".git").exists() and shutil.which("git"):
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert f"git {head}" in proc.stdout


def test_only_a_missing_gates_path_argument_is_rewritten(tmp_path: Path) -> None:
    tree, cwd = tmp_path / "tree", tmp_path / "cwd"
    (tree / "gates").mkdir(parents=True)
    cwd.mkdir()
    args = ["-k", "gates", "gates", "gates/test_lossy.py::test_x", "gatesx", "tests", "-q"]
    positional = ["gates", "gates/test_lossy.py::test_x", "gatesx", "tests"]
    changes = rewrite_args(args, positional, cwd, tree)
    # index 1 (the value of -k) is offered too: the hook keeps only what pytest parses as a path
    assert changes == {1: str(tree / "gates"), 2: str(tree / "gates"), 3: f"{tree / 'gates' / 'test_lossy.py'}::test_x"}
    (cwd / "gates").mkdir()  # a project's own gates/ wins
    assert rewrite_args(args, positional, cwd, tree) == {}
    assert names_suite("gates/") and not names_suite("gatesx") and not names_suite("./gates")


def test_the_value_of_an_option_is_not_taken_for_the_suite(tmp_path: Path) -> None:
    from _pytest.config import get_config  # pytest's own parser, as the hook gets it

    parser = get_config()._parser
    args = ["-k", "gates", "gates", "-q"]
    namespace = parser.parse_known_args(args)
    candidates = rewrite_args(args, namespace.file_or_dir, tmp_path, REPO)
    assert sorted(candidates) == [1, 2]
    assert _positional_indices(parser, args, candidates, namespace) == {2: str(REPO / "gates")}


def test_user_cache_root_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert Places.from_environ({"XDG_CACHE_HOME": str(tmp_path)}).user_cache_root() == tmp_path / "bmoe-ci"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    relative = Places.from_environ({"XDG_CACHE_HOME": "relative/dir"})  # the XDG rule: ignored
    assert relative.user_cache_root() == tmp_path / "home" / ".cache" / "bmoe-ci"

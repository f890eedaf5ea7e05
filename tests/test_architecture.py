"""The package layering of src/bmoe_ci (docs/architecture.md, "Packages and arrows"), checked from the
source: every `import` (module level, inside functions, under TYPE_CHECKING) is parsed with ast.

A unit is a top-level package or module of bmoe_ci (`farm`, `builder`, ...; the `cli*` modules and every
package's `__main__` are the one unit `cli`). LAYERS lists them from low to high; a unit may import only
units of a LOWER layer (never one of its own layer, never a higher one), so the graph has no cycle and
no back arrow. A unit missing from LAYERS is an error too: a new package must be given its place.
Only the plugin may import pytest; and `bmoe-ci --help` must not load it (its import time is measured).
Inside every package the modules import each other without a cycle too (a sub-package counts as one
module of its parent). The stand-ins (whatever serves a device protocol: a listening socket) live in
`bmoe_ci.standins`, never in the farm; and each transport module is registered by an explicit import in
`farm/transports/__init__.py` and listed in its TRANSPORTS (no package scan at run time).
Only the entry points (the plugin, the command line) read the environment (`os.environ.get`,
`os.environ[...]`, `os.getenv`, `in os.environ`); copying it whole for a child process is not a read.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "bmoe_ci"

#: Low -> high. Each unit imports only units of lower layers.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the package root (its version), where things live, the recipe and type tables, reading input files
    ("bmoe_ci", "paths", "recipes", "weight_types", "inputs"),
    ("origin", "builder", "faults", "reference", "replay", "check_table", "vocabs", "baddata"),
    ("enginecheck", "models", "farm"),
    ("reports", "tokgate", "standins"),  # standins: the local farm's sshd/adbd/adb bring-up, above the farm it serves
    ("gaterun",),  # the gate run library: prepare, run the engine, run the suite
    ("ab", "mutants", "nightly"),
    ("release",),
    ("plugin", "cli"),  # the entry points: only they read the environment
)

#: Units that read the environment: the entry points, which hand what it says down as values.
ENVIRON_READERS = frozenset({"plugin", "cli"})

#: Units that may import pytest (everything else must work, and `bmoe-ci` start, without it).
PYTEST_USERS = frozenset({"plugin"})
PYTEST_MODULES = ("pytest", "_pytest")


@dataclass(frozen=True)
class Arrow:
    source: str  # unit
    target: str  # unit, or a third-party top-level module name
    where: str  # file:line of the import


def unit_of(module: str) -> str:
    """`bmoe_ci.farm.model` -> `farm`; `bmoe_ci.cli_farm` -> `cli`; `bmoe_ci` -> `bmoe_ci`."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    return "cli" if parts[1].startswith("cli") or parts[-1] == "__main__" else parts[1]


def _module_name(path: Path, root: Path) -> tuple[str, str]:
    """(module, package it resolves relative imports against) of a file under the package ``root``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads, its dots resolved against ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def arrows(root: Path) -> list[Arrow]:
    """Every import of the package at ``root``, as an arrow between units (third-party imports keep
    their top-level name as target)."""
    name = root.name
    out = []
    for path in sorted(root.rglob("*.py")):
        module, package = _module_name(path, root)
        source = unit_of(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                targets = [target]
                if target == name:  # `from bmoe_ci import farm` names a unit; `import __version__` the root
                    targets = [
                        f"{name}.{a.name}" if (root / a.name).exists() or (root / f"{a.name}.py").exists() else name
                        for a in node.names
                    ]
            where = f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"
            for t in targets:
                if t == name or t.startswith(name + "."):
                    out.append(Arrow(source, unit_of(t), where))
                else:
                    out.append(Arrow(source, t.split(".")[0], where))
    return out


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (or a unit importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def problems(
    found: Sequence[Arrow],
    layers: Sequence[Sequence[str]],
    units: Iterable[str],
    pytest_users: Iterable[str] = PYTEST_USERS,
) -> list[str]:
    """Every rule the arrows break, one line each (empty: the layering holds)."""
    level = {u: i for i, layer in enumerate(layers) for u in layer}
    out = [
        f"{u}: not in LAYERS (give the new package its place, and docs/architecture.md its arrows)"
        for u in sorted(set(units) - set(level))
    ]
    internal = [a for a in found if a.target in level or a.target in units]
    graph: dict[str, set[str]] = {}
    for a in internal:
        if a.source == a.target:
            continue
        graph.setdefault(a.source, set()).add(a.target)
        if a.source in level and a.target in level and level[a.target] >= level[a.source]:
            kind = "back arrow" if level[a.target] > level[a.source] else "arrow inside one layer"
            out.append(f"{a.where}: {kind} {a.source} -> {a.target}")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    allowed = set(pytest_users)
    out += [
        f"{a.where}: {a.source} imports {a.target} (only {', '.join(sorted(allowed))} may)"
        for a in found
        if a.target in PYTEST_MODULES and a.source not in allowed
    ]
    return out


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def environ_reads(root: Path) -> list[Arrow]:
    """Every place a module of ``root`` reads a variable of the environment (target: the unit's name)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        source = unit_of(_module_name(path, root)[0])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            read = (
                (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and (
                        (node.func.attr == "get" and _is_environ(node.func.value))
                        or (
                            node.func.attr == "getenv"
                            and isinstance(node.func.value, ast.Name)
                            and node.func.value.id == "os"
                        )
                    )
                )
                or (isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load))
                or (isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators))
            )
            if read:
                out.append(Arrow(source, "os.environ", f"{path.relative_to(root.parent)}:{node.lineno}"))
    return out


def environ_problems(reads: Sequence[Arrow], readers: Iterable[str] = ENVIRON_READERS) -> list[str]:
    allowed = set(readers)
    return [
        f"{r.where}: {r.source} reads the environment (only {', '.join(sorted(allowed))} may: pass a value down)"
        for r in reads
        if r.source not in allowed
    ]


def units_of(root: Path) -> set[str]:
    return {unit_of(_module_name(p, root)[0]) for p in root.rglob("*.py")}


def module_imports(root: Path) -> list[tuple[str, str, str]]:
    """Every import inside the package at ``root`` between two of its modules: (source module, target
    module, file:line). ``from P import X`` targets ``P.X`` when that is a module, else ``P``."""
    modules = {_module_name(p, root)[0] for p in root.rglob("*.py")}
    out = []
    for path in sorted(root.rglob("*.py")):
        module, package = _module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            for t in targets:
                while t and t not in modules:  # `import a.b.c` of a name, not a module: its module
                    t = t.rpartition(".")[0]
                if t:
                    out.append((module, t, f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}"))
    return out


def package_cycles(imports: Sequence[tuple[str, str, str]]) -> list[str]:
    """The import cycles inside each package: its modules and sub-packages (each one node) as a graph."""
    modules = {m for src, dst, _ in imports for m in (src, dst)}
    packages = {m.rpartition(".")[0] for m in modules if "." in m} | {
        m for m in modules if any(o.startswith(m + ".") for o in modules)
    }
    out = []
    for pkg in sorted(packages):

        def node(m: str, pkg: str = pkg) -> str | None:
            if m == pkg:
                return pkg
            if not m.startswith(pkg + "."):
                return None
            return pkg + "." + m[len(pkg) + 1 :].split(".")[0]

        graph: dict[str, set[str]] = {}
        for src, dst, _ in imports:
            if src.endswith(".__main__"):  # an entry point (unit `cli` of the layering): nothing imports it
                continue
            a, b = node(src), node(dst)
            if a is not None and b is not None and a != b:
                graph.setdefault(a, set()).add(b)
        out += [f"import cycle in {pkg}: {' -> '.join(c)}" for c in cycles(graph)]
    return out


def listeners(root: Path) -> list[Arrow]:
    """Every `X.listen(...)` call (a server socket: something that plays a device) of the package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "listen":
                out.append(Arrow(module, "listen", f"{path.relative_to(root.parent)}:{node.lineno}"))
    return out


def standin_problems(found: Sequence[Arrow], home: str = "bmoe_ci.standins") -> list[str]:
    return [
        f"{a.where}: {a.source} listens on a socket: a stand-in, whose place is {home}"
        for a in found
        if not (a.source == home or a.source.startswith(home + "."))
    ]


def transport_problems(package: Path) -> list[str]:
    """The transport modules of ``package`` (a module defining a class with a `name = "..."` that
    derives from Transport) each imported by name in its `__init__.py` and listed in its TRANSPORTS;
    and no package scan there (`pkgutil`, `importlib`)."""
    init = ast.parse((package / "__init__.py").read_text(encoding="utf-8"))
    imported = {
        (node.module, a.asname or a.name)
        for node in ast.walk(init)
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for a in node.names
    }
    listed: set[str] = set()
    for node in ast.walk(init):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == "TRANSPORTS" for t in targets) and node.value is not None:
            listed |= {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
    out = [
        f"{package.name}/__init__.py: imports {name} (transports are registered by name, not found by a scan)"
        for node in ast.walk(init)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
        if name.split(".")[0] in ("pkgutil", "importlib")
    ]
    for path in sorted(package.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for cls in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(cls, ast.ClassDef) or not any(
                isinstance(b, ast.Name) and b.id == "Transport" for b in cls.bases
            ):
                continue
            named = any(
                isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name" for t in st.targets)
                for st in cls.body
            )
            if not named:
                continue
            if (path.stem, cls.name) not in imported:
                out.append(f"{path.name}: transport {cls.name} is not imported by name in __init__.py")
            elif cls.name not in listed:
                out.append(f"{path.name}: transport {cls.name} is not listed in TRANSPORTS")
    return out


def test_no_package_has_an_import_cycle_inside() -> None:
    found = module_imports(SRC)
    assert ("bmoe_ci.farm.session", "bmoe_ci.farm.lock", "bmoe_ci/farm/session.py:16") in found  # it sees arrows
    assert package_cycles(found) == []


def test_the_package_cycle_check_fails_on_a_made_up_cycle(tmp_path: Path) -> None:
    root = tmp_path / "bmoe_ci"
    _write(
        root,
        {
            "__init__.py": "",
            "farm/__init__.py": "from .model import Device\n",
            "farm/model.py": "def f():\n    from .select import pick  # a lazy import closes the cycle\n",
            "farm/select.py": "from bmoe_ci.farm.model import Device\n",
            "farm/transports/__init__.py": "from .base import Transport\n",
            "farm/transports/base.py": "from ..session import s\n",
            "farm/session.py": "from .transports import Transport\n",
            "gaterun/__init__.py": "",
            "gaterun/a.py": "from bmoe_ci.farm import model\nfrom . import b\n",
            "gaterun/b.py": "from bmoe_ci.gaterun import a\n",
        },
    )
    found = package_cycles(module_imports(root))
    assert found == [
        "import cycle in bmoe_ci.farm: bmoe_ci.farm.model -> bmoe_ci.farm.select",
        "import cycle in bmoe_ci.farm: bmoe_ci.farm.session -> bmoe_ci.farm.transports",
        "import cycle in bmoe_ci.gaterun: bmoe_ci.gaterun.a -> bmoe_ci.gaterun.b",
    ], found


def test_only_the_standins_play_devices(tmp_path: Path) -> None:
    found = listeners(SRC)
    assert any(a.source == "bmoe_ci.standins.adbd" for a in found)  # the checker sees the stand-in adbd
    assert standin_problems(found) == []
    root = tmp_path / "bmoe_ci"
    _write(
        root,
        {
            "__init__.py": "",
            "farm/__init__.py": "",
            "farm/adbd.py": "import socket\ns = socket.socket()\ns.listen(1)\n",
        },
    )
    assert standin_problems(listeners(root)) == [
        "bmoe_ci/farm/adbd.py:3: bmoe_ci.farm.adbd listens on a socket: a stand-in, whose place is bmoe_ci.standins"
    ]


def test_transports_are_registered_by_import(tmp_path: Path) -> None:
    assert transport_problems(SRC / "farm" / "transports") == []
    pkg = tmp_path / "transports"
    _write(
        pkg,
        {
            "__init__.py": (
                "import pkgutil\nfrom .a import ATransport\nfrom .b import BTransport\nTRANSPORTS = (ATransport,)\n"
            ),
            "base.py": "class Transport:\n    pass\n",
            "a.py": "from .base import Transport\nclass ATransport(Transport):\n    name = 'a'\n",
            "b.py": "from .base import Transport\nclass BTransport(Transport):\n    name = 'b'\n",
            "c.py": "from .base import Transport\nclass CTransport(Transport):\n    name = 'c'\n",
            "helper.py": "from .base import Transport\nclass Shared(Transport):\n    pass\n",  # no name: no transport
        },
    )
    assert transport_problems(pkg) == [
        "transports/__init__.py: imports pkgutil (transports are registered by name, not found by a scan)",
        "b.py: transport BTransport is not listed in TRANSPORTS",
        "c.py: transport CTransport is not imported by name in __init__.py",
    ]


def test_the_packages_keep_their_layers() -> None:
    found = arrows(SRC)
    assert any(a.source == "gaterun" and a.target == "farm" for a in found)  # the parser sees arrows at all
    assert problems(found, LAYERS, units_of(SRC)) == []


def test_only_the_entry_points_read_the_environment(tmp_path: Path) -> None:
    reads = environ_reads(SRC)
    assert "plugin" in {r.source for r in reads}  # the checker sees the plugin's own reads
    assert environ_problems(reads) == []
    # and it can fail: each way of reading, in a unit that may not
    root = tmp_path / "bmoe_ci"
    _write(
        root,
        {
            "__init__.py": "",
            "paths.py": "import os\nA = os.environ.get('A')\nB = os.getenv('B')\n",
            "farm/x.py": "import os\nC = os.environ['C']\nD = 'D' in os.environ\nE = dict(os.environ)\n",
            "cli.py": "import os\nF = os.environ.get('F')\n",
        },
    )
    found = environ_problems(environ_reads(root))
    assert [p.split(":")[0] + ":" + p.split(":")[1] for p in found] == [
        "bmoe_ci/farm/x.py:2",
        "bmoe_ci/farm/x.py:3",
        "bmoe_ci/paths.py:2",
        "bmoe_ci/paths.py:3",
    ], found  # a copy for a child process (dict(os.environ)) and the command line's own read pass


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_finds_back_arrows_cycles_strays_and_pytest(tmp_path: Path) -> None:
    """The same check on a made-up package that breaks each rule once: each break is reported."""
    root = tmp_path / "bmoe_ci"
    _write(
        root,
        {
            "__init__.py": "",
            "paths.py": "",
            "farm/__init__.py": "from .session import x\n",
            "farm/session.py": "def f():\n    from bmoe_ci.gaterun import runner  # a lazy back arrow\n",
            "gaterun/__init__.py": "",
            "gaterun/runner.py": "from ..farm import session\nimport pytest\n",
            "nightly/__init__.py": "from bmoe_ci import mutants\n",
            "mutants/__init__.py": "from bmoe_ci.nightly import x\n",
            "stray.py": "from bmoe_ci import __version__\n",
            "cli.py": "import pytest\n",
        },
    )
    layers = (("bmoe_ci", "paths"), ("farm",), ("gaterun",), ("nightly", "mutants"), ("cli",))
    found = problems(arrows(root), layers, units_of(root), pytest_users={"cli"})
    text = "\n".join(found)
    assert "farm/session.py:2: back arrow farm -> gaterun" in text, text
    assert "import cycle: farm -> gaterun" in text, text
    assert "arrow inside one layer nightly -> mutants" in text and "import cycle: mutants -> nightly" in text, text
    assert "stray: not in LAYERS" in text, text
    assert "gaterun/runner.py:2: gaterun imports pytest" in text, text
    assert not any("cli imports pytest" in p or "stray ->" in p for p in found), text  # allowed ones pass
    # and the real layering, read backwards, is all back arrows
    assert problems(arrows(SRC), tuple(reversed(LAYERS)), units_of(SRC))


def loaded_modules(importtime_stderr: str) -> set[str]:
    """The modules `python -X importtime` reports as imported."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name)
    return names


def _importtime(*args: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return loaded_modules(proc.stderr)


def _pytest_modules(names: Iterable[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in PYTEST_MODULES)


def test_bmoe_ci_help_loads_no_pytest() -> None:
    loaded = _importtime("-m", "bmoe_ci.cli", "--help")
    # `-m` runs bmoe_ci.cli as __main__; the modules of its commands are imported by name
    assert {"bmoe_ci.cli_farm", "bmoe_ci.mutants.command", "bmoe_ci.nightly.cli", "bmoe_ci.release.cli"} <= loaded
    assert _pytest_modules(loaded) == []
    # the measurement can fail: a process that does load pytest is seen to
    assert "pytest" in _pytest_modules(_importtime("-c", "import pytest"))


# ---- engine/src: the C modules' include graph ------------------------------------------------------
#
# A module of engine/src is a file stem: foo.c and foo.h are one module. Its edges are the modules of
# the headers it includes with `#include "..."` (its own header is no edge; every include counts,
# under #ifdef too). The graph must have no cycle, so each module can be read, tested and moved with
# what it includes and nothing that includes it. And the tokenizer's parts (the encoders, the
# end-of-generation set, the chat templates, the vocabulary they share) never reach tokenizer.h: the
# loader calls them, they do not call back.

ENGINE_SRC = REPO / "engine" / "src"
_C_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.MULTILINE)

#: Modules that must not reach `tokenizer` through the include graph.
TOKENIZER_PARTS = ("tok_vocab", "tok_bpe", "tok_spm", "tok_eog", "tok_heap", "chat", "pretok", "unicode")


@dataclass(frozen=True)
class Include:
    source: str  # module
    target: str  # module
    where: str  # file:line of the #include


def c_includes(src: Path) -> list[Include]:
    """Every `#include "..."` of the .c and .h files directly in ``src``, as an edge between modules
    (a header that is not in ``src`` is an edge to a module that does not exist: reported)."""
    out = []
    for path in sorted([*src.glob("*.c"), *src.glob("*.h")]):
        text = path.read_text(encoding="utf-8")
        for m in _C_INCLUDE.finditer(text):
            target = Path(m.group(1)).stem
            if target != path.stem:
                line = text.count("\n", 0, m.start()) + 1
                out.append(Include(path.stem, target, f"{path.name}:{line}"))
    return out


def c_modules(src: Path) -> set[str]:
    return {p.stem for p in [*src.glob("*.c"), *src.glob("*.h")]}


def _reaches(graph: Mapping[str, Iterable[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v == goal:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return False


def include_problems(
    edges: Sequence[Include], modules: Iterable[str], no_reach: Mapping[str, Sequence[str]] | None = None
) -> list[str]:
    """Includes of a header that is not there, include cycles (each with the includes that close it),
    and modules that reach one they must not (``no_reach``: target -> the modules kept off it)."""
    known = set(modules)
    graph: dict[str, set[str]] = {m: set() for m in known}
    out = []
    for e in edges:
        if e.target not in known:
            out.append(f"{e.where}: includes {e.target}.h, which engine/src does not have")
            continue
        graph[e.source].add(e.target)
    for component in cycles(graph):
        inside = set(component)
        closing = sorted(e.where for e in edges if e.source in inside and e.target in inside)
        out.append(f"include cycle: {' -> '.join(component)} ({', '.join(closing)})")
    for target, sources in (no_reach or {}).items():
        reach = [s for s in sources if s in graph and _reaches(graph, s, target)]
        out += [f"{s} reaches {target} through its includes" for s in reach]
    return out


def test_engine_src_has_no_include_cycle() -> None:
    edges = c_includes(ENGINE_SRC)
    assert len(edges) > 100  # the graph was read
    modules = c_modules(ENGINE_SRC)
    assert set(TOKENIZER_PARTS) | {"tokenizer", "engine", "engine_scoring", "scoring"} <= modules
    assert include_problems(edges, modules, {"tokenizer": TOKENIZER_PARTS}) == []


def test_the_include_checker_finds_cycles_missing_headers_and_call_backs(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "a.h": '#include "b.h"\n',
            "a.c": '#include "a.h"\n',  # its own header: no edge
            "b.h": "",
            "b.c": '#include "b.h"\n#ifdef X\n#include "c.h"\n#endif\n',  # under #ifdef: still an edge
            "c.h": "#include <stdio.h>\n",  # a system header: no edge
            "c.c": '  #  include "a.h"\n#include "gone.h"\n',
            "tokenizer.h": '#include "vocab.h"\n',
            "vocab.h": "",
            "tok_x.c": '#include "tokenizer.h"\n',
            "tok_y.c": '#include "vocab.h"\n',
        },
    )
    found = include_problems(c_includes(tmp_path), c_modules(tmp_path), {"tokenizer": ("tok_x", "tok_y")})
    text = "\n".join(found)
    assert "include cycle: a -> b -> c (a.h:1, b.c:3, c.c:1)" in text, text
    assert "c.c:2: includes gone.h, which engine/src does not have" in text, text
    assert "tok_x reaches tokenizer through its includes" in text, text
    assert len(found) == 3, text  # tok_y, the system header and a.c's own header pass
    # a two-module cycle through the headers alone is one too
    (tmp_path / "vocab.h").write_text('#include "tok_y.h"\n', encoding="utf-8")
    (tmp_path / "tok_y.h").write_text('#include "vocab.h"\n', encoding="utf-8")
    text = "\n".join(include_problems(c_includes(tmp_path), c_modules(tmp_path)))
    assert "include cycle: tok_y -> vocab (tok_y.c:1, tok_y.h:1, vocab.h:1)" in text, text

"""One marker per gate id, so gates are selected by their catalogue id: `pytest gates -m g8b`,
`pytest gates -k G8b`.

A gate test says which gate it checks with `@pytest.mark.gate("G8b")` (or `gate("DET", "kernels")`);
the plugin adds the id's own marker to it at collection (:func:`gate_markers`), and registers those
markers so that `--strict-markers` accepts them. Marker names are the ids in lower case with what
pytest's -k/-m expressions cannot parse replaced: `G8b` -> `g8b`, `BATCH-STDERR` -> `batch-stderr`,
`G8a'` -> `g8a-prime`; a sub-gate gets the gate's marker and its own (`det` and `det-kernels`).

`-m` matches marker names exactly. `-k` matches any substring of any keyword of a test (marker
names, the test's name, its module's, its parameters), case-insensitively: `-k G8a` also selects
G8a' (`g8a-prime`), and `-k REF` also selects tests whose names contain "ref" (`test_prefetch_...`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from bmoe_ci.reports.summary import GATE_ORDER
from bmoe_ci.reports.xdev import XDEV_GATE

if TYPE_CHECKING:
    from _pytest.mark.expression import ExpressionMatcher  # the -k matcher's protocol; no public name


def marker_name(gate_id: str) -> str:
    name = gate_id.strip().lower().replace("'", "-prime")
    # -k/-m identifiers: word characters and : + - . [ ] \ / ; keep a conservative subset
    return re.sub(r"[^a-z0-9_-]+", "-", name).strip("-")


_KEYWORDS = frozenset({"and", "or", "not"})


def normalize_markexpr(expr: str) -> str:
    """A ``-m`` expression with the catalogue's gate ids written as their markers, in any case: ``G8b`` is
    ``g8b``, ``REF or G8a'`` is ``ref or g8a-prime``, ``DET-kernels`` is ``det-kernels``. Other markers
    are left as they are (pytest matches those exactly)."""
    gates = {marker_name(g) for g in GATE_ORDER}

    def one(m: re.Match[str]) -> str:
        word = m.group(0)
        if word.lower() in _KEYWORDS:
            return word
        name = marker_name(word)
        if name in gates or (name.split("-", 1)[0] in gates and name.split("-", 1)[0] != name):
            return name
        return word

    return re.sub(r"[A-Za-z0-9_'.\-]+", one, expr)


def gate_markers(gate: str, sub: str = "") -> list[str]:
    """The markers a test of gate `gate` (sub-gate `sub`) carries besides `gate(...)`."""
    base = marker_name(gate)
    return [base, f"{base}-{marker_name(sub)}"] if sub else [base]


def _describe(name: str, label: str) -> str:
    return f"{name}: the tests of gate {label} (docs/gates.md); added from gate(...) by the bmoe plugin"


def register_catalogue(config: pytest.Config) -> None:
    """Register the marker of every gate id of the catalogue (what `pytest --markers` lists)."""
    for gate in GATE_ORDER:
        config.addinivalue_line("markers", _describe(marker_name(gate), gate))


def _registered(config: pytest.Config) -> set[str]:
    return {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}


def mark_gate_item(item: pytest.Item) -> None:
    """Add the gate-id markers to a test carrying `gate(...)`; a gate id the catalogue does not list yet
    (a new gate, a sub-gate) is registered on the way, so --strict-markers never refuses it."""
    marker = item.get_closest_marker("gate")
    if marker is None or not marker.args:
        return
    gate = str(marker.args[0])
    sub = str(marker.args[1]) if len(marker.args) > 1 else ""
    registered = _registered(item.config)
    for name in gate_markers(gate, sub):
        if name not in registered:
            item.config.addinivalue_line("markers", _describe(name, f"{gate}-{sub}" if sub else gate))
        if item.get_closest_marker(name) is None:
            item.add_marker(name)


def _keyword_matcher(names: set[str]) -> ExpressionMatcher:
    """A -k matcher: a keyword matches when it is a substring of one of *names* (case-insensitive)."""

    def match(key: str, /, **kwargs: str | int | bool | None) -> bool:
        return not kwargs and any(key.lower() in n.lower() for n in names)

    return match


def xdev_fixtures(config: pytest.Config, fixtures: list[str]) -> list[str] | None:
    """The fixtures whose XDEV verdict the session's selection keeps, as if XDEV[fixture] were a test
    with the marker `xdev` and that name: `-m g8b` keeps none (nobody asked for XDEV), `-k qwen3moe`
    keeps qwen3moe's, no -m/-k keeps every one (None). XDEV is no test of the session (reports/xdev.py
    derives it over the devices), so pytest's own selection never sees it."""
    from _pytest.mark.expression import Expression  # the -m/-k grammar; pytest has no public API for it

    markexpr = str(getattr(config.option, "markexpr", "") or "")
    keyword = str(getattr(config.option, "keyword", "") or "")
    if not markexpr and not keyword:
        return None
    gate = marker_name(XDEV_GATE)

    def has_mark(mark: str, /, **kwargs: str | int | bool | None) -> bool:
        return mark == gate and not kwargs

    kept = []
    for fixture in fixtures:
        names = {f"{XDEV_GATE}[{fixture}]", gate}
        try:
            by_mark = not markexpr or Expression.compile(markexpr).evaluate(has_mark)
            by_key = not keyword or Expression.compile(keyword).evaluate(_keyword_matcher(names))
        except Exception:  # pytest refused the expression already; no XDEV rather than a second error
            return []
        if by_mark and by_key:
            kept.append(fixture)
    return kept


__all__ = ["gate_markers", "mark_gate_item", "marker_name", "normalize_markexpr", "register_catalogue", "xdev_fixtures"]

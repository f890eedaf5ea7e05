"""Device selection: the ``--device`` syntax.

A selection is one or more expressions (``--device`` is repeatable); each expression is a comma list of
terms, and the result is the union of every term, in farm-file order, without duplicates:

=================  =====================================================
``NAME``           the device called NAME
``pool:NAME``      every device of the pool NAME
``arch:ARCH``      every device of that arch (``arm64`` means ``aarch64``)
``label:X``        every device carrying label X
``kind:K``         ``kind:phone`` or ``kind:desktop``
``os:OS``          every device with that ``os``
``all``            every device of the farm
=================  =====================================================

Every term must match at least one device: an unknown name lists the known names, an unknown pool lists
the pools, and a selector that matches nothing says so. An empty selection is an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .errors import SelectionError
from .model import SELECTOR_FIELDS, Device, Farm, match_selector


def _suggest(word: str, choices: Iterable[str]) -> str:
    hits = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{hits[0]}'?)" if hits else ""


def select_devices(farm: Farm, specs: str | Iterable[str] | None) -> list[Device]:
    """Resolve ``--device`` expressions against ``farm`` (see the module docstring for the syntax)."""
    if specs is None:
        specs = []
    elif isinstance(specs, str):
        specs = [specs]
    chosen: set[str] = set()
    terms = [t.strip() for spec in specs for t in str(spec).split(",")]
    if not terms:
        raise SelectionError("no device selected (use --device NAME, pool:NAME, arch:ARCH, label:X or all)")
    known = ", ".join(farm.devices)
    for term in terms:
        if not term:
            raise SelectionError(f"empty term in device selection {', '.join(specs)!r}")
        prefix, sep, value = term.partition(":")
        if term == "all":
            hits = list(farm.devices)
        elif sep and prefix == "pool":
            if value not in farm.pools:
                pools = ", ".join(farm.pools) or "(the farm defines no pools)"
                raise SelectionError(f"unknown pool '{value}'{_suggest(value, farm.pools)}; pools: {pools}")
            hits = list(farm.pools[value])
        elif sep and prefix in SELECTOR_FIELDS:
            if not value:
                raise SelectionError(f"'{term}': missing value after '{prefix}:'")
            hits = [d.name for d in farm.devices.values() if match_selector(d, prefix, value)]
            if not hits:
                have = sorted(
                    {str(getattr(d, prefix)) for d in farm.devices.values()}
                    if prefix != "label"
                    else {lb for d in farm.devices.values() for lb in d.labels}
                )
                raise SelectionError(
                    f"'{term}' matches no device (values of {prefix} in this farm: {', '.join(have) or '(none)'})"
                )
        elif sep:
            raise SelectionError(
                f"unknown selector '{prefix}:' in '{term}' (use NAME, pool:, "
                f"{', '.join(s + ':' for s in SELECTOR_FIELDS)} or all)"
            )
        else:
            if term not in farm.devices:
                raise SelectionError(f"unknown device '{term}'{_suggest(term, farm.devices)}; known devices: {known}")
            hits = [term]
        chosen.update(hits)
    if not chosen:
        raise SelectionError("the selection is empty")
    return [d for name, d in farm.devices.items() if name in chosen]

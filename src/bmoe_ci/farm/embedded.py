"""The embedded local farm as the farm sees it: where its resolved farm file is (what
:func:`bmoe_ci.farm.load_farm` reads by default). :mod:`bmoe_ci.standins.localfarm` brings it up."""

from __future__ import annotations

from pathlib import Path

from bmoe_ci.paths import Places

from .errors import FarmNotUp

FARM_FILE = "farm.yaml"


def state_dir(places: Places | None = None) -> Path:
    """``$BMOE_CI_STATE`` as the entry point read it, else ``farm/`` under the local root
    (``<checkout>/.cache/bmoe-ci`` in a checkout, the user's cache directory for a wheel install)."""
    return (places or Places()).state_dir()


def farm_file(state: Path | None = None, places: Places | None = None) -> Path:
    """The resolved farm file of the local farm; :class:`FarmNotUp` if ``up`` never ran."""
    path = (state or state_dir(places)) / FARM_FILE
    if not path.is_file():
        raise FarmNotUp(f"the embedded local farm is not up ({path} missing): run `bmoe-ci farm up`")
    return path

"""Where things live: the source tree (engine sources, fixture specs, the local farm template, the gate
suite), and the writable directories for caches and the local farm's state.

Nothing here reads the environment. An entry point (the `bmoe-ci` command line, the pytest plugin)
turns it into a :class:`Places` value once, with :meth:`Places.from_environ`, and hands that down; a
function called without one uses ``Places()``, the defaults with no override. The gate runs that
`bmoe-ci nightly`, `bmoe-ci mutants` and the project's tests start as subprocesses are entry points of
their own: they inherit the environment and read it the same way.

The source tree is, in this order:

* ``$BMOE_CI_REPO`` when set (a checkout, or any directory laid out like one);
* the checkout the package is imported from (``src/bmoe_ci`` of a checkout: an editable install, or
  ``PYTHONPATH=src``);
* the copy packed into the wheel under ``bmoe_ci/_tree`` (see setup.py) when the package is installed
  from a wheel.

Nothing is ever written into the packaged copy: without a checkout, caches and the farm state go to
``$XDG_CACHE_HOME/bmoe-ci`` (default ``~/.cache/bmoe-ci``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_REPO = "BMOE_CI_REPO"
ENV_CACHE = "BMOE_CI_CACHE"
ENV_STATE = "BMOE_CI_STATE"
ENV_XDG_CACHE = "XDG_CACHE_HOME"
# the folder of the wheel that holds the packaged source tree (filled by setup.py's build hook)
PACKAGED_TREE = "_tree"


def package_dir() -> Path:
    """The directory of the imported ``bmoe_ci`` package."""
    return Path(__file__).resolve().parent


def is_checkout(path: Path) -> bool:
    """``path`` looks like a bmoe-ci checkout (the packaged copy has no pyproject.toml)."""
    return (path / "pyproject.toml").is_file() and (path / "engine" / "src").is_dir()


def own_checkout() -> Path | None:
    """The checkout the imported package lives in (``<checkout>/src/bmoe_ci``), or None for a wheel."""
    pkg = package_dir()
    root = pkg.parent.parent
    # Only the src layout counts: a venv created inside some checkout must not make a wheel install
    # look like that checkout.
    if pkg.parent.name == "src" and is_checkout(root):
        return root
    return None


def packaged_tree() -> Path | None:
    """The source tree packed into the wheel, or None (a checkout has none)."""
    tree = package_dir() / PACKAGED_TREE
    return tree if (tree / "engine" / "src").is_dir() else None


@dataclass(frozen=True)
class Places:
    """The settings of where things live, as an entry point read them (None: not set)."""

    repo: Path | None = None  # $BMOE_CI_REPO: the source tree to use instead of our own
    cache: Path | None = None  # $BMOE_CI_CACHE: builds, fixtures, farm health
    state: Path | None = None  # $BMOE_CI_STATE: the embedded local farm's state
    xdg_cache_home: Path | None = None  # $XDG_CACHE_HOME (absolute only: the XDG rule ignores a relative one)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Places:
        """The places an environment asks for (``os.environ`` at an entry point)."""

        def path(name: str) -> Path | None:
            value = environ.get(name, "")
            return Path(value).expanduser().resolve() if value else None

        xdg = environ.get(ENV_XDG_CACHE, "")
        return cls(
            repo=path(ENV_REPO),
            cache=Path(environ[ENV_CACHE]) if environ.get(ENV_CACHE) else None,
            state=path(ENV_STATE),
            xdg_cache_home=Path(xdg) if xdg and Path(xdg).is_absolute() else None,
        )

    def source_tree(self) -> Path:
        """The tree holding engine/, fixtures/, devices/ and gates/: ``$BMOE_CI_REPO``, else the checkout
        the package runs from, else the wheel's packaged copy."""
        if self.repo is not None:
            return self.repo
        tree = own_checkout() or packaged_tree()
        if tree is None:
            raise RuntimeError(
                f"cannot find the bmoe-ci source tree (engine/src) beside {package_dir()}: "
                f"set {ENV_REPO} to a checkout, or reinstall the wheel"
            )
        return tree

    def checkout(self) -> Path | None:
        """The source tree when it is a checkout (where results and caches may go, and git can be asked),
        None when it is the wheel's packaged copy."""
        try:
            tree = self.source_tree()
        except RuntimeError:
            return None
        return tree if is_checkout(tree) else None

    def user_cache_root(self) -> Path:
        """``$XDG_CACHE_HOME/bmoe-ci``, else ``~/.cache/bmoe-ci``."""
        return (self.xdg_cache_home or Path.home() / ".cache") / "bmoe-ci"

    def local_root(self) -> Path:
        """The default root of caches and local state: ``<checkout>/.cache/bmoe-ci`` when running from a
        checkout, else the user's cache directory (never the packaged tree in site-packages)."""
        tree = self.checkout()
        return tree / ".cache" / "bmoe-ci" if tree is not None else self.user_cache_root()

    def cache_dir(self) -> Path:
        """Build and fixture cache: ``$BMOE_CI_CACHE``, else :meth:`local_root` (created)."""
        path = self.cache or self.local_root()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def state_dir(self) -> Path:
        """The local farm's state: ``$BMOE_CI_STATE``, else ``farm/`` under :meth:`local_root`."""
        return self.state or self.local_root() / "farm"

"""What the gate suite tells the person watching it (through pytest's terminal reporter, when the plugin
runs it: bmoe_ci.plugin.reporter_progress).

One Progress object is made by the controller and handed down as a value (to the preparation, the
device sessions, the record collector); nothing prints on its own. Three kinds of line:

  * step    one line per step (a build, the fixtures, a device's push, its preflight, a device's plan
            for a fixture): shown at pytest's normal verbosity and above, not under -q;
  * detail  what happens inside a step (each file pushed, a fixture being generated): only with -v;
  * notice  something the user must know whatever the verbosity (a device unavailable or skipped,
            waiting for another run's lease, a stale lease broken, a corrupted file re-pushed);
  * milestone  a line shown under -q too (not -qq): a target starting to compile.

Under -q the controller adds one `summary` line at the end of the preparation instead of the steps.
xdist workers get no Progress: their plan timings reach the controller as test report properties.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Protocol, TextIO


class _Reporter(Protocol):
    def write(self, content: str, **markup: bool) -> None: ...

    def write_line(self, line: str, **markup: bool) -> None: ...


PREFIX = "bmoe-ci: "


class Progress:
    """Lines to the terminal reporter (or to `stream` when pytest runs without one), by verbosity.

    Devices are prepared from threads and the lease heartbeat runs in the background: writes are
    serialised so that lines never interleave."""

    def __init__(
        self, reporter: Callable[[], _Reporter | None] | None = None, verbosity: int = 0, stream: TextIO | None = None
    ):
        self._reporter = reporter or (lambda: None)
        self.verbosity = verbosity
        self._stream = stream
        self._lock = threading.Lock()

    @property
    def quiet(self) -> bool:
        return self.verbosity < 0

    def step(self, msg: str) -> None:
        if self.verbosity >= 0:
            self._write(msg)

    def detail(self, msg: str) -> None:
        if self.verbosity > 0:
            self._write(msg)

    def notice(self, msg: str) -> None:
        self._write(msg)

    def milestone(self, msg: str) -> None:
        """A line worth its place even under -q (one per compiled target: a cold build takes minutes);
        not under -qq."""
        if self.verbosity >= -1:
            self._write(msg)

    def summary(self, msg: str) -> None:
        """The one line a quiet run prints for its preparation (the steps said it otherwise)."""
        if self.verbosity == -1:
            self._write(msg)

    def _write(self, msg: str) -> None:
        with self._lock:
            reporter = self._reporter()
            if reporter is not None:
                # The reporter ends a line of test results it knows it started (ensure_newline), but not
                # xdist's bare progress dots: end those too, or this line would be glued to them.
                ensure_newline = getattr(reporter, "ensure_newline", None)
                if callable(ensure_newline):
                    ensure_newline()
                if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):
                    reporter.write("\n")
                reporter.write_line(PREFIX + msg)
            else:
                stream = self._stream or sys.stderr
                print(PREFIX + msg, file=stream, flush=True)


__all__ = ["Progress"]

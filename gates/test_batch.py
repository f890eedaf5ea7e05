"""BATCH-STDERR: `bmoe batch` writes nothing to stderr (docs/engine.md: a batch carries everything,
warnings and errors included, in its JSON lines). A tool driving the engine on a phone reads stdout
only; a line on stderr is output it never sees, and a sign of a code path that forgot it was in a batch.

The check reads the stderr of the batch process that ran the fixture's plan (every entry of the plan,
the lossy knobs' warning entries among them). Entries that crashed are left to the gates that depend
on them: a dying process may legitimately leave a message behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from gates.compare import save


@pytest.mark.gate("BATCH-STDERR")
def test_batch_keeps_stderr_empty(runs: dict[str, EngineResult], artifacts: Path) -> None:
    noisy = {entry: r for entry, r in runs.items() if r.crashed is None and r.stderr}
    if noisy:
        save(artifacts, **noisy)
        entry, r = next(iter(noisy.items()))
        first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else repr(r.stderr[:40])
        raise AssertionError(
            f"bmoe batch wrote {len(r.stderr)} bytes to stderr (plan entry {entry} among "
            f"{len(noisy)}), first line: {first[:200]} (artifacts in {artifacts})"
        )

"""Expert streaming (docs/design.md, expert memory): the streamed modes produce the resident reference's bytes.

G1  --mmap (resident)            == streamed, cache off
G2  streamed, cache off          == streamed through a cache that evicts all the time
G5  streamed with prefetch (sync) == streamed, and the prefetch was really used
DET-io-lanes  1 I/O lane == 4 I/O lanes, output and counters, with and without the cache

Each identity also checks the counters that prove the compared run did what it claims (a gate that
cannot fail is a defect): the cache-off stream read every routed expert, the evicting cache both hit
and evicted, the prefetch issued reads that were then used."""

from __future__ import annotations

from pathlib import Path

import pytest

from bmoe_ci.gaterun.engine import EngineResult
from gates.compare import assert_identical, check, counters


@pytest.mark.gate("G1")
@pytest.mark.entries("ref", "stream")
def test_mmap_equals_streamed_cache_off(runs: dict[str, EngineResult], artifacts: Path) -> None:
    ref, stream = runs["ref"], runs["stream"]
    assert_identical(ref, stream, "mmap", "stream", artifacts)
    c = counters(stream)
    check(
        c["experts_routed"] > 0 and c["experts_routed"] == counters(ref)["experts_routed"],
        f"routed experts differ: mmap {counters(ref)['experts_routed']}, stream {c['experts_routed']}",
        artifacts,
        mmap=ref,
        stream=stream,
    )
    check(
        c["cache_misses"] == c["experts_routed"] and c["cache_hits"] == 0 and c["flash_reads"] > 0,
        f"with the cache off every routed expert must be read: {c}",
        artifacts,
        stream=stream,
    )
    check(
        counters(ref)["flash_reads"] == 0,
        f"--mmap must read no expert through the streamer: {counters(ref)}",
        artifacts,
        mmap=ref,
    )


@pytest.mark.gate("G2")
@pytest.mark.entries("stream", "stream-evict")
def test_cache_off_equals_evicting_cache(runs: dict[str, EngineResult], artifacts: Path) -> None:
    stream, evict = runs["stream"], runs["stream-evict"]
    assert_identical(stream, evict, "cache_off", "evicting_cache", artifacts)
    c = counters(evict)
    model = evict.data["model"]
    distinct = len(model["moe_layers"]) * model["n_expert"]
    check(
        c["cache_hits"] > 0 and c["cache_hits"] + c["cache_misses"] == c["experts_routed"],
        f"the cache served no hit, or hits + misses != routed: {c}",
        artifacts,
        evicting_cache=evict,
    )
    # more reads than there are experts: some expert was evicted and read again
    check(
        c["flash_reads"] > distinct,
        f"the cache never evicted ({c['flash_reads']} reads for {distinct} experts): the gate would prove "
        "nothing about eviction",
        artifacts,
        evicting_cache=evict,
    )


@pytest.mark.gate("G5")
@pytest.mark.entries("stream", "stream-prefetch")
def test_prefetch_equals_streamed(runs: dict[str, EngineResult], artifacts: Path) -> None:
    stream, pre = runs["stream"], runs["stream-prefetch"]
    assert_identical(stream, pre, "stream", "prefetch", artifacts)
    c = counters(pre)
    check(
        c["prefetch_used"] > 0 and c["prefetch_used"] <= c["prefetch_issued"],
        f"the prefetch was not demonstrably used: issued {c['prefetch_issued']}, used {c['prefetch_used']}",
        artifacts,
        prefetch=pre,
    )


@pytest.mark.gate("DET", "io-lanes")
@pytest.mark.entries("stream", "stream-lanes4", "stream-evict", "stream-evict-lanes4")
def test_one_vs_four_io_lanes(runs: dict[str, EngineResult], artifacts: Path) -> None:
    for one, four in (("stream", "stream-lanes4"), ("stream-evict", "stream-evict-lanes4")):
        assert_identical(runs[one], runs[four], one, four, artifacts)
        a, b = counters(runs[one]), counters(runs[four])
        check(
            a == b,
            f"counters depend on the I/O lane count: {one} {a} vs {four} {b}",
            artifacts,
            **{one: runs[one], four: runs[four]},
        )

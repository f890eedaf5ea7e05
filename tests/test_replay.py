"""The replay model (bmoe_ci.replay) against the real engine, and the replay's own teeth.

* every decision and counter of real runs is predicted exactly, across the cache, prefetch, the drop
  rule (renormalised or not, at other widths) and substitution, on normalised, scaled and
  unnormalised fixtures;
* a trace or a counter changed in one place is a mismatch naming the field and both values;
* the LRU model: refresh on hit, pins, speculative inserts that never go over budget;
* substitution: the rule re-run on the recorded scores predicts every executed expert, flag and
  count, at two margins on three fixtures; a flipped flag or a changed score is named;
* a malformed trace is one error naming file:line:key; the configuration is read from the argv.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from bmoe_ci.replay import RunConfig, TraceError, mismatches, parse_trace, replay
from bmoe_ci.replay.cache import LruCache

PROMPT = "The quick brown fox"
EVICTING = ("--cache-mb", "2", "--force-cache")
CONFIGS = {
    "cache-off": (),
    "evicting": EVICTING,
    "prefetch2": (*EVICTING, "--prefetch", "2", "--prefetch-sync"),
    "drop": (*EVICTING, "--drop-cold-experts", "1.0"),
    "drop-norenorm-k3": (*EVICTING, "--drop-cold-experts", "1.0", "--drop-no-renorm", "--n-expert-used", "3"),
    "subst": (*EVICTING, "--expert-substitute", "1.0"),
    "all-prefetch-drop-subst": (
        *EVICTING,
        "--prefetch",
        "3",
        "--prefetch-sync",
        "--drop-cold-experts",
        "0.75",
        "--expert-substitute",
        "0.3",
    ),
    "topk-all-1mib": ("--cache-mb", "1", "--force-cache", "--n-expert-used", "8", "--prefetch", "2", "--prefetch-sync"),
}


def traced_result(binary: Path, model: Path, tmp_path: Path, *args: str, n: int = 24) -> tuple[list[str], dict, str]:
    """(argv, the result JSON, the route trace's text)."""
    trace = tmp_path / "trace.csv"
    argv = ["run", "-m", str(model), "-p", PROMPT, "-n", str(n), "--json", *args, "--route-trace", str(trace)]
    proc = subprocess.run([str(binary), *argv], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return argv, json.loads(proc.stdout), trace.read_text()


def traced_run(binary: Path, model: Path, tmp_path: Path, *args: str, n: int = 24) -> tuple[list[str], dict, str]:
    argv, data, text = traced_result(binary, model, tmp_path, *args, n=n)
    return argv, data["counters"], text


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("name", ["qwen3moe", "gemma4", "qwen3moe-nonorm", "qwen3moe-q4k"])
def test_replay_predicts_every_decision_and_counter(
    engine_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str, config: str
) -> None:
    """qwen3moe-q4k is llama.cpp's Q4_K_M mix: its layers' experts differ in size, so each layer's
    slot and reads are its own."""
    argv, data, text = traced_result(engine_bin, fixtures[name], tmp_path, *CONFIGS[config])
    counters = data["counters"]
    trace = parse_trace(text, "trace.csv")
    pred = replay(trace, RunConfig.from_argv(argv))
    assert pred.problems == []
    assert mismatches(trace, pred, counters, data["flash_by_layer"]) == []
    assert len(pred.rows) == counters["experts_routed"] > 0
    if "--drop-cold-experts" in argv:  # the rule really decided something here
        assert counters["experts_dropped"] > 0
    if "--expert-substitute" in argv:
        assert counters["subst_changed"] > 0


def test_one_layer_larger_than_the_cache_is_replayed(
    engine_bin: Path, fixtures: dict[str, Path], tmp_path: Path
) -> None:
    """The gate plan's stress entry (topk-all-prefetch2: every expert, two prefetch rounds, 1 MiB) on
    `wide`, whose 16 experts of one layer outweigh the budget: demand loads go over budget while the
    layer's pins hold, and the replay still predicts every decision. On qwen3moe one layer fits; on
    qwen3moe-q4k the layers whose slots are larger (Q6_K down projections) do not, the others do."""
    stress = ("--cache-mb", "1", "--force-cache", "--prefetch", "2", "--prefetch-sync")
    argv, counters, text = traced_run(engine_bin, fixtures["wide"], tmp_path, *stress, "--n-expert-used", "16", n=8)
    pred = replay(parse_trace(text, "trace.csv"), RunConfig.from_argv(argv))
    assert pred.problems == [] and mismatches(parse_trace(text, "trace.csv"), pred, counters) == []
    assert all(16 * b > 1 << 20 for b in pred.slot_bytes.values()) and pred.over_budget_loads > 0
    argv, counters, text = traced_run(engine_bin, fixtures["qwen3moe"], tmp_path, *stress, "--n-expert-used", "8", n=8)
    pred = replay(parse_trace(text, "trace.csv"), RunConfig.from_argv(argv))
    assert mismatches(parse_trace(text, "trace.csv"), pred, counters) == [] and pred.over_budget_loads == 0
    # qwen3moe-q4k (llama.cpp's Q4_K_M mix): the eight experts of a Q4_K layer fit the 1 MiB (8 x 120 KiB
    # slots), those of a Q6_K-down layer do not (8 x 140 KiB): over budget in layers 2 and 3 only
    argv, data, text = traced_result(
        engine_bin, fixtures["qwen3moe-q4k"], tmp_path, *stress, "--n-expert-used", "8", n=8
    )
    trace = parse_trace(text, "trace.csv")
    pred = replay(trace, RunConfig.from_argv(argv))
    assert mismatches(trace, pred, data["counters"], data["flash_by_layer"]) == [] and pred.over_budget_loads > 0
    small, large = sorted(set(pred.slot_bytes.values()))
    assert 8 * small <= 1 << 20 < 8 * large


def test_tied_weights_exactly_at_the_threshold_are_kept(
    engine_bin: Path, fixtures: dict[str, Path], tmp_path: Path
) -> None:
    """qwen3moe-tied's experts 0 and 1 share a router row: a routing of both weighs each exactly 1/2, the
    threshold F/k at F = 1. Such slots reach the rule as misses and stay (the comparison is strict), and
    the replay agrees (the fault DROP_AT_THRESHOLD, `<=`, fails REPLAY and G8b)."""
    argv, counters, text = traced_run(
        engine_bin, fixtures["qwen3moe-tied"], tmp_path, *EVICTING, "--drop-cold-experts", "1.0", n=64
    )
    trace = parse_trace(text, "trace.csv")
    pred = replay(trace, RunConfig.from_argv(argv))
    assert pred.problems == [] and mismatches(trace, pred, counters) == []
    at_threshold = [
        x for x in trace.rows if x.phase == 1 and x.slot > 0 and x.router_weight == 0.5 and x.residency == 0
    ]
    assert at_threshold and not any(x.dropped for x in at_threshold)
    assert counters["experts_dropped"] > 0  # the rule still fires below the threshold


@pytest.fixture(scope="module")
def prefetch_run(engine_bin: Path, fixtures: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    return traced_run(
        engine_bin,
        fixtures["qwen3moe"],
        tmp_path_factory.mktemp("replay"),
        *EVICTING,
        "--prefetch",
        "1",
        "--prefetch-sync",
        "--drop-cold-experts",
        "1.0",
    )


def test_a_changed_counter_or_trace_field_is_named(prefetch_run) -> None:
    argv, counters, text = prefetch_run
    trace = parse_trace(text, "trace.csv")
    pred = replay(trace, RunConfig.from_argv(argv))
    assert mismatches(trace, pred, counters) == []
    # a counter off by a factor of two
    doubled = {**counters, "flash_bytes": 2 * counters["flash_bytes"]}
    [m] = mismatches(trace, pred, doubled)
    assert (m.where, m.field, m.engine, m.replay) == (
        "counters",
        "flash_bytes",
        doubled["flash_bytes"],
        counters["flash_bytes"],
    )
    # one row's residency changed: named by step, layer, slot and line
    i = next(i for i, r in enumerate(trace.rows) if r.phase == 1 and r.residency == 1)
    r = trace.rows[i]
    trace.rows[i] = dataclasses.replace(r, residency=0)
    [m] = mismatches(trace, pred, counters)
    assert m.field == "residency" and (m.engine, m.replay) == (0, 1)
    assert f"step {r.step} layer {r.layer} slot {r.slot} (line {r.line})" in m.where
    trace.rows[i] = r
    # one layer's slot in the preamble, and one layer's reads in the result, named by layer
    il = trace.moe_layers[1]
    trace.slot_bytes[il] += 4096
    [m] = mismatches(trace, pred, counters)
    assert (m.where, m.field, m.engine - m.replay) == (f"preamble layer {il}", "slot_bytes", 4096)
    trace.slot_bytes[il] -= 4096
    per = [{"layer": x, "flash_reads": n, "flash_bytes": b} for x, (n, b) in pred.flash_by_layer.items()]
    assert mismatches(trace, pred, counters, per) == []
    per[1]["flash_reads"] += 1
    [m] = mismatches(trace, pred, counters, per)
    assert (m.where, m.field) == (f"flash_by_layer layer {per[1]['layer']}", "flash_reads")


@pytest.mark.parametrize("L", ["0.15", "1.0"])
@pytest.mark.parametrize("name", ["qwen3moe", "gemma4", "qwen3moe-nonorm"])
def test_substitution_is_predicted_exactly(
    engine_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str, L: str
) -> None:
    """The rule of docs/policies.md re-run on the trace's scores: every executed expert, flag and count."""
    argv, counters, text = traced_run(engine_bin, fixtures[name], tmp_path, *EVICTING, "--expert-substitute", L)
    trace = parse_trace(text, "trace.csv")
    pred = replay(trace, RunConfig.from_argv(argv))
    assert pred.problems == [] and mismatches(trace, pred, counters) == []
    decode = [p for p in pred.rows if p.row.phase == 1]
    assert all(p.row.scores is not None for p in decode if p.row.slot == 0)
    assert all(p.row.scores is None for p in pred.rows if p.row.phase == 0 or p.row.slot > 0)
    assert counters["subst_examined"] == pred.counters["subst_examined"] == len(decode)
    assert counters["subst_changed"] == pred.counters["subst_changed"] == sum(p.substituted for p in decode) > 0
    assert any(p.expert != p.row.router_expert for p in decode)  # the replay chose experts itself
    # held to the exact margin: half of it (a plausible bug) predicts other decisions on some fixture
    # row or count, which is what catches the SUBST_MARGIN_HALF fault
    half = RunConfig.from_argv([*argv, "--expert-substitute", str(float(L) / 2)])
    assert mismatches(trace, replay(trace, half), counters)


def test_a_flipped_flag_or_changed_score_is_named(engine_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    argv, counters, text = traced_run(
        engine_bin, fixtures["qwen3moe"], tmp_path, *EVICTING, "--expert-substitute", "1.0"
    )
    trace = parse_trace(text, "trace.csv")
    cfg = RunConfig.from_argv(argv)
    assert mismatches(trace, replay(trace, cfg), counters) == []
    # one substituted flag flipped in the trace: that row, that field
    i = next(i for i, r in enumerate(trace.rows) if r.phase == 1 and r.substituted == 0)
    r = trace.rows[i]
    trace.rows[i] = dataclasses.replace(r, substituted=1)
    [m] = mismatches(trace, replay(trace, cfg), counters)
    assert (m.field, m.engine, m.replay) == ("substituted", 1, 0)
    assert f"step {r.step} layer {r.layer} slot {r.slot} (line {r.line})" in m.where
    trace.rows[i] = r
    # one score changed: the expert substituted in is given probability 0, so the rule cannot take it
    j = next(j for j, r in enumerate(trace.rows) if r.substituted)
    first = j - trace.rows[j].slot
    scores = list(trace.rows[first].scores or ())
    scores[trace.rows[j].expert] = 0.0
    trace.rows[first] = dataclasses.replace(trace.rows[first], scores=tuple(scores))
    found = mismatches(trace, replay(trace, cfg), counters)
    assert any(
        m.field == "expert" and f"(line {trace.rows[j].line})" in m.where and m.engine == trace.rows[j].expert
        for m in found
    ), found
    assert any(m.where == "counters" and m.field == "subst_changed" for m in found) or any(
        m.field == "substituted" for m in found
    )


def test_a_wrong_configuration_is_caught(prefetch_run) -> None:
    """The replay is not a mirror of the trace: told another budget or threshold, it disagrees."""
    argv, counters, text = prefetch_run
    trace = parse_trace(text, "trace.csv")
    for other in (["--cache-mb", "3"], ["--drop-cold-experts", "0.5"], ["--prefetch", "0"]):
        cfg = RunConfig.from_argv([*argv, *other])
        assert mismatches(trace, replay(trace, cfg), counters), other


def test_lru_refreshes_pins_and_never_speculates_over_budget() -> None:
    c = LruCache(budget=3 * 100, slot_bytes={0: 100})
    for e in range(3):
        c.insert((0, e))
    c.touch((0, 0))  # a hit is made most recent: 1 is now the least recent
    c.insert((0, 3))
    assert list(c.entries) == [(0, 2), (0, 0), (0, 3)] and c.evictions == 1
    for key in list(c.entries):
        c.pin(key)
    assert c.insert((0, 4), speculative=True) is False and (0, 4) not in c  # no room without a pinned victim
    assert c.insert((0, 5)) is True and c.bytes == 400  # a demand load goes over budget
    c.unpin((0, 2))
    c.trim()
    assert (0, 2) not in c and c.bytes == 300


def test_lru_charges_each_layer_its_own_slot() -> None:
    """Layers whose experts differ in type cost differently: an insert evicts until its own cost fits."""
    c = LruCache(budget=400, slot_bytes={0: 100, 1: 250})
    for e in range(3):
        c.insert((0, e))
    c.insert((1, 0))  # 300 + 250 > 400: the two least recent layer-0 entries go
    assert list(c.entries) == [(0, 2), (1, 0)] and c.bytes == 350 and c.evictions == 2
    c.pin((1, 0))
    assert c.insert((1, 1), speculative=True) is False  # 350 - 100 + 250 > 400 without the pinned one
    assert c.insert((0, 3), speculative=True) is True and c.bytes == 350 and (0, 2) not in c


def test_malformed_trace_is_one_error_naming_file_line_key(prefetch_run) -> None:
    _, _, text = prefetch_run
    with pytest.raises(TraceError, match=r"^t.csv:1: expected '# route_trace v4'"):
        parse_trace(text.replace("v4", "v3", 1), "t.csv")
    lines = text.splitlines()
    bad = "\n".join([*lines[:20], lines[20].replace(",0,", ",x,", 1), *lines[21:]])
    with pytest.raises(TraceError, match=r"^t.csv:21:\w+: not an integer: 'x'$"):
        parse_trace(bad, "t.csv")
    assert lines[20].endswith(",")  # no substitution armed: the scores cell is empty
    few = "\n".join([*lines[:20], lines[20] + "0.5 0.25", *lines[21:]])
    with pytest.raises(TraceError, match=r"^t.csv:21:scores: 2 scores, expected \d+ \(one per expert\)$"):
        parse_trace(few, "t.csv")
    no_page = "\n".join(ln for ln in lines if not ln.startswith("# page_bytes="))
    with pytest.raises(TraceError, match=r"^t.csv:\d+:page_bytes: missing from the preamble$"):
        parse_trace(no_page, "t.csv")
    no_slot = "\n".join(re.sub(r" slot_bytes=\d+$", "", ln) if ln.startswith("# layer=") else ln for ln in lines)
    with pytest.raises(TraceError, match=r"^t.csv:\d+:slot_bytes: not an integer: ''$"):
        parse_trace(no_slot, "t.csv")


def test_config_from_argv() -> None:
    cfg = RunConfig.from_argv(
        [
            "run",
            "-m",
            "m.gguf",
            "--cache-mb=2",
            "--force-cache",
            "--prefetch",
            "2",
            "--drop-cold-experts",
            "0.75",
            "--drop-no-renorm",
            "--expert-substitute",
            "1e-6",
            "--json",
        ]
    )
    assert cfg == RunConfig(cache_mb=2, prefetch=2, drop_F=0.75, renorm=False, subst_L=1e-6)
    assert cfg.budget == 2 << 20
    assert RunConfig.from_argv(["run", "--mmap", "-p", "x"]) == RunConfig(mmap=True)


class _Device:
    name = "fake"
    timeout_scale = 1.0


class _Session:
    """A device whose shell is this machine's: counts the round trips. Its reads are the farm's own
    verified reads (the device-side script, its size and sha256 headers), over this stand-in shell."""

    device = _Device()
    entry_deadline = 60.0  # seconds the runner allows one device round trip (a session property)

    def __init__(self) -> None:
        self.calls = 0

    def run(self, argv, timeout):
        from bmoe_ci.farm import Ending, RunResult

        self.calls += 1
        p = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
        return RunResult("fake", tuple(argv), Ending.EXITED, p.returncode, stdout=p.stdout, stderr=p.stderr)

    def sh(self, script: str, *args: str, timeout: float = 60.0):
        return self.run(["sh", "-c", script, "bmoe-ci", *args], timeout)

    def read_files(self, paths):
        from bmoe_ci.farm.pull import read_files

        return read_files(self, paths, self.entry_deadline)  # type: ignore[arg-type]


def test_traces_come_back_in_one_round_trip(tmp_path: Path) -> None:
    from bmoe_ci.gaterun.runner import DeviceRunner

    a, b, gone = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "gone.csv"
    a.write_text("# route_trace v4\nx,y\n1,2\n")
    b.write_text("second\n\nwith a blank line and no final newline")
    session = _Session()
    runner = DeviceRunner(session)  # type: ignore[arg-type]
    paths = [str(a), str(gone), str(b)]
    got = runner.texts("k", paths)
    assert got == {str(a): a.read_text(), str(gone): None, str(b): b.read_text()}
    assert runner.texts("k", paths) is got and session.calls == 1  # cached: one round trip per key

"""The lossy knobs wired at the seam (docs/policies.md), end to end on the ASan + UBSan
engine:

* the counters agree with the route trace on every default fixture: dropped slots are misses that
  cost no read and weigh 0, substituted slots hold resident experts, experts_dropped / subst_changed
  are the trace's columns, flash_bytes is still the sum of expert_bytes;
* the stderr contract: the narrow-routing warning once at load, `moe-drop:` / `moe-subst:` at the end,
  in human and --json mode; `bmoe batch` writes nothing to stderr and carries the warning in JSON;
* residency is an input: with the knobs armed, the output still does not depend on I/O lanes,
  async vs sync prefetch, batch vs single process, or the run (decisions are taken when a read is
  issued, never when it lands); a correct prefetch can un-drop an expert;
* bad F / L through `run` and `batch`: exit 2, one line, no crash.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_streaming import FIXTURES, read_trace, run

PROMPT = "The quick brown fox"
EVICTING = ("--cache-mb", "2", "--force-cache")
DROP_LINE = re.compile(r"^moe-drop: (\d+)/(\d+) routed experts dropped \((\d+)\.(\d)%\), threshold (\S+) x uniform$")
SUBST_LINE = re.compile(r"^moe-subst: (\d+)/(\d+) slots substituted \((\d+)\.(\d)%\), margin (\S+) x range$")
WARNING = "bmoe: WARNING drop-cold-experts="


def run_lossy(binary: Path, model: Path, *args: str | Path, n: int = 24) -> tuple[dict, str]:
    proc = run(binary, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--json", *EVICTING, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def pct(part: int, whole: int) -> str:
    t = (part * 1000 + whole // 2) // whole if whole else 0
    return f"{t // 10}.{t % 10}"


@pytest.mark.parametrize("name", FIXTURES)
@pytest.mark.parametrize(
    "knob",
    [
        ("--drop-cold-experts", "1.0", "--drop-in-prefill"),
        ("--drop-cold-experts", "0.75"),
        ("--expert-substitute", "1.0"),
        ("--expert-substitute", "0.3", "--drop-cold-experts", "0.5"),
    ],
    ids=["drop-1.0-prefill", "drop-0.75", "subst-1.0", "subst+drop"],
)
def test_counters_agree_with_route_trace(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str, knob: tuple[str, ...]
) -> None:
    trace = tmp_path / "trace.csv"
    res, stderr = run_lossy(engine_asan_bin, fixtures[name], *knob, "--route-trace", trace)
    c = res["counters"]
    _, _, rows = read_trace(trace)
    assert len(rows) == c["experts_routed"] == c["cache_hits"] + c["cache_misses"]
    assert sum(r["dropped"] for r in rows) == c["experts_dropped"]
    assert sum(r["substituted"] for r in rows) == c["subst_changed"] <= c["subst_examined"]
    assert c["flash_bytes"] == sum(r["expert_bytes"] for r in rows)
    for r in rows:
        if r["dropped"]:  # a miss, no read, weight zeroed
            assert r["residency"] == 0 and r["expert_bytes"] == 0 and r["weight"] == 0.0, r
        if r["substituted"]:  # only a resident expert comes in, and only in decode
            assert r["residency"] != 0 and r["phase"] == 1, r
    if "--drop-cold-experts" in knob:
        assert c["experts_dropped"] > 0 and 0 < c["weight_dropped"] < c["weight_routed"]
        # every decode row was examined: each carries its routing's final mass
        assert len({(r["step"], r["layer"]) for r in rows if r["phase"] == 1}) > 0
        assert all(r["phase"] == 1 for r in rows if r["dropped"])  # the prompt is each layer's first pass
    else:
        assert c["experts_dropped"] == 0 and c["weight_routed"] == c["weight_dropped"] == 0
    if "--expert-substitute" in knob:
        decode = sum(1 for r in rows if r["phase"] == 1)
        assert c["subst_examined"] == decode and c["subst_changed"] > 0  # decode routings only
    # the single-process lines, exactly as docs/design.md, engine: result and exit codes shapes them
    lines = stderr.splitlines()
    drops = [ln for ln in lines if ln.startswith("moe-drop:")]
    substs = [ln for ln in lines if ln.startswith("moe-subst:")]
    if "--drop-cold-experts" in knob:
        F = knob[knob.index("--drop-cold-experts") + 1]
        m = DROP_LINE.match(drops[0]) if len(drops) == 1 else None
        assert m, stderr
        assert (int(m[1]), int(m[2]), f"{m[3]}.{m[4]}") == (
            c["experts_dropped"],
            c["experts_routed"],
            pct(c["experts_dropped"], c["experts_routed"]),
        )
        assert float(m[5]) == float(F)
    else:
        assert not drops
    if "--expert-substitute" in knob:
        m = SUBST_LINE.match(substs[0]) if len(substs) == 1 else None
        assert m, stderr
        assert (int(m[1]), int(m[2]), f"{m[3]}.{m[4]}") == (
            c["subst_changed"],
            c["subst_examined"],
            pct(c["subst_changed"], c["subst_examined"]),
        )
    else:
        assert not substs


def test_stderr_contract_human_json_and_batch(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    model = fixtures["qwen3moe"]
    args = [
        "-m",
        str(model),
        "-p",
        PROMPT,
        "-n",
        "8",
        *EVICTING,
        "--drop-cold-experts",
        "0.75",
        "--expert-substitute",
        "0.15",
    ]
    human = subprocess.run([str(engine_asan_bin), "run", *args], capture_output=True, check=False)
    assert human.returncode == 0, human.stderr  # (stdout: the generated bytes, not UTF-8)
    human.stderr = human.stderr.decode()
    lines = human.stderr.splitlines()
    # the warning first (at load), then the run summary, then the knobs' lines: drop, subst
    assert lines[0].startswith(WARNING) and sum(WARNING in ln for ln in lines) == 1, lines
    assert "with top-k 2: the threshold is 37.5% of the routing here, against 9.4% at the top-k 8" in lines[0]
    assert lines[1].startswith("bmoe: ") and DROP_LINE.match(lines[2]) and SUBST_LINE.match(lines[3]), lines
    assert len(lines) == 4
    as_json = run(engine_asan_bin, "run", *args, "--json")
    assert as_json.returncode == 0
    jl = as_json.stderr.splitlines()
    assert jl == [lines[0], lines[2], lines[3]]  # no human summary in --json mode
    res = json.loads(as_json.stdout)
    assert res["warnings"] == [lines[0]]
    # batch: nothing on stderr, the same warning once in each entry's JSON, the same counters
    plan = tmp_path / "plan.jsonl"
    entry = {"id": "a", "argv": ["run", *args]}
    plan.write_text(json.dumps(entry) + "\n" + json.dumps({**entry, "id": "b"}) + "\n")
    batch = run(engine_asan_bin, "batch", plan)
    assert batch.returncode == 0 and batch.stderr == ""
    outs = [json.loads(ln) for ln in batch.stdout.splitlines()]
    for out in outs:
        assert out["warnings"] == [lines[0]]
        assert out["counters"] == res["counters"] and out["text_hex"] == res["text_hex"]


@pytest.mark.parametrize(("k", "due"), [(None, False), ("4", True), ("5", False)])
def test_warning_follows_the_effective_top_k(
    engine_asan_bin: Path, fixtures: dict[str, Path], k: str | None, due: bool
) -> None:
    """wide routes top-8: no warning; --n-expert-used 4 makes it due (18.8% against 9.4%), 5 does not."""
    extra = ("--n-expert-used", k) if k else ()
    res, stderr = run_lossy(engine_asan_bin, fixtures["wide"], "--drop-cold-experts", "0.75", *extra, n=1)
    found = [w for w in res["warnings"] if WARNING in w]
    assert bool(found) == due and stderr.count(WARNING) == (1 if due else 0)
    if due:
        assert "with top-k 4: the threshold is 18.8% of the routing here, against 9.4% at the top-k 8" in found[0]
    # dropping off: never, whatever the width
    off, stderr = run_lossy(engine_asan_bin, fixtures["qwen3moe"], n=1)
    assert not [w for w in off["warnings"] if WARNING in w] and stderr == ""


@pytest.mark.parametrize("name", ["qwen3moe", "gemma4", "wide"])
def test_armed_knobs_stay_deterministic(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """Residency is an input, but every residency decision is taken when a read is issued, on the eval
    thread: I/O lanes and async vs sync prefetch change no byte, no counter and no trace row."""
    knobs = ("--drop-cold-experts", "1.0", "--expert-substitute", "0.15")
    out = {}
    for label, extra in {
        "sync": ("--prefetch", "1", "--prefetch-sync"),
        "async-lanes4": ("--prefetch", "1", "--io-threads", "4"),
        "sync-again": ("--prefetch", "1", "--prefetch-sync"),
    }.items():
        trace = tmp_path / f"{label}.csv"
        res, _ = run_lossy(engine_asan_bin, fixtures[name], *knobs, *extra, "--route-trace", trace)
        out[label] = (res["tokens"], res["text_hex"], res["counters"], trace.read_bytes())
    assert out["sync"] == out["async-lanes4"] == out["sync-again"]


def test_a_correct_prefetch_can_undrop(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """With dropping armed, prefetch depth is an output-affecting setting: an expert the prefetch made
    resident is a hit at the decision, so it is kept (residency 2 on a kept row)."""
    model = fixtures["wide"]
    plain, _ = run_lossy(engine_asan_bin, model, "--drop-cold-experts", "1.0")
    trace = tmp_path / "p.csv"
    pre, _ = run_lossy(
        engine_asan_bin,
        model,
        "--drop-cold-experts",
        "1.0",
        "--prefetch",
        "2",
        "--prefetch-sync",
        "--route-trace",
        trace,
    )
    _, _, rows = read_trace(trace)
    assert pre["counters"]["prefetch_used"] > 0
    assert any(r["residency"] == 2 and not r["dropped"] for r in rows)
    assert pre["counters"]["experts_dropped"] != plain["counters"]["experts_dropped"]


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity", "1.0000001", "1e-400", "0x1p-3", "", "0.5x", "1.5"])
@pytest.mark.parametrize("flag", ["--drop-cold-experts", "--expert-substitute"])
def test_bad_values_through_run_and_batch(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, flag: str, value: str
) -> None:
    args = ["-m", str(fixtures["qwen3moe"]), "-p", PROMPT, "-n", "2", *EVICTING, flag, value]
    proc = run(engine_asan_bin, "run", *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"bmoe: error: {flag}: ")
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"id": "x", "argv": ["run", *args]}) + "\n")
    batch = subprocess.run([str(engine_asan_bin), "batch", str(plan)], capture_output=True, text=True, check=False)
    assert batch.returncode == 0 and batch.stderr == ""
    out = json.loads(batch.stdout)
    assert out["ok"] is False and out["error"]["message"] == proc.stderr.removeprefix("bmoe: error: ").strip()


def test_knob_without_cache_is_refused_by_the_engine(engine_asan_bin: Path, fixtures: dict[str, Path]) -> None:
    """validate() runs inside engine_open, so a run (or a batch entry) cannot bypass it."""
    for flag in ("--drop-cold-experts", "--expert-substitute"):
        proc = run(engine_asan_bin, "run", "-m", fixtures["qwen3moe"], "-p", PROMPT, "-n", "2", flag, "0.5")
        assert proc.returncode == 2 and proc.stderr == f"bmoe: error: {flag}: needs the expert cache (--cache-mb > 0)\n"
        proc = run(engine_asan_bin, "run", "-m", fixtures["qwen3moe"], "-p", PROMPT, "-n", "2", "--mmap", flag, "0.5")
        assert proc.returncode == 2
        assert proc.stderr == f"bmoe: error: {flag}: not available with --mmap (nothing is streamed)\n"

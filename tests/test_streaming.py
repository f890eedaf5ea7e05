"""Expert streaming end to end (docs/design.md, expert memory), on the ASan + UBSan engine:

* the counters agree with the route trace, on every fixture, with the cache off, with an evicting
  cache and with prefetch: hits + misses == routed, flash_bytes == the trace's expert_bytes (plus
  the speculative reads that were never used), and with the cache off every routed expert is a read;
* the route trace's preamble and columns are the documented format;
* I/O lanes, O_DIRECT on/off and async vs sync prefetch change no byte of the output, the counters
  or the trace;
* expert tensors whose types differ between layers stream as they compute resident, each layer's
  reads and cache slots in its own bytes;
* bad input is a clear one-line error with the documented exit code, never a crash or a wrong
  output: expert tensors that disagree in shape (3), a cache budget below one expert (2),
  a shard truncated after the model was opened, discovered by an expert read mid-stream (4).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

import gguf_corpus as gc

FIXTURES = ["qwen3moe", "qwen3moe-split4", "gemma4", "wide", "qwen3moe-q8_0", "qwen3moe-q4k", "qwen3moe-nonorm"]
PROMPT = "The quick brown fox"
EVICTING = ("--cache-mb", "2", "--force-cache")
COLUMNS = [
    "turn",
    "phase",
    "step",
    "layer",
    "slot",
    "router_expert",
    "expert",
    "router_weight",
    "weight",
    "residency",
    "expert_bytes",
    "dropped",
    "substituted",
    "scores",
]
FLOATS = ("router_weight", "weight")


def run(binary: Path, *args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False)


def run_json(binary: Path, model: Path, *args: str | Path, n: int = 24) -> dict:
    proc = run(binary, "run", "-m", model, "-p", PROMPT, "-n", str(n), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # nothing on stderr in --json mode unless the run fails
    return json.loads(proc.stdout)


def read_trace(path: Path) -> tuple[dict[str, str], dict[int, int], list[dict[str, int | float | str]]]:
    """(preamble keys, expert_bytes per MoE layer, rows); each layer's slot bytes are in the preamble
    keys as slot_bytes.<layer>."""
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "# route_trace v4"
    meta: dict[str, str] = {}
    layers: dict[int, int] = {}
    i = 1
    while lines[i].startswith("# "):
        body = lines[i][2:]
        if body.startswith("layer="):
            a, b, parts, slot = body.split(" ")
            il = int(a.split("=")[1])
            layers[il] = int(b.split("=")[1])
            assert sum(map(int, parts.removeprefix("part_bytes=").split(","))) == layers[il]
            meta[f"slot_bytes.{il}"] = slot.removeprefix("slot_bytes=")
        elif body.startswith("page_bytes="):
            meta.update(kv.split("=") for kv in body.split(" "))
        else:
            k, v = body.split("=", 1)
            meta[k] = v
        i += 1
    reader = csv.DictReader(io.StringIO("\n".join(lines[i:]) + "\n"))
    assert reader.fieldnames == COLUMNS
    rows = [{k: (float(v) if k in FLOATS else v if k == "scores" else int(v)) for k, v in r.items()} for r in reader]
    return meta, layers, rows


def info(binary: Path, model: Path) -> dict:
    proc = run(binary, "info", "-m", model)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# -- counters against the route trace ---------------------------------------------------------------

MODES = {
    "cache-off": (),
    "evicting": EVICTING,
    "prefetch": (*EVICTING, "--prefetch", "1", "--prefetch-sync"),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", FIXTURES)
def test_counters_agree_with_route_trace(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str, mode: str
) -> None:
    model = fixtures[name]
    trace = tmp_path / "trace.csv"
    res = run_json(engine_asan_bin, model, *MODES[mode], "--route-trace", trace)
    ref = run_json(engine_asan_bin, model, "--mmap")
    assert res["tokens"] == ref["tokens"] and res["text_hex"] == ref["text_hex"]
    c = res["counters"]
    facts = info(engine_asan_bin, model)
    meta, layer_bytes, rows = read_trace(trace)

    # the preamble is the model's facts
    k = res["model"]["top_k_effective"]
    page, shared = int(meta.pop("page_bytes")), int(meta.pop("shared_slot_bytes"))
    slots = {il: int(meta.pop(f"slot_bytes.{il}")) for il in layer_bytes}
    # substitution ranks log(scores) only when the sorted tensor holds softmax probabilities
    assert meta.pop("scores_are_probs") == ("1" if facts["gating"]["func"] == "softmax" else "0")
    assert page % 4096 == 0 and all(slots[il] % page == 0 and slots[il] > layer_bytes[il] for il in slots)
    # a shared slot holds any layer's expert: the largest layer's slot; none with the cache on
    assert shared == (max(slots.values()) if mode == "cache-off" else 0)
    assert meta == {
        "model": str(model),
        "arch": facts["arch"],
        "layers": str(facts["layers"]),
        "experts": str(facts["n_expert"]),
        "top_k": str(k),
    }
    assert layer_bytes == {e["layer"]: e["expert_bytes"] for e in facts["expert_layout"]}
    assert dict(zip(facts["moe_layers"], facts["expert_bytes_per_layer"], strict=True)) == layer_bytes

    # one row per routed slot, in rank order, for every MoE layer of every evaluated token
    assert len(rows) == c["experts_routed"] > 0
    n_eval = len(res["prompt_tokens"]) + len(res["tokens"]) - 1
    assert len(rows) == n_eval * len(layer_bytes) * k
    assert all(r["turn"] == 0 and r["phase"] in (0, 1) and 0 <= r["expert"] < facts["n_expert"] for r in rows)
    assert [r["slot"] for r in rows] == [i % k for i in range(len(rows))]
    assert all(r["dropped"] == 0 and r["substituted"] == 0 for r in rows)
    # without a policy the router's choice and weight are what ran
    assert all(r["router_expert"] == r["expert"] and r["router_weight"] == r["weight"] for r in rows)
    assert c["experts_dropped"] == c["subst_changed"] == c["subst_examined"] == 0

    # hits + misses == routed, and they are the trace's residencies
    res_count = Counter(r["residency"] for r in rows)
    assert c["cache_hits"] + c["cache_misses"] == c["experts_routed"]
    assert c["cache_misses"] == res_count[0]
    assert c["cache_hits"] == res_count[1] + res_count[2]
    assert res_count[2] == c["prefetch_used"]

    # flash bytes: the trace charges each read expert once; unused speculative reads are the rest
    charged = [r for r in rows if r["expert_bytes"]]
    assert all(r["expert_bytes"] == layer_bytes[r["layer"]] for r in charged)
    assert all(r["residency"] in (0, 2) for r in charged)
    unused = c["prefetch_issued"] - c["prefetch_used"]
    per = {x["layer"]: x for x in res["flash_by_layer"]}
    assert sorted(per) == sorted(layer_bytes)
    assert all(x["flash_bytes"] == x["flash_reads"] * layer_bytes[il] for il, x in per.items())
    assert sum(x["flash_reads"] for x in per.values()) == c["flash_reads"]
    # per layer, the reads no row carries are the speculative reads never used
    beyond = {il: per[il]["flash_reads"] - sum(1 for r in charged if r["layer"] == il) for il in per}
    assert all(n >= 0 for n in beyond.values()) and sum(beyond.values()) == unused
    spec = sum(n * layer_bytes[il] for il, n in beyond.items())
    assert c["flash_bytes"] == sum(r["expert_bytes"] for r in rows) + spec
    assert c["flash_reads"] == len(charged) + unused
    if mode != "prefetch":
        assert c["prefetch_issued"] == c["prefetch_used"] == 0
        # flash_bytes is the sum of expert_bytes over the misses
        assert c["flash_bytes"] == sum(r["expert_bytes"] for r in rows if r["residency"] == 0)
    else:
        assert c["prefetch_used"] > 0

    if mode == "cache-off":
        # every routed expert is a read: a miss, read once per layer and token batch (the prompt is
        # one batch, each decode step another)
        assert c["cache_hits"] == 0 and c["cache_misses"] == c["experts_routed"]
        batches = {(r["phase"], r["step"] if r["phase"] == 1 else -1, r["layer"], r["expert"]) for r in rows}
        assert c["flash_reads"] == len(batches)
        decode = [r for r in rows if r["phase"] == 1]
        assert all(r["expert_bytes"] == layer_bytes[r["layer"]] for r in decode)
    else:
        assert c["cache_hits"] > 0


def test_trace_rows_match_the_routing(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """Prefill rows are numbered by prompt position, decode rows by step; the weights of a token's
    slots are its normalised routing (qwen3moe normalises), highest first."""
    trace = tmp_path / "t.csv"
    res = run_json(engine_asan_bin, fixtures["qwen3moe"], "--route-trace", trace, n=6)
    _, layers, rows = read_trace(trace)
    P, k = len(res["prompt_tokens"]), res["model"]["top_k_effective"]
    prefill = [r for r in rows if r["phase"] == 0]
    decode = [r for r in rows if r["phase"] == 1]
    assert len(prefill) == P * len(layers) * k and len(decode) == 5 * len(layers) * k
    assert sorted({r["step"] for r in prefill}) == list(range(P))
    assert sorted({r["step"] for r in decode}) == list(range(5))
    for i in range(0, len(rows), k):
        group = rows[i : i + k]
        assert len({(r["phase"], r["step"], r["layer"]) for r in group}) == 1
        w = [r["weight"] for r in group]
        assert abs(sum(w) - 1.0) < 1e-5 and w == sorted(w, reverse=True)
        assert len({r["expert"] for r in group}) == k


# -- what must not change a byte -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3moe-split4", "wide"])
def test_lanes_odirect_and_async_prefetch_change_nothing(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, name: str
) -> None:
    model = fixtures[name]
    variants = {
        "lanes1": (*EVICTING, "--io-threads", "1"),
        "lanes4": (*EVICTING, "--io-threads", "4"),
        "lanes8-buffered": (*EVICTING, "--io-threads", "8", "--no-odirect"),
        "prefetch-sync": (*EVICTING, "--prefetch", "2", "--prefetch-sync"),
        "prefetch-async-4": (*EVICTING, "--prefetch", "2", "--io-threads", "4"),
    }
    out = {}
    for label, args in variants.items():
        trace = tmp_path / f"{label}.csv"
        r = run_json(engine_asan_bin, model, *args, "--route-trace", trace)
        out[label] = (r["tokens"], r["text_hex"], r["counters"], trace.read_bytes(), r["warnings"], r["io"])
    base = out["lanes1"]
    for label in ("lanes4", "lanes8-buffered"):
        assert out[label][:4] == base[:4], label
    assert out["lanes4"][5] == base[5]
    # buffered reads read the slices exactly, direct ones their aligned covering ranges: only the
    # bytes read from the file differ ("io", docs/streaming.md, counters), nothing decided
    buffered_io, flash = out["lanes8-buffered"][5], base[2]["flash_bytes"]
    assert buffered_io == {"flash_read_bytes": flash, "read_amplification": 1}
    assert base[5]["flash_read_bytes"] >= flash > 0
    assert base[5]["read_amplification"] == base[5]["flash_read_bytes"] / flash
    assert out["prefetch-sync"][:2] == base[:2]
    # the speculative decisions are taken when a read is issued, not when it lands: async prefetch on
    # four lanes gives the sync counters and trace exactly
    assert out["prefetch-async-4"][2:4] == out["prefetch-sync"][2:4]
    assert all(o[4] == [] for o in out.values())  # O_DIRECT is accepted on this filesystem


def test_cache_sizes_change_no_byte(engine_asan_bin: Path, fixtures: dict[str, Path]) -> None:
    model = fixtures["qwen3moe-q8_0"]
    ref = run_json(engine_asan_bin, model, "--mmap")
    reads = []
    for mb in ("0", "1", "2", "3", "1500"):
        r = run_json(engine_asan_bin, model, "--cache-mb", mb, "--force-cache", "-t", "2")
        assert r["tokens"] == ref["tokens"] and r["text_hex"] == ref["text_hex"], mb
        reads.append(r["counters"]["flash_reads"])
    assert reads[0] > reads[1] > reads[2] >= reads[3] >= reads[4]
    # a cache that holds every expert reads each at most once
    assert reads[4] <= len(ref["model"]["moe_layers"]) * ref["model"]["n_expert"]


# -- bad input ---------------------------------------------------------------------------------------------


def _retype(img: gc.GGUFImage, name: str, **changes: object) -> gc.GGUFImage:
    tensors = [gc.Tensor(**{**t.__dict__, **changes}) if t.name == name else t for t in img.tensors]
    return gc.GGUFImage(kvs=img.kvs, tensors=tensors, alignment=img.alignment)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bmoe: error: "), proc.stderr[-2000:]
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_expert_tensors_that_disagree_in_shape(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path
) -> None:
    img = _retype(gc.parse(Path(fixtures["qwen3moe"]).read_bytes()), "blk.1.ffn_up_exps.weight", dims=[64, 96, 8])
    path = img.write(tmp_path / "shape.gguf")
    for mode in ((), EVICTING):
        proc = run(engine_asan_bin, "run", "-m", path, "-p", PROMPT, "-n", "4", *mode)
        _one_line_error(proc, 3, str(path), "blk.1.ffn_up_exps.weight", "shape [64,96,8] but expected [64,128,8]")
        assert proc.stdout == ""


def test_expert_tensors_of_different_types(engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path) -> None:
    """Each tensor its own type (llama.cpp's mixes): layer 1's up experts in F16, the others F32. The
    model loads, `info` gives layer 1's smaller experts and the type, and streaming through an
    evicting cache, with the cache off and with prefetch gives the resident output, each layer's reads
    charged its own bytes."""
    img = _retype(
        gc.parse(Path(fixtures["qwen3moe"]).read_bytes()),
        "blk.1.ffn_up_exps.weight",
        ggml_type=gc.GGML_F16,
        data=b"\x00\x3c" * (64 * 128 * 8),
    )
    path = img.write(tmp_path / "mixed.gguf")
    facts = info(engine_asan_bin, path)
    layout = {e["layer"]: e for e in facts["expert_layout"]}
    types = {t["name"]: t["type"] for e in layout.values() for t in e["tensors"]}
    assert types["blk.1.ffn_up_exps.weight"] == "f16" and types["blk.0.ffn_up_exps.weight"] == "f32"
    assert layout[1]["expert_bytes"] == layout[0]["expert_bytes"] - 64 * 128 * 2
    assert facts["expert_bytes_per_layer"] == [layout[il]["expert_bytes"] for il in facts["moe_layers"]]
    ref = run_json(engine_asan_bin, path, "--mmap")
    for mode in MODES.values():
        res = run_json(engine_asan_bin, path, *mode)
        assert res["tokens"] == ref["tokens"] and res["text_hex"] == ref["text_hex"], mode
        per = {x["layer"]: x for x in res["flash_by_layer"]}
        assert all(x["flash_bytes"] == x["flash_reads"] * layout[il]["expert_bytes"] for il, x in per.items())
        assert per[1]["flash_reads"] > 0


BIG_EXPERTS = """\
version: 1
fixtures:
  - name: bigexperts
    description: two experts of 3 MiB each (F32, expert_ffn 512 x d 512)
    arch: qwen3moe
    seed: 4242
    dtype: F32
    dims: {d: 512, layers: 1, heads: 4, kv_heads: 2, head_dim: 16, expert_ffn: 512, experts: 2, top_k: 1,
           context: 64}
"""


def test_cache_budget_below_one_expert(engine_asan_bin: Path, tmp_path: Path) -> None:
    from bmoe_ci.models import generate

    spec = tmp_path / "spec.yaml"
    spec.write_text(BIG_EXPERTS)
    (model,) = generate(tmp_path / "big", names=["bigexperts"], specs_path=spec)
    for mb in ("1", "2", "3"):
        proc = run(engine_asan_bin, "run", "-m", model.path, "-p", "hi", "-n", "2", "--cache-mb", mb, "--force-cache")
        line = _one_line_error(
            proc,
            2,
            f"--cache-mb: {mb} MiB is smaller than one expert of this model",
            "use --cache-mb 4 or more, or 0 for no cache",
        )
        assert "bytes per expert slot" in line
        proc = run(
            engine_asan_bin, "run", "-m", model.path, "-p", "hi", "-n", "2", "--cache-mb", mb, "--force-cache", "--json"
        )
        assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["kind"] == "config"
    # one expert fits: it runs, and gives the resident bytes
    ok = run_json(engine_asan_bin, model.path, "--cache-mb", "4", "--force-cache", n=4)
    ref = run_json(engine_asan_bin, model.path, "--mmap", n=4)
    assert ok["tokens"] == ref["tokens"]


def _fds_on(pid: int, path: Path) -> int:
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == str(path.resolve()):
                n += 1
        except OSError:
            pass
    return n


@pytest.mark.parametrize(
    "mode",
    [(), EVICTING, (*EVICTING, "--prefetch", "2", "--io-threads", "4")],
    ids=["cache-off", "evicting", "prefetch-async"],
)
def test_shard_truncated_mid_stream(
    engine_asan_bin: Path, fixtures: dict[str, Path], tmp_path: Path, mode: tuple[str, ...]
) -> None:
    """The last shard is cut right after its header once the engine has opened the model (checked
    every size) and made its dense weights resident: the first expert read from it finds the file
    short. The engine is held at that point by its route trace, a FIFO it opens after the model."""
    first = Path(fixtures["qwen3moe-split4"])
    shards = sorted(first.parent.glob("qwen3moe-split4-0000?-of-00004.gguf"))
    assert len(shards) == 4
    for s in shards:
        (tmp_path / s.name).write_bytes(s.read_bytes())
    model, last = tmp_path / shards[0].name, tmp_path / shards[-1].name
    facts = info(engine_asan_bin, model)
    in_last = [t for e in facts["expert_layout"] for t in e["tensors"] if t["shard"] == 3]
    assert in_last, "the last shard holds expert tensors"
    cut = min(t["offset"] for t in in_last)
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [
            str(engine_asan_bin),
            "run",
            "-m",
            str(model),
            "-p",
            PROMPT,
            "-n",
            "24",
            "--json",
            *mode,
            "--route-trace",
            str(fifo),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # the model reader's descriptor, then the streamer's buffered and direct ones
        while _fds_on(proc.pid, last) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the engine never opened the expert store"
            time.sleep(0.01)
        os.truncate(last, cut)
        with open(fifo) as reader:  # lets the engine go on
            trace_text = reader.read()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 4, (proc.returncode, err[-3000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bmoe: error: "), err[-3000:]
    assert str(last) in lines[0] and "truncated since the model was opened" in lines[0]
    assert "ffn_" in lines[0] and "_exps.weight expert" in lines[0]
    result = json.loads(out)
    assert result == {"ok": False, "error": {"kind": "io", "message": lines[0][len("bmoe: error: ") :]}}
    assert trace_text.startswith("# route_trace v4\n")

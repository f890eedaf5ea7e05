"""The fixture generator: determinism, caching, spec validation, llama.cpp names, split layout."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from gguf import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from bmoe_ci.models import SpecError, generate, load_specs, parse_specs, read_manifest, sha256_files
from bmoe_ci.models.llama_cpp_table import missing_keys, tensor_problems
from bmoe_ci.models.model import metadata
from bmoe_ci.models.spec import FixtureSpec, default_specs_path

DEFAULTS = [
    "qwen3moe",
    "qwen3moe-split4",
    "gemma4",
    "wide",
    "qwen3moe-q8_0",
    "qwen3moe-q4k",
    "qwen3moe-nonorm",
    "qwen3moe-tied",
    "qwen2moe",
    "gpt-oss",
    "gpt-oss-mxfp4",  # gpt-oss's experts in MXFP4, as its released files are
    "qwen35moe",
    "lfm2moe",
    "qwen3moe-types",  # every claimed weight type, as dense and (the quantized ones) expert tensors
    "qwen3moe-bpe",  # a real byte-level BPE vocabulary (fixtures/vocabs/qwen2-2k.json)
    "gemma3-spm",  # the dense recipe with a real SentencePiece vocabulary (fixtures/vocabs/phi3-spm-2k.json)
]
#: the default fixtures with experts (gemma3-spm is dense) and those with the byte vocabulary
MOE_DEFAULTS = [n for n in DEFAULTS if n != "gemma3-spm"]
BYTE_VOCAB = [n for n in DEFAULTS if n not in ("qwen3moe-bpe", "gemma3-spm")]
VARIANTS = ["qwen3moe-sigmoid", "qwen3moe-softmax-sel", "gemma4-file"]
#: one fixture per further weight type (not default: the reference and kernel tests of each type)
QUANT_VARIANTS = [
    "qwen3moe-q5k",
    "qwen3moe-q6k",
    "qwen3moe-q4_0",
    "qwen3moe-q5_0",
    "qwen3moe-q4_1",
    "qwen3moe-q5_1",
    "qwen3moe-q2k",
    "qwen3moe-q3k",
    "qwen3moe-iq4xs",
    "qwen3moe-iq4nl",
    "qwen3moe-mxfp4",
    "qwen3moe-bf16",
]
COMMITTED = ["trained", "trained-q8_0"]  # default fixtures that are committed files (test_trained_fixtures.py)


def _spec_doc() -> dict:
    return yaml.safe_load(default_specs_path().read_text())


def _reader_files(path: Path) -> list[GGUFReader]:
    m = re.match(r"^(.+)-00001-of-(\d{5})\.gguf$", path.name)
    if not m:
        return [GGUFReader(path)]
    n = int(m[2])
    return [GGUFReader(path.with_name(f"{m[1]}-{i:05d}-of-{n:05d}.gguf")) for i in range(1, n + 1)]


def _meta(path: Path) -> dict:
    return {k: f.contents() for k, f in _reader_files(path)[0].fields.items()}


def _tensors(path: Path) -> dict:
    return {t.name: t for r in _reader_files(path) for t in r.tensors}


@pytest.fixture(scope="module")
def generated(fixture_dir: Path) -> dict:
    return {f.name: f for f in generate(fixture_dir, names=DEFAULTS + VARIANTS + COMMITTED)}


# ------------------------------------------------------------------ specs


def test_spec_file_defaults_are_the_generated_and_the_two_committed():
    specs = load_specs()
    assert specs.defaults == DEFAULTS + COMMITTED
    assert {"bench-large", *VARIANTS} <= set(specs.specs)
    assert not specs.specs["bench-large"].default


def test_generate_without_names_makes_the_defaults(fixture_dir: Path):
    assert [f.name for f in generate(fixture_dir)] == DEFAULTS + COMMITTED


def test_unknown_fixture_name_lists_the_known(tmp_path: Path):
    with pytest.raises(SpecError, match=r"unknown fixture 'nope'.*known: qwen3moe"):
        generate(tmp_path, names=["nope"])


def _bad(mutate) -> str:
    doc = copy.deepcopy(_spec_doc())
    mutate(doc)
    with pytest.raises(SpecError) as info:
        parse_specs(doc, "fixtures.yaml")
    return str(info.value)


def _first(doc: dict) -> dict:
    return doc["fixtures"][0]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: _first(d)["dims"].update(top_k=9), r"'qwen3moe': dims\.top_k: .*<= experts"),
        (lambda d: _first(d)["dims"].update(kv_heads=3), r"'qwen3moe': dims\.kv_heads: "),
        (lambda d: _first(d)["dims"].pop("experts"), r"'qwen3moe': dims: qwen3moe is a MoE architecture: give experts"),
        (lambda d: d["fixtures"][2]["dims"].update(experts=0, top_k=0), r"'gemma4': dims: gemma4 is a MoE arch"),
        (lambda d: _first(d)["dims"].update(expertz=3), r"'qwen3moe': dims\.expertz: unknown key"),
        (lambda d: _first(d).update(dtype="IQ2_XXS"), r"'qwen3moe': dtype: "),
        (lambda d: _first(d).update(dtype="Q5_K"), r"'qwen3moe': dims\.d: 64 is not a multiple of 256, the Q5_K"),
        (
            lambda d: d["fixtures"][3].update(dtype="Q4_K_M"),
            r"'wide': dims\.expert_ffn: 84 is not a multiple of 32, the Q4_K_M",
        ),
        (lambda d: _first(d).update(seed=-1), r"'qwen3moe': seed: "),
        (lambda d: _first(d).update(arch="llama"), r"'qwen3moe': arch: "),
        (lambda d: _first(d)["gating"].update(func=4), r"'qwen3moe': gating\.func: "),
        (lambda d: _first(d).update(name="Bad Name"), r"'Bad Name': name: "),
        (lambda d: _first(d)["dims"].update(rope_dims=15), r"dims\.rope_dims: must be even"),
        (lambda d: _first(d).update(init={"router_tie": [0, 8]}), r"init\.router_tie: .* of 0\.\.7"),
        (lambda d: _first(d).update(init={"router_tie": [3]}), r"init\.router_tie: .*at least two distinct"),
        (
            lambda d: d["fixtures"][3]["dims"].update(dense_layers=1),
            r"'wide': dims\.ffn: required when dense",
        ),
        (lambda d: d["fixtures"][1].update(base="missing"), r"'qwen3moe-split4': base: unknown fixture"),
        (lambda d: d["fixtures"].append(dict(_first(d))), r"fixtures\[\d+\]: name: duplicate"),
        (lambda d: d.update(version=2), r"version: expected 1"),
        (lambda d: d.update(extra=1), r"unknown top-level key 'extra'"),
        (
            lambda d: d["fixtures"][4]["dims"].update(expert_ffn=100),
            r"'qwen3moe-q8_0': dims\.expert_ffn: 100 is not a multiple of 32",
        ),
    ],
)
def test_spec_validation_errors_name_the_key(mutate, expected: str):
    msg = _bad(mutate)
    assert msg.startswith("fixtures.yaml: "), msg
    assert re.search(expected, msg), msg


def test_spec_base_cycle_is_reported():
    def cyc(d):
        d["fixtures"][0]["base"] = "qwen3moe-split4"

    assert "cycle" in _bad(cyc)


def test_bad_yaml_file_names_the_file(tmp_path: Path):
    p = tmp_path / "specs.yaml"
    p.write_text("version: 1\nfixtures: [\n")
    with pytest.raises(SpecError, match=re.escape(str(p)) + ": invalid YAML"):
        load_specs(p)
    with pytest.raises(SpecError, match="cannot read"):
        load_specs(tmp_path / "absent.yaml")


def test_split_shard_count_that_cannot_be_filled(tmp_path: Path):
    doc = _spec_doc()
    doc["fixtures"] = [f for f in doc["fixtures"] if f["name"] in ("qwen3moe", "qwen3moe-split4")]
    doc["fixtures"][1]["shards"] = 40  # 51 tensors over 39 shards leaves some empty
    p = tmp_path / "specs.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="shards: 40 shards cannot be filled"):
        generate(tmp_path / "out", names=["qwen3moe-split4"], specs_path=p)


# ------------------------------------------------------------------ determinism and caching


def test_same_spec_gives_the_same_bytes(generated: dict, tmp_path: Path):
    again = {f.name: f for f in generate(tmp_path, names=list(generated))}
    for name, f in generated.items():
        g = again[name]
        assert g.sha256 == f.sha256, name
        assert [p.name for p in g.files] == [p.name for p in f.files]
        for a, b in zip(f.files, g.files, strict=True):
            assert a.read_bytes() == b.read_bytes(), a.name
    # the manifest records the same hashes too (and has no timestamps)
    m1, m2 = read_manifest(generated["qwen3moe"].path.parent), read_manifest(tmp_path)
    for name in generated:
        assert m1["fixtures"][name] == m2["fixtures"][name]


def test_manifest_records_every_file(generated: dict):
    manifest = read_manifest(generated["qwen3moe"].path.parent)
    for name, f in generated.items():
        entry = manifest["fixtures"][name]
        whole, each = sha256_files(f.files)
        assert entry["sha256"] == f.sha256 == whole
        assert [e["sha256"] for e in entry["files"]] == each
        assert [e["size"] for e in entry["files"]] == [p.stat().st_size for p in f.files]
        assert entry["spec_hash"] == f.spec_hash
        assert entry["path"] == f.path.name


def test_cache_reuses_unchanged_and_regenerates_the_rest(tmp_path: Path, capsys):
    names = ["qwen3moe", "wide"]
    first = {f.name: f for f in generate(tmp_path, names=names)}
    mtimes = {n: f.path.stat().st_mtime_ns for n, f in first.items()}
    capsys.readouterr()

    second = {f.name: f for f in generate(tmp_path, names=names)}
    assert {n: f.path.stat().st_mtime_ns for n, f in second.items()} == mtimes
    assert second == first
    assert "generating" not in capsys.readouterr().err

    # an altered file is regenerated, its neighbour is not
    with open(first["wide"].path, "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    third = {f.name: f for f in generate(tmp_path, names=names)}
    err = capsys.readouterr().err
    assert "wide: generating (files missing or altered)" in err
    assert "qwen3moe: generating" not in err
    assert third["wide"].sha256 == first["wide"].sha256
    assert first["qwen3moe"].path.stat().st_mtime_ns == mtimes["qwen3moe"]

    # a changed spec is regenerated (different bytes, different spec hash)
    doc = _spec_doc()
    for f in doc["fixtures"]:
        if f["name"] == "wide":
            f["seed"] += 1
    specs = tmp_path / "specs.yaml"
    specs.write_text(yaml.safe_dump(doc))
    fourth = {f.name: f for f in generate(tmp_path, names=names, specs_path=specs)}
    err = capsys.readouterr().err
    assert "wide: generating (spec or generator changed)" in err
    assert fourth["wide"].sha256 != first["wide"].sha256
    assert fourth["wide"].spec_hash != first["wide"].spec_hash
    assert fourth["qwen3moe"] == first["qwen3moe"]


def test_deleted_shard_is_regenerated(tmp_path: Path):
    (f,) = generate(tmp_path, names=["qwen3moe-split4"])
    f.files[2].unlink()
    (g,) = generate(tmp_path, names=["qwen3moe-split4"])
    assert g.sha256 == f.sha256 and all(p.exists() for p in g.files)


# ------------------------------------------------------------------ format


def test_split_layout_and_metadata(generated: dict):
    f = generated["qwen3moe-split4"]
    assert [p.name for p in f.files] == [f"qwen3moe-split4-{i:05d}-of-00004.gguf" for i in range(1, 5)]
    assert f.path == f.files[0]
    readers = [GGUFReader(p) for p in f.files]
    total = sum(len(r.tensors) for r in readers)
    assert len(readers[0].tensors) == 0  # metadata only
    assert all(len(r.tensors) > 0 for r in readers[1:])
    for i, r in enumerate(readers):
        assert r.fields["split.no"].contents() == i  # counts from 0; names count from 1
        assert r.fields["split.count"].contents() == 4
        assert r.fields["split.tensors.count"].contents() == total
        if i:
            assert "general.architecture" not in r.fields  # only the first shard carries metadata
    first = {k: v.contents() for k, v in readers[0].fields.items() if not k.startswith(("split.", "GGUF."))}
    whole = {
        k: v.contents() for k, v in GGUFReader(generated["qwen3moe"].path).fields.items() if not k.startswith("GGUF.")
    }
    first.pop("general.name")
    whole.pop("general.name")
    assert first == whole


def test_split_holds_the_same_tensors_as_qwen3moe(generated: dict):
    split = _tensors(generated["qwen3moe-split4"].path)
    whole = _tensors(generated["qwen3moe"].path)
    assert list(split) == list(whole)
    for name, t in whole.items():
        assert split[name].tensor_type == t.tensor_type
        assert bytes(split[name].data) == bytes(t.data), name


@pytest.mark.parametrize("name", DEFAULTS + VARIANTS + COMMITTED)
def test_tensor_names_are_llama_cpp_names_of_the_arch(generated: dict, name: str):
    arch = _meta(generated[name].path)["general.architecture"]
    (arch_enum,) = [a for a, n in MODEL_ARCH_NAMES.items() if n == arch]
    patterns = [
        # .scale: gemma4's router input scale (llama.cpp's ffn_gate_inp "scale" tensor); .bias: exp_probs_b
        # and ssm_dt; no suffix: ssm_a (llama.cpp's name for it has none)
        re.escape(TENSOR_NAMES[t]).replace(r"\{bid\}", r"\d+") + r"(\.(weight|scale|bias))?"
        for t in MODEL_TENSORS[arch_enum]
    ]
    for tname in _tensors(generated[name].path):
        assert any(re.fullmatch(p, tname) for p in patterns), f"{tname} is not a {arch} tensor"


def _expected_shapes(meta: dict, arch: str, tensors: dict) -> dict[str, tuple[int, ...]]:
    """GGUF ne of every tensor, from docs/model-math.md."""
    g = lambda k: meta[f"{arch}.{k}"]  # noqa: E731
    d, L, H, kv_heads = (
        g("embedding_length"),
        g("block_count"),
        g("attention.head_count"),
        g("attention.head_count_kv"),
    )
    if arch in ("qwen35moe", "lfm2moe"):
        return _expected_hybrid_shapes(meta, arch, tensors)
    hd_full, hdv_full = g("attention.key_length"), g("attention.value_length")
    hd = hd_full
    swa = meta.get(f"{arch}.attention.sliding_window_pattern", [])
    E, f, V = g("expert_count"), g("expert_feed_forward_length"), len(meta["tokenizer.ggml.tokens"])
    dense = meta.get(f"{arch}.leading_dense_block_count", 0)
    out = {"token_embd.weight": (d, V), "output_norm.weight": (d,)}
    if "output.weight" in tensors:
        out["output.weight"] = (d, V)
    if arch == "gemma4":
        out["rope_freqs.weight"] = (hd_full // 2,)
    for i in range(L):
        b = f"blk.{i}."
        # head_count_kv may be per layer, and gemma4's sliding layers have head sizes of their own
        Hkv = kv_heads[i] if isinstance(kv_heads, list) else kv_heads
        local = arch == "gemma4" and swa[i]
        hd = g("attention.key_length_swa") if local else hd_full
        hdv = g("attention.value_length_swa") if local else hdv_full
        out |= {
            b + "attn_norm.weight": (d,),
            b + "attn_q.weight": (d, H * hd),
            b + "attn_k.weight": (d, Hkv * hd),
            b + "attn_output.weight": (H * hdv, d),
        }
        if b + "attn_v.weight" in tensors or arch != "gemma4":  # gemma4 may take v from k
            out[b + "attn_v.weight"] = (d, Hkv * hdv)
        if b + "layer_output_scale.weight" in tensors:
            out[b + "layer_output_scale.weight"] = (1,)
        if b + "ffn_down_exps.scale" in tensors:
            out[b + "ffn_down_exps.scale"] = (E,)
        if arch not in ("qwen2moe", "gpt-oss"):  # those two have no q/k norms
            out |= {b + "attn_q_norm.weight": (hd,), b + "attn_k_norm.weight": (hd,)}
        # gpt-oss's FFN norm is the tensor named post_attention_norm
        out[b + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight")] = (d,)
        if b + "attn_q.bias" in tensors:
            out |= {b + "attn_q.bias": (H * hd,), b + "attn_k.bias": (Hkv * hd,), b + "attn_v.bias": (Hkv * hdv,)}
        if arch == "gpt-oss":
            out |= {
                b + "attn_output.bias": (d,),
                b + "attn_sinks.weight": (H,),
                b + "ffn_gate_inp.bias": (E,),
                b + "ffn_gate_exps.bias": (f, E),
                b + "ffn_up_exps.bias": (f, E),
                b + "ffn_down_exps.bias": (d, E),
            }
        if arch == "qwen2moe":
            S = g("expert_shared_feed_forward_length")
            out |= {
                b + "ffn_gate_inp_shexp.weight": (d,),
                b + "ffn_gate_shexp.weight": (d, S),
                b + "ffn_up_shexp.weight": (d, S),
                b + "ffn_down_shexp.weight": (S, d),
            }
        if arch == "gemma4":
            out[b + "post_attention_norm.weight"] = (d,)
            out[b + "post_ffw_norm.weight"] = (d,)
        if i < dense:
            F = g("feed_forward_length")
            out |= {b + "ffn_gate.weight": (d, F), b + "ffn_up.weight": (d, F), b + "ffn_down.weight": (F, d)}
            continue
        out[b + "ffn_gate_inp.weight"] = (d, E)
        out[b + "ffn_down_exps.weight"] = (f, d, E)
        if arch == "dots1":
            S = f * g("expert_shared_count")
            out |= {
                b + "ffn_gate_shexp.weight": (d, S),
                b + "ffn_up_shexp.weight": (d, S),
                b + "ffn_down_shexp.weight": (S, d),
            }
        if arch == "gemma4":
            S = g("feed_forward_length")
            out |= {
                b + "ffn_gate_inp.scale": (d,),
                b + "ffn_gate_up_exps.weight": (d, 2 * f, E),
                b + "ffn_gate.weight": (d, S),
                b + "ffn_up.weight": (d, S),
                b + "ffn_down.weight": (S, d),
                b + "pre_ffw_norm_2.weight": (d,),
                b + "post_ffw_norm_1.weight": (d,),
                b + "post_ffw_norm_2.weight": (d,),
            }
        else:
            out |= {b + "ffn_gate_exps.weight": (d, f, E), b + "ffn_up_exps.weight": (d, f, E)}
    return out


def _expected_hybrid_shapes(meta: dict, arch: str, tensors: dict) -> dict[str, tuple[int, ...]]:
    """GGUF ne of a hybrid's tensors (docs/model-math.md, "Hybrid architectures")."""
    g = lambda k: meta[f"{arch}.{k}"]  # noqa: E731
    d, L, H, hd = g("embedding_length"), g("block_count"), g("attention.head_count"), g("attention.key_length")
    E, f, V = g("expert_count"), g("expert_feed_forward_length"), len(meta["tokenizer.ggml.tokens"])
    kv = g("attention.head_count_kv")
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (d, V)}
    if arch == "qwen35moe":
        S, Hk, Hv, K = g("ssm.state_size"), g("ssm.group_count"), g("ssm.time_step_rank"), g("ssm.conv_kernel")
        C, every, sh = (2 * Hk + Hv) * S, g("full_attention_interval"), g("expert_shared_feed_forward_length")
        out |= {"output_norm.weight": (d,), "output.weight": (d, V)}
        for i in range(L):
            b = f"blk.{i}."
            out |= {b + "attn_norm.weight": (d,), b + "post_attention_norm.weight": (d,)}
            if (i + 1) % every:
                out |= {
                    b + "attn_qkv.weight": (d, C),
                    b + "attn_gate.weight": (d, Hv * S),
                    b + "ssm_conv1d.weight": (K, C),
                    b + "ssm_dt.bias": (Hv,),
                    b + "ssm_a": (Hv,),
                    b + "ssm_beta.weight": (d, Hv),
                    b + "ssm_alpha.weight": (d, Hv),
                    b + "ssm_norm.weight": (S,),
                    b + "ssm_out.weight": (Hv * S, d),
                }
            else:
                out |= {
                    b + "attn_q.weight": (d, 2 * H * hd),
                    b + "attn_k.weight": (d, kv * hd),
                    b + "attn_v.weight": (d, kv * hd),
                    b + "attn_output.weight": (H * hd, d),
                    b + "attn_q_norm.weight": (hd,),
                    b + "attn_k_norm.weight": (hd,),
                }
            out |= {
                b + "ffn_gate_inp.weight": (d, E),
                b + "ffn_gate_exps.weight": (d, f, E),
                b + "ffn_up_exps.weight": (d, f, E),
                b + "ffn_down_exps.weight": (f, d, E),
                b + "ffn_gate_inp_shexp.weight": (d,),
                b + "ffn_gate_shexp.weight": (d, sh),
                b + "ffn_up_shexp.weight": (d, sh),
                b + "ffn_down_shexp.weight": (sh, d),
            }
        return out
    K, dense = g("shortconv.l_cache"), meta.get(f"{arch}.leading_dense_block_count", 0)
    out["token_embd_norm.weight"] = (d,)
    for i in range(L):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (d,), b + "ffn_norm.weight": (d,)}
        if kv[i] == 0:
            out |= {
                b + "shortconv.in_proj.weight": (d, 3 * d),
                b + "shortconv.conv.weight": (K, d),
                b + "shortconv.out_proj.weight": (d, d),
            }
        else:
            out |= {
                b + "attn_q.weight": (d, H * hd),
                b + "attn_k.weight": (d, kv[i] * hd),
                b + "attn_v.weight": (d, kv[i] * hd),
                b + "attn_output.weight": (H * hd, d),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
            }
        if i < dense:
            F = g("feed_forward_length")
            out |= {b + "ffn_gate.weight": (d, F), b + "ffn_up.weight": (d, F), b + "ffn_down.weight": (F, d)}
            continue
        out |= {
            b + "ffn_gate_inp.weight": (d, E),
            b + "exp_probs_b.bias": (E,),
            b + "ffn_gate_exps.weight": (d, f, E),
            b + "ffn_up_exps.weight": (d, f, E),
            b + "ffn_down_exps.weight": (f, d, E),
        }
    return out


@pytest.mark.parametrize("name", MOE_DEFAULTS + VARIANTS)
def test_shapes_follow_model_math(generated: dict, name: str):
    meta = _meta(generated[name].path)
    arch = meta["general.architecture"]
    tensors = _tensors(generated[name].path)
    expected = _expected_shapes(meta, arch, tensors)
    assert {n: tuple(int(x) for x in t.shape) for n, t in tensors.items()} == expected


REQUIRED_KEYS = [
    "general.architecture",
    "general.name",
    "general.alignment",
    "{a}.block_count",
    "{a}.context_length",
    "{a}.embedding_length",
    "{a}.attention.head_count",
    "{a}.attention.head_count_kv",
    "{a}.attention.key_length",
    "{a}.attention.value_length",
    "{a}.attention.layer_norm_rms_epsilon",
    "{a}.rope.freq_base",
    "{a}.expert_count",
    "{a}.expert_used_count",
    "{a}.expert_feed_forward_length",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
]


@pytest.mark.parametrize("name", BYTE_VOCAB + COMMITTED)
def test_metadata_and_vocabulary(generated: dict, name: str):
    meta = _meta(generated[name].path)
    arch = meta["general.architecture"]
    for key in REQUIRED_KEYS:
        assert key.format(a=arch) in meta, key
    assert meta["general.alignment"] == 32
    # byte-level either way; gpt-oss with the o200k_harmony specials
    pre = {"qwen35moe": "qwen35", "lfm2moe": "lfm2", "gpt-oss": "gpt-4o"}.get(arch, "qwen2")
    n_special = 7 if arch == "gpt-oss" else 3
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == pre
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 256 + n_special and len(set(tokens)) == len(tokens)
    assert tokens[ord("A")] == "A" and tokens[ord(" ")] == "Ġ" and tokens[ord("\n")] == "Ċ"
    assert all(len(t) == 1 for t in tokens[:256])
    assert tokens[meta["tokenizer.ggml.eos_token_id"]] == "<|endoftext|>"
    assert meta["tokenizer.ggml.token_type"] == [1] * 256 + [3] * n_special
    assert meta["tokenizer.ggml.merges"] == []
    assert meta["tokenizer.ggml.add_bos_token"] is False


@pytest.mark.parametrize(("name", "vocab"), [("qwen3moe-bpe", "qwen2-2k"), ("gemma3-spm", "phi3-spm-2k")])
def test_real_vocabulary_fixtures(generated: dict, name: str, vocab: str):
    """A fixture with a committed vocabulary carries it whole, and its special tokens' output rows are 0."""
    from bmoe_ci.models.vocab import load_vocab

    v = load_vocab(vocab)
    meta = _meta(generated[name].path)
    assert meta["tokenizer.ggml.model"] == v.model and meta["tokenizer.ggml.tokens"] == list(v.tokens)
    assert meta["tokenizer.ggml.token_type"] == list(v.types)
    assert meta.get("tokenizer.ggml.merges") == (list(v.merges) if v.merges is not None else None)
    if v.scores is not None:
        assert np.allclose(meta["tokenizer.ggml.scores"], v.scores)
    assert meta["tokenizer.ggml.eos_token_id"] == v.eos
    tensors = _tensors(generated[name].path)
    out = tensors.get("output.weight", tensors["token_embd.weight"])
    rows = np.asarray(out.data, dtype=np.float32).reshape(v.n_vocab, -1)
    assert not rows[v.special_ids].any() and rows[[i for i in range(v.n_vocab) if i not in v.special_ids]].any()


def test_gating_and_structure_keys(generated: dict):
    q, g, w = (_meta(generated[n].path) for n in ("qwen3moe", "gemma4", "wide"))
    assert q["qwen3moe.expert_gating_func"] == 1 and q["qwen3moe.expert_weights_norm"] is True
    assert "qwen3moe.expert_weights_scale" not in q
    assert not any(k.startswith("gemma4.expert_weights") or k == "gemma4.expert_gating_func" for k in g)
    assert g["gemma4.leading_dense_block_count"] == 1
    assert g["gemma4.attention.sliding_window_pattern"] == [True, False, True, False, True]  # even layers slide
    assert g["gemma4.embedding_length_per_layer_input"] == 0
    assert (w["qwen3moe.expert_count"], w["qwen3moe.expert_used_count"]) == (16, 8)
    assert "qwen3moe.expert_gating_func" not in w  # wide runs on the recipe's defaults
    s = _meta(generated["qwen3moe-sigmoid"].path)
    assert (s["dots1.expert_gating_func"], s["dots1.expert_weights_norm"], s["dots1.expert_weights_scale"]) == (
        2,
        True,
        2.5,
    )
    x = _meta(generated["qwen3moe-softmax-sel"].path)
    assert (x["dots1.expert_gating_func"], x["dots1.expert_weights_norm"]) == (3, False)
    q35, lfm = _meta(generated["qwen35moe"].path), _meta(generated["lfm2moe"].path)
    assert q35["qwen35moe.full_attention_interval"] == 2 and q35["qwen35moe.rope.dimension_sections"] == [2, 1, 0, 1]
    assert not any(k.startswith("qwen35moe.expert_weights") or k == "qwen35moe.expert_gating_func" for k in q35)
    assert lfm["lfm2moe.attention.head_count_kv"] == [0, 0, 2, 0, 2] and lfm["lfm2moe.expert_gating_func"] == 2
    assert "lfm2moe.expert_weights_norm" not in lfm and "output.weight" not in _tensors(generated["lfm2moe"].path)
    n = _meta(generated["qwen3moe-nonorm"].path)
    assert (n["general.architecture"], n["dots1.expert_gating_func"], n["dots1.expert_weights_norm"]) == (
        "dots1",
        1,
        False,
    )


# ------------------------------------------------------------------ what llama.cpp requires


@pytest.mark.parametrize("name", list(load_specs().specs))
def test_every_fixture_has_the_keys_llama_cpp_requires(name: str):
    """Every specified fixture (bench ones too: metadata only, nothing is generated) carries the keys
    llama.cpp's loader requires for its architecture (the table in bmoe_ci.models.llama_cpp_table)."""
    specs = load_specs()
    spec = specs.specs[name]
    if isinstance(spec, FixtureSpec):
        meta = {key: value for key, value, _, _ in metadata(spec)}
        meta["general.architecture"] = spec.arch  # gguf's writer adds it first
    else:  # a committed file: its own metadata
        meta = _meta(spec.source(specs.path.parent))
    assert missing_keys(meta) == []


@pytest.mark.parametrize("name", DEFAULTS + VARIANTS)
def test_every_fixture_has_the_tensors_llama_cpp_requires(generated: dict, name: str):
    meta = _meta(generated[name].path)
    assert missing_keys(meta) == []
    assert tensor_problems(meta, set(_tensors(generated[name].path))) == []


def test_the_llama_cpp_table_notices_what_is_missing(generated: dict):
    meta = _meta(generated["gemma4"].path)
    names = set(_tensors(generated["gemma4"].path))
    del meta["gemma4.attention.sliding_window_pattern"]
    assert missing_keys(meta) == ["gemma4.attention.sliding_window_pattern"]
    assert tensor_problems(meta, names - {"rope_freqs.weight"}) == ["missing rope_freqs.weight"]
    dots = _meta(generated["qwen3moe-nonorm"].path)
    assert tensor_problems(dots, set(_tensors(generated["qwen3moe-nonorm"].path)) | {"blk.0.ffn_gate.weight"}) == [
        "not created by llama.cpp: blk.0.ffn_gate.weight"
    ]
    del dots["dots1.expert_gating_func"]
    assert missing_keys(dots) == ["dots1.expert_gating_func"]


@pytest.mark.parametrize(
    ("arch", "change", "message"),
    [
        ("qwen3moe", {"gating": {"func": 1, "norm": False}}, "put other gating on arch dots1"),
        ("gemma4", {"gating": {"scale": 1.25}}, "put other gating on arch dots1"),
        ("dots1", {"gating": {}}, "gating.func: llama.cpp's dots1 has no default gating"),
        ("dots1", {"dims": {"kv_heads": 2}}, "kv_heads: llama.cpp's dots1 sizes k and v by heads"),
        ("qwen3moe", {"dims": {"rope_dims": 8}}, "rope_dims: llama.cpp's qwen3moe rotates the whole head"),
        ("gemma4", {"dims": {"shared_ffn": 96}}, "shared_ffn: llama.cpp's gemma4 sizes the shared expert"),
        ("qwen3moe", {"hybrid": {"conv_kernel": 4}}, "hybrid: qwen3moe has no recurrent layers"),
        ("qwen35moe", {"hybrid": {"groups": 3}}, "hybrid.value_heads: 4 is not a multiple of groups (3)"),
        ("qwen35moe", {"hybrid": {"full_attention_interval": 5}}, "hybrid: 0 of 4 layers attend"),
        ("lfm2moe", {"hybrid": {"attention_layers": [0, 1, 2, 3, 4]}}, "hybrid: 5 of 5 layers attend"),
        ("lfm2moe", {"hybrid": {"attention_layers": [2, 9]}}, "must be distinct layers of 0..4"),
        ("lfm2moe", {"gating": {"func": 2, "norm": False}}, "fixes the normalisation and reads no scale"),
        ("lfm2moe", {"dims": {"head_dim": 8}}, "heads x head_dim == d (64)"),
    ],
)
def test_specs_llama_cpp_would_read_differently_are_refused(arch: str, change: dict, message: str):
    base = {"dots1": "qwen3moe-nonorm"}.get(arch, arch)
    doc = _spec_doc()
    (item,) = [copy.deepcopy(f) for f in doc["fixtures"] if f["name"] == base]
    for key, value in change.items():
        item[key] = {**item.get(key, {}), **value} if value else {}
    item.pop("default", None)
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_specs({"version": 1, "fixtures": [item]}, "t.yaml")


def test_gemma4_structure(generated: dict):
    t = _tensors(generated["gemma4"].path)
    assert "output.weight" not in t  # tied to token_embd
    assert "blk.0.ffn_gate_inp.weight" not in t and "blk.0.ffn_gate.weight" in t  # dense layer 0
    assert "blk.1.ffn_gate_up_exps.weight" in t and "blk.1.ffn_gate_exps.weight" not in t
    assert "blk.1.ffn_gate.weight" in t  # the shared expert
    assert "blk.1.ffn_gate_inp.scale" in t and "blk.0.ffn_gate_inp.scale" not in t  # the router's input scale
    assert "rope_freqs.weight" in t


def test_q8_0_types_and_values(generated: dict):
    q8 = _tensors(generated["qwen3moe-q8_0"].path)
    f32 = _tensors(generated["qwen3moe"].path)
    assert _meta(generated["qwen3moe-q8_0"].path)["general.file_type"] == 7
    for name, t in q8.items():
        if len(t.shape) == 1 or "ffn_gate_inp" in name:
            assert t.tensor_type == GGMLQuantizationType.F32, name
        else:
            assert t.tensor_type == GGMLQuantizationType.Q8_0, name
    # tensors of the same name and shape hold qwen3moe's weights, up to Q8_0 rounding
    for name in ("token_embd.weight", "blk.2.attn_q.weight", "output.weight"):
        a = dequantize(np.asarray(q8[name].data), q8[name].tensor_type)
        b = np.asarray(f32[name].data)
        assert a.shape == b.shape
        blocks_max = np.abs(b.reshape(-1, 32)).max(axis=1, keepdims=True)
        bound = blocks_max / 127 * (0.5 + 127 * 2**-11) + 1e-6  # rounding + the f16 scale's rounding
        assert np.all(np.abs(a - b).reshape(-1, 32) <= bound), name
    np.testing.assert_array_equal(
        np.asarray(q8["blk.0.ffn_gate_inp.weight"].data), np.asarray(f32["blk.0.ffn_gate_inp.weight"].data)
    )


#: qwen3moe-q4k's bytes (its manifest sha256), recorded: the K-quant quantizer (bmoe_ci.models.kquant)
#: is numpy float32 arithmetic in a fixed order, so a numpy or platform change that moved one rounding
#: would change the fixture every gate result is keyed on; this says so here first.
Q4K_SHA256 = "75be36f1fe256ba4ff2712981409d18dd7d6ddfc3143a50db4486f1113269609"

#: fixture -> (general.file_type, the matrices' type, output.weight's type)
Q = GGMLQuantizationType
QUANT_TYPES = {
    "qwen3moe-q4k": (15, Q.Q4_K, Q.Q6_K),  # and the other types of the mix, Q4KM_SPECIAL
    "qwen3moe-q5k": (16, Q.Q5_K, Q.Q5_K),
    "qwen3moe-q6k": (18, Q.Q6_K, Q.Q6_K),
    "qwen3moe-q4_0": (2, Q.Q4_0, Q.Q4_0),
    "qwen3moe-q5_0": (8, Q.Q5_0, Q.Q5_0),
    "qwen3moe-q4_1": (3, Q.Q4_1, Q.Q4_1),
    "qwen3moe-q5_1": (9, Q.Q5_1, Q.Q5_1),
    "qwen3moe-q2k": (10, Q.Q2_K, Q.Q2_K),
    "qwen3moe-q3k": (11, Q.Q3_K, Q.Q3_K),
    "qwen3moe-iq4xs": (30, Q.IQ4_XS, Q.IQ4_XS),
    "qwen3moe-iq4nl": (25, Q.IQ4_NL, Q.IQ4_NL),
    "qwen3moe-mxfp4": (38, Q.MXFP4, Q.MXFP4),
    "qwen3moe-bf16": (32, Q.BF16, Q.BF16),
}
#: the quantizer's error, rms(dequantised - float) / rms(float) over a tensor, at most (measured on the
#: fixtures: Q4_K 0.07, Q5_K 0.035, Q6_K 0.018, Q4_0 0.11, Q5_0 0.05, Q4_1 0.082, Q5_1 0.039, Q2_K 0.30,
#: Q3_K 0.15, IQ4_XS 0.077, IQ4_NL 0.078, MXFP4 0.12, BF16 0.002)
QUANT_RMS = {
    Q.Q4_K: 0.09,
    Q.Q5_K: 0.045,
    Q.Q6_K: 0.025,
    Q.Q4_0: 0.13,
    Q.Q5_0: 0.065,
    Q.Q4_1: 0.1,
    Q.Q5_1: 0.05,
    Q.Q2_K: 0.35,
    Q.Q3_K: 0.18,
    Q.IQ4_XS: 0.095,
    Q.IQ4_NL: 0.095,
    Q.MXFP4: 0.14,
    Q.BF16: 0.003,
    Q.Q8_0: 0.01,
}
#: llama.cpp's Q4_K_M of qwen3moe-q4k (4 layers, 8 experts, rows of 256), as its llama_tensor_get_type
#: decides (src/llama-quant.cpp): with exactly 8 experts attn_k and attn_v are Q8_0 and attn_output
#: Q5_K; ffn_down is Q6_K in the use_more_bits layers (2 and 3 of 4); everything else Q4_K
Q4KM_SPECIAL = {
    **{f"blk.{i}.{t}.weight": Q.Q8_0 for i in range(4) for t in ("attn_k", "attn_v")},
    **{f"blk.{i}.attn_output.weight": Q.Q5_K for i in range(4)},
    "blk.2.ffn_down_exps.weight": Q.Q6_K,
    "blk.3.ffn_down_exps.weight": Q.Q6_K,
}


@pytest.fixture(scope="module")
def quant_generated(fixture_dir: Path) -> dict:
    return {f.name: f for f in generate(fixture_dir, names=list(QUANT_TYPES))}


def test_q4k_bytes_are_recorded(quant_generated: dict):
    assert quant_generated["qwen3moe-q4k"].sha256 == Q4K_SHA256


@pytest.mark.parametrize("name", list(QUANT_TYPES))
def test_quantized_types_and_values(quant_generated: dict, name: str):
    """Every matrix in the fixture's type (output.weight in Q6_K for the Q4_K_M mix), norms and the
    router F32, and every matrix the spec's float weights up to the type's rounding (gguf.quants reads
    them back: the quantizer and the reader share no code)."""
    from bmoe_ci.models.model import tensors as float_tensors

    ftype, mat, out = QUANT_TYPES[name]
    path = quant_generated[name].path
    assert _meta(path)["general.file_type"] == ftype
    floats = {t.name: t.data for t in float_tensors(load_specs().specs[name])}
    for tname, t in _tensors(path).items():
        if len(t.shape) == 1 or "ffn_gate_inp" in tname:
            assert t.tensor_type == Q.F32, tname
            continue
        want = out if tname == "output.weight" else mat
        if name == "qwen3moe-q4k":
            want = Q4KM_SPECIAL.get(tname, want)
        assert t.tensor_type == want, tname
        a = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
        b = floats[tname].astype(np.float64)
        assert a.shape == b.shape, tname
        live = b[..., :256, :] if tname == "output.weight" else b  # the specials' rows are zero
        rms = np.sqrt(np.mean((a[..., : live.shape[-2], :] - live) ** 2) / np.mean(live**2))
        assert rms <= QUANT_RMS[t.tensor_type], (tname, rms)


def test_kquant_quantizer_edge_cases():
    """Zero blocks, a block of one sign, large and small values: the project's quantizers (the K-quants,
    IQ4_NL, IQ4_XS) give blocks that dequantise (gguf.quants) close to the input, zero to zero, and the
    same bytes every time."""
    from bmoe_ci.models import iquant, kquant
    from bmoe_ci.weight_types import weight_type

    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[0] = 0.0
    x[1] = np.abs(x[1]) + 0.5  # every value positive: Q4_K/Q5_K's min is 0
    x[2] = -np.abs(x[2])
    x[3] *= 1e4
    x[4] *= 1e-3  # (far smaller and the f16 block scales underflow: ggml's format, not the quantizer)
    x[5, :256] = 0.0
    quantizers = (
        (kquant.quantize_q2_K, Q.Q2_K),
        (kquant.quantize_q3_K, Q.Q3_K),
        (kquant.quantize_q4_K, Q.Q4_K),
        (kquant.quantize_q5_K, Q.Q5_K),
        (kquant.quantize_q6_K, Q.Q6_K),
        (iquant.quantize_iq4_nl, Q.IQ4_NL),
        (iquant.quantize_iq4_xs, Q.IQ4_XS),
    )
    for fn, qt in quantizers:
        q = fn(x)
        assert q.dtype == np.uint8 and q.shape == (6, weight_type(qt).row_bytes(512))
        assert np.array_equal(q, fn(x.copy()))
        y = dequantize(q, qt)
        assert not y[0].any() and not y[5, :256].any()
        for r in (1, 2, 3, 4, 5):
            live = x[r] if r != 5 else x[r, 256:]
            got = y[r] if r != 5 else y[r, 256:]
            rel = np.sqrt(np.mean((got - live) ** 2) / np.mean(live**2))
            assert rel <= QUANT_RMS[qt] * 1.5, (qt, r, rel)


def test_tied_router_rows(generated: dict):
    """qwen3moe-tied: expert 1's router row is expert 0's in every MoE layer, the others differ."""
    for name, t in _tensors(generated["qwen3moe-tied"].path).items():
        if "ffn_gate_inp" in name:
            rows = np.asarray(t.data)
            np.testing.assert_array_equal(rows[1], rows[0])
            assert len({r.tobytes() for r in rows}) == len(rows) - 1, name


def test_special_tokens_can_never_win(generated: dict):
    for name in ("qwen3moe", "wide", "qwen3moe-q8_0"):
        t = _tensors(generated[name].path)["output.weight"]
        rows = dequantize(np.asarray(t.data), t.tensor_type)
        assert not rows[256:].any() and rows[:256].any()
    embd = np.asarray(_tensors(generated["gemma4"].path)["token_embd.weight"].data)
    assert not embd[256:].any()


#: the default fixtures that run the cache gates (the others leave them out, saying why: skip_gates)
CACHE_DEFAULTS = [n for n in MOE_DEFAULTS if "cache" not in load_specs().specs[n].skip_gates]


@pytest.mark.parametrize("name", CACHE_DEFAULTS)
def test_experts_exceed_a_2_mib_cache(generated: dict, name: str):
    """The gates run `--cache-mb 2`: the experts of every default fixture that runs the cache gates must not
    all fit in it."""
    total = sum(int(t.n_bytes) for n, t in _tensors(generated[name].path).items() if "_exps." in n)
    assert 2.5 * 2**20 < total < 8 * 2**20, total


def test_the_default_set_holds_every_claimed_weight_type(generated: dict):
    """Every weight type the engine claims is a dense matrix of a default fixture, and every quantized one but
    Q8_0 an expert tensor of qwen3moe-types too (Q8_0 experts: qwen3moe-q8_0, trained-q8_0; F16 and BF16 are
    dense only, their kernels are the experts' too), so REF, DET-kernels, SCORE and XDEV run each type's
    kernels, one-token and prompt-batch, on every device."""
    from bmoe_ci.weight_types import BY_NAME

    claimed = {w.qtype for w in BY_NAME.values()}
    dense: set[int] = set()
    experts: set[int] = set()
    for name in DEFAULTS:
        for tname, t in _tensors(generated[name].path).items():
            if len(t.shape) == 1 or "ffn_gate_inp" in tname or tname.endswith(".bias") or "norm" in tname:
                continue
            (experts if "_exps." in tname else dense).add(int(t.tensor_type))
    assert claimed <= dense, sorted(Q(q).name for q in claimed - dense)
    assert claimed - {Q.F32, Q.F16, Q.BF16, Q.Q8_0} <= {
        int(t.tensor_type) for n, t in _tensors(generated["qwen3moe-types"].path).items() if "_exps." in n
    }
    assert {Q.F32, Q.Q8_0, Q.MXFP4} <= experts  # qwen3moe, qwen3moe-q8_0, gpt-oss-mxfp4


def test_manifest_is_json_sorted(generated: dict):
    text = (generated["qwen3moe"].path.parent / "manifest.json").read_text()
    assert json.loads(text)["fixtures"]
    assert list(json.loads(text)) == sorted(json.loads(text))


def test_concurrent_generators_share_one_directory(tmp_path: Path):
    """Two processes (e.g. xdist workers) generating into one directory: one generates, the other
    waits on the lock and then finds everything cached; both report the same files."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "bmoe_ci.models",
        "--out",
        str(tmp_path),
        "--name",
        "qwen3moe",
        "--name",
        "wide",
    ]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0][0] == outs[1][0] and outs[0][0].count("\n") == 2
    assert sum(err.count(": generating") for _, err in outs) == 2
    assert not list(tmp_path.glob(".tmp-*"))


def test_gemma3_is_dense_with_llama_cpps_keys_and_tensors(fixture_dir: Path):
    """The dense fixture: no expert key or tensor, every block's norms, the window without a pattern key
    (llama.cpp's period applies), linear RoPE scaling, tied output; refused with experts."""
    (fx,) = generate(fixture_dir, names=["gemma3"])
    meta, names = _meta(fx.path), set(_tensors(fx.path))
    assert missing_keys(meta) == [] and tensor_problems(meta, names) == []
    assert not any("expert" in k for k in meta)
    assert not any("exps" in n or "ffn_gate_inp" in n for n in names)
    assert meta["gemma3.attention.sliding_window"] == 8 and "gemma3.attention.sliding_window_pattern" not in meta
    assert meta["gemma3.rope.scaling.type"] == "linear" and meta["gemma3.rope.scaling.factor"] == 4.0
    assert "output.weight" not in names
    assert {f"blk.5.{n}.weight" for n in ("post_attention_norm", "post_ffw_norm", "ffn_gate")} <= names
    assert tensor_problems(meta, names | {"blk.0.ffn_gate_inp.weight"}) == [
        "not created by llama.cpp: blk.0.ffn_gate_inp.weight"
    ]
    doc = copy.deepcopy(_spec_doc())
    spec = next(f for f in doc["fixtures"] if f["name"] == "gemma3")
    spec["dims"].update(experts=4, top_k=2, expert_ffn=32)
    with pytest.raises(SpecError, match=r"'gemma3': dims: llama.cpp's gemma3 is dense"):
        parse_specs(doc)

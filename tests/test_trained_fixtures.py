"""The committed fixtures (`file:` + `sha256:` specs): the trained model, its hashes, the held-out
texts and the multiple-choice set (docs/trained-model.md)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from gguf import GGUFReader

from bmoe_ci.models import CommittedSpec, SpecError, generate, load_specs, read_manifest
from bmoe_ci.models.spec import default_specs_path

REPO = Path(__file__).resolve().parents[1]
TRAINED = REPO / "fixtures" / "trained"
COMMITTED = ["trained", "trained-q8_0"]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sums() -> dict[str, str]:
    out = {}
    for line in (TRAINED / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        out[name] = digest
    return out


def test_sha256sums_match_the_committed_files():
    sums = _sums()
    assert sorted(sums) == ["trained-q8_0.gguf", "trained.gguf"]
    for name, digest in sums.items():
        assert _sha256(TRAINED / name) == digest, f"{name} does not match fixtures/trained/SHA256SUMS"


@pytest.mark.parametrize("name", COMMITTED)
def test_spec_records_the_files_hash_and_shape(name: str):
    spec = load_specs().specs[name]
    assert isinstance(spec, CommittedSpec)
    path = spec.source(default_specs_path().parent)
    assert path.parent == TRAINED
    assert _sums()[path.name] == spec.sha256
    # the declared shape is the file's: the gate plan and --list read it from the spec
    f = {k: v.contents() for k, v in GGUFReader(path).fields.items()}
    a = spec.arch
    d = spec.dims
    assert f["general.architecture"] == a
    assert f["general.file_type"] == (7 if spec.dtype == "Q8_0" else 0)
    assert (f[f"{a}.block_count"], f[f"{a}.embedding_length"], f[f"{a}.context_length"]) == (d.layers, d.d, d.context)
    assert (f[f"{a}.attention.head_count"], f[f"{a}.attention.head_count_kv"]) == (d.heads, d.n_kv_heads)
    assert f[f"{a}.attention.key_length"] == d.k_dim
    assert (f[f"{a}.expert_count"], f[f"{a}.expert_used_count"]) == (d.experts, d.top_k)
    assert f[f"{a}.expert_feed_forward_length"] == d.expert_ffn
    assert f[f"{a}.expert_gating_func"] == spec.gating.func
    assert f[f"{a}.expert_weights_norm"] == spec.gating.norm
    assert f[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(spec.eps)
    assert f[f"{a}.rope.freq_base"] == pytest.approx(spec.rope_base)
    assert f["general.name"] == name


def test_generate_copies_the_verified_files(tmp_path: Path):
    got = {f.name: f for f in generate(tmp_path, names=COMMITTED)}
    for name in COMMITTED:
        assert got[name].path == tmp_path / f"{name}.gguf"
        assert got[name].sha256 == load_specs().specs[name].sha256 == _sha256(got[name].path)
    assert read_manifest(tmp_path)["fixtures"]["trained"]["sha256"] == got["trained"].sha256


def _committed_doc(tmp_path: Path, data: bytes, digest: str) -> Path:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "x.gguf").write_bytes(data)
    spec = yaml.safe_load(default_specs_path().read_text())
    trained = next(f for f in spec["fixtures"] if f["name"] == "trained")
    doc = {"version": 1, "fixtures": [{**trained, "file": "m/x.gguf", "sha256": digest}]}
    p = tmp_path / "specs.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_a_hash_mismatch_is_one_clear_error_every_time_it_is_used(tmp_path: Path):
    data = b"GGUF stand-in: the cache only copies and hashes it"
    specs = _committed_doc(tmp_path, data, hashlib.sha256(data).hexdigest())
    out = tmp_path / "out"
    (fx,) = generate(out, names=["trained"], specs_path=specs)
    assert fx.path.read_bytes() == data
    # the committed file changes (the cached copy is intact): the next use refuses it
    (tmp_path / "m" / "x.gguf").write_bytes(data + b"!")
    with pytest.raises(SpecError) as err:
        generate(out, names=["trained"], specs_path=specs)
    msg = str(err.value)
    assert msg.startswith(f"{specs}: fixture 'trained': file: ") and "m/x.gguf has sha256 " in msg, msg
    assert hashlib.sha256(data).hexdigest() in msg


def test_a_missing_committed_file_is_one_clear_error(tmp_path: Path):
    specs = _committed_doc(tmp_path, b"x", "0" * 64)
    (tmp_path / "m" / "x.gguf").unlink()
    with pytest.raises(SpecError, match=r"fixture 'trained': file: .*m/x\.gguf does not exist"):
        generate(tmp_path / "out", names=["trained"], specs_path=specs)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sha256": "ABC"}, "sha256: expected 64 lowercase hex digits"),
        ({"file": "/abs/x.gguf"}, "file: '/abs/x.gguf' must be a relative path"),
        ({"file": "../x.gguf"}, "file: '../x.gguf' must be a relative path"),
        ({"seed": 3}, "seed: unknown key"),
    ],
)
def test_committed_spec_validation_names_the_key(tmp_path: Path, change: dict, expected: str):
    p = _committed_doc(tmp_path, b"x", "0" * 64)
    doc = yaml.safe_load(p.read_text())
    doc["fixtures"][0].update(change)
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=f"fixture 'trained': {expected}"):
        load_specs(p)


def test_a_fixture_without_sha256_is_refused(tmp_path: Path):
    p = _committed_doc(tmp_path, b"x", "0" * 64)
    doc = yaml.safe_load(p.read_text())
    del doc["fixtures"][0]["sha256"]
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="fixture 'trained': sha256: required key missing"):
        load_specs(p)


# ------------------------------------------------------------------ held-out texts and choices


def _heldout() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="ascii") for p in sorted((TRAINED / "heldout").glob("*.txt"))}


def test_heldout_texts_fit_the_context():
    spec = load_specs().specs["trained"]
    texts = _heldout()
    assert len(texts) >= 3
    for name, text in texts.items():
        assert 0 < len(text.encode()) <= spec.dims.context, name


def _choices_module():
    path = REPO / "fixtures" / "train" / "choices.py"
    mod_spec = importlib.util.spec_from_file_location("trained_choices", path)
    assert mod_spec is not None and mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules["trained_choices"] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def test_choices_are_well_formed_and_answerable_from_the_heldout_text():
    texts = _heldout()
    lines = (TRAINED / "choices.jsonl").read_text().splitlines()
    assert 50 <= len(lines) <= 100
    ids = set()
    for line in lines:
        q = json.loads(line)
        assert set(q) == {"id", "context", "options", "answer"}
        assert q["id"] not in ids
        ids.add(q["id"])
        opts, ans = q["options"], q["answer"]
        assert len(opts) == 4 and len(set(opts)) == 4 and 0 <= ans < 4
        assert len({len(o.encode()) for o in opts}) == 1  # equal lengths: summed log-probs compare fairly
        source = texts[q["id"].rsplit("-", 1)[0]]
        assert q["context"] + opts[ans] in source  # the right option is the real continuation
        assert all(q["context"] + o not in source for i, o in enumerate(opts) if i != ans)


def test_choices_file_is_what_the_generator_makes():
    mod = _choices_module()
    qs = mod.generate(_heldout())
    expected = "".join(json.dumps(q, ensure_ascii=True) + "\n" for q in qs)
    assert (TRAINED / "choices.jsonl").read_text() == expected


def test_a_recommitted_file_replaces_the_cached_copy(tmp_path: Path):
    """A new committed file with its new sha256 replaces the cached copy (the spec hash covers sha256)."""
    data = b"first"
    specs = _committed_doc(tmp_path, data, hashlib.sha256(data).hexdigest())
    out = tmp_path / "out"
    generate(out, names=["trained"], specs_path=specs)
    new = b"second"
    specs = _committed_doc(tmp_path, new, hashlib.sha256(new).hexdigest())
    (fx,) = generate(out, names=["trained"], specs_path=specs)
    assert fx.path.read_bytes() == new

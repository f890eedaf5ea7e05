"""Gate TOK's inputs and the reference tokenizer (docs/gates.md, TOK; docs/fixtures.md, vocabularies):

* the reference tokenizer (bmoe_ci.reference.tokenizer) gives the Hugging Face tokenizers' ids on
  llama.cpp's vocabulary test sets (the full GPT-2, Phi-3 and LLaMA SentencePiece vocabularies);
* the committed cut vocabularies are whole (every merge makes the next token from earlier ones, every
  byte has a token) and `python -m bmoe_ci.models.vocab derive` makes them again, byte for byte;
* the ids pinned from llama.cpp (gates/data/tok/pinned.json) belong to the committed texts and
  vocabularies, and the reference tokenizer, written independently of llama.cpp and of the engine, gives
  the same ids for every held text under every configuration; with llama-cpp-python installed, llama.cpp
  gives them again.

That TOK fails on an engine that cuts a text differently is tests/test_gate_faults.py's (the TOK_* faults).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader

from bmoe_ci import tokgate, vocabs
from bmoe_ci.models import vocab as V
from bmoe_ci.reference.eog import EOG_TEXTS, FIM_KINDS, eog_ids
from bmoe_ci.reference.tokenizer import Tokenizer

FIM = {t for _, texts in FIM_KINDS for t in texts}


def _tokenizer(path: Path) -> Tokenizer:
    r = GGUFReader(str(path))

    def get(key: str, default: Any = None) -> Any:
        f = r.fields.get(key)
        return default if f is None else f.contents()

    vocab = list(get("tokenizer.ggml.tokens"))
    eog = eog_ids(vocab, get)
    return Tokenizer.from_metadata(get, frozenset(i for i in eog if vocab[i] in EOG_TEXTS or vocab[i] in FIM))


@pytest.fixture(scope="module")
def vocab_models() -> Path:
    try:
        return vocabs.fetch()
    except vocabs.VocabFetchError as exc:
        pytest.fail(f"the vocabulary test sets are needed and could not be fetched: {exc}")


@pytest.mark.parametrize("name", ["gpt-2", "phi-3", "llama-spm"])
def test_reference_tokenizer_matches_the_test_sets(vocab_models: Path, name: str) -> None:
    case = vocabs.load(name)
    tok = _tokenizer(case.gguf)
    for text, want in zip(case.texts, case.ids, strict=True):
        assert tok.tokenize(text, add_special=False) == list(want), (name, text)


@pytest.mark.parametrize("name", [c.name for c in V.CUTS])
def test_committed_cuts_are_whole(name: str) -> None:
    v = V.load_vocab(name)
    assert v.n_vocab == 2048 and len(v.types) == v.n_vocab
    ids = {t: i for i, t in enumerate(v.tokens)}
    if v.model == "gpt2":
        assert v.merges is not None and len(v.merges) == v.n_vocab - 256 - 3
        assert all(ids[V.bytes_to_unicode()[b]] < 256 for b in range(256))
        for i, m in enumerate(v.merges):  # rank order: merge i makes token 256 + i from earlier tokens
            left, _, right = m.partition(" ")
            assert ids[left + right] == 256 + i and ids[left] < 256 + i and ids[right] < 256 + i, m
    else:
        assert v.scores is not None and len(v.scores) == v.n_vocab
        assert all(f"<0x{b:02X}>" in ids for b in range(256))
        assert all(s == s and abs(s) < float("inf") for s in v.scores)  # finite: a NaN score is refused
    specials = [v.tokens[i] for i in v.special_ids]
    assert set(V.CUTS[[c.name for c in V.CUTS].index(name)].specials) <= set(specials)
    assert v.eos is not None and v.tokens[v.eos] == "<|endoftext|>"


def test_derive_makes_the_committed_cuts_again(vocab_models: Path, tmp_path: Path) -> None:
    written = V.derive(vocab_models, tmp_path)
    for path in written:
        assert path.read_bytes() == V.vocab_path(path.stem).read_bytes(), path.name


def test_pinned_ids_belong_to_the_inputs(tmp_path: Path) -> None:
    pinned = tokgate.load_pinned()
    files = tokgate.write_inputs(tmp_path)
    assert pinned.stale(files) is None
    assert set(pinned.configs) == {c.name for c in tokgate.CONFIGS}
    texts = tokgate.texts()
    for cfg in pinned.configs.values():
        assert len(cfg["ids"]) == len(cfg["decoded_hex"]) == len(texts)
    # a changed text is noticed, not passed
    doc = json.loads((tokgate.data_dir() / "texts.json").read_text())
    assert tokgate._sha(tokgate.texts_blob([*doc["texts"], "one more"])) != pinned.texts_sha256


def test_reference_tokenizer_gives_the_pinned_ids(tmp_path: Path) -> None:
    """Two independent implementations agree on every held text: llama.cpp (pinned) and the reference."""
    pinned = tokgate.load_pinned()
    files = tokgate.write_inputs(tmp_path)
    texts = tokgate.texts()
    for c in tokgate.CONFIGS:
        tok = _tokenizer(files[c.filename])
        want = pinned.configs[c.name]["ids"]
        for i, text in enumerate(texts):
            assert tok.tokenize(text) == want[i], (c.name, i, text)


def test_llama_cpp_gives_the_pinned_ids_again(tmp_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the bench extra) is not installed")
    pinned = tokgate.load_pinned()
    files = tokgate.write_inputs(tmp_path)
    texts = tokgate.texts()
    for c in tokgate.CONFIGS:
        llm = llama_cpp.Llama(model_path=str(files[c.filename]), vocab_only=True, verbose=False)
        try:
            for i, text in enumerate(texts):
                assert llm.tokenize(text.encode(), add_bos=True, special=True) == pinned.configs[c.name]["ids"][i]
        finally:
            llm.close()

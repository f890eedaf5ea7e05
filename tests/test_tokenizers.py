"""The engine's tokenizers against llama.cpp's vocabulary test sets (ids the Hugging Face tokenizers
give for held-out texts), the byte-level fixtures' tokenization, --chat, and refusals of malformed
tokenizer metadata (docs/tokenizers.md).

The test sets are downloaded once into the cache (bmoe_ci.vocabs, PyPI); a failed download fails
these tests with the reason: CI depends on them. When llama-cpp-python is importable (the bench extra),
tests/test_tokenizers_llama_cpp.py also compares with llama.cpp itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import TokenType

from bmoe_ci import vocabs
from bmoe_ci.models.model import SPECIAL_TOKENS
from bmoe_ci.models.vocab import bytes_to_unicode
from vocab_files import fixture_vocab, write_vocab


@pytest.fixture(scope="module")
def vocab_models() -> Path:
    try:
        return vocabs.fetch()
    except vocabs.VocabFetchError as exc:
        pytest.fail(f"the vocabulary test sets are needed and could not be fetched: {exc}")


@pytest.mark.parametrize("name", vocabs.SUPPORTED)
def test_held_out_texts(engine_bin: Path, vocab_models: Path, tmp_path: Path, name: str) -> None:
    """Every held-out text of the vocabulary, in one engine process, gives the expected ids (no
    BOS/EOS: the test sets have none); decoding the ids gives the text back up to llama.cpp's
    clean-up of spaces before punctuation."""
    case = vocabs.load(name)
    got = vocabs.engine_tokenize(engine_bin, case.gguf, case.texts, tmp_path, "--no-special")
    wrong = [(t, e, g.ids) for t, e, g in zip(case.texts, case.ids, got, strict=True) if e != g.ids]
    assert not wrong, f"{name}: {len(wrong)} of {len(case.texts)} texts differ, first {wrong[0]!r}"
    for text, g in zip(case.texts, got, strict=True):
        want = text.encode()
        if g.decoded != want:  # only the clean-up may differ: " ," " ." " !" " ?" " 's" ...
            for p in (b" ?", b" !", b" .", b" ,", b" 's", b" 'm", b" 're", b" 've"):
                want = want.replace(p, p[1:])
        assert g.decoded == want, f"{name}: {text!r} decodes to {g.decoded!r}"


def test_bos_and_specials(engine_bin: Path, vocab_models: Path, tmp_path: Path) -> None:
    """SentencePiece adds BOS and a space prefix, also after a special token; a control token's text
    is that token only when specials are parsed; BPE adds nothing for llama-bpe's metadata."""
    spm = vocabs.load("llama-spm")
    texts = ["Hello world", "Hello</s>world", ""]
    a = vocabs.engine_tokenize(engine_bin, spm.gguf, texts, tmp_path)
    plain = vocabs.engine_tokenize(engine_bin, spm.gguf, texts, tmp_path, "--no-special", "--no-parse-special")
    assert a[0].ids[0] == 1 and a[0].ids[1:] == plain[0].ids
    assert 2 in a[1].ids and 2 not in plain[1].ids
    i = a[1].ids.index(2)
    world = vocabs.engine_tokenize(engine_bin, spm.gguf, ["world"], tmp_path, "--no-special")[0].ids
    assert a[1].ids[i + 1 :] == world  # "world" after </s> gets its space prefix back
    assert a[2].ids == (1,) and plain[2].ids == ()


def test_byte_level_fixture_vocabulary(engine_bin: Path, tmp_path: Path) -> None:
    """The fixtures keep one token per byte: token id == byte value for ASCII, UTF-8 and digit runs;
    their control texts are parsed as the control tokens."""
    path = fixture_vocab(tmp_path)
    texts = ["Determinism, please.", "caf\u00e9 \u4e2d\u6587 12345  \n\t x", "a'b; rm -rf ~"]
    got = vocabs.engine_tokenize(engine_bin, path, texts, tmp_path)
    for t, g in zip(texts, got, strict=True):
        assert list(g.ids) == list(t.encode()), t
        assert g.decoded == t.encode()
    im_start = 256 + SPECIAL_TOKENS.index("<|im_start|>")
    g = vocabs.engine_tokenize(engine_bin, path, ["<|im_start|>hi"], tmp_path)[0]
    assert g.ids == (im_start, ord("h"), ord("i"))
    assert vocabs.engine_tokenize(engine_bin, path, ["<|im_start|>"], tmp_path, "--no-parse-special")[0].ids == tuple(
        b"<|im_start|>"
    )
    assert bytes_to_unicode()[ord(" ")] == "\u0120"  # the images the vocabulary is made of


def test_chat_wraps_one_user_turn(engine_bin: Path, tmp_path: Path) -> None:
    """--chat renders the prompt as one chatml user turn plus the generation prompt, then tokenizes
    it with specials parsed; a model without a recognised template refuses --chat (exit 2)."""
    tmpl = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    path = fixture_vocab(tmp_path, chat_template=tmpl)
    got = vocabs.engine_tokenize(engine_bin, path, ["hi"], tmp_path, "--chat")[0]
    s, e = 256 + SPECIAL_TOKENS.index("<|im_start|>"), 256 + SPECIAL_TOKENS.index("<|im_end|>")
    want = [s, *b"user\nhi", e, *b"\n", s, *b"assistant\n"]
    assert list(got.ids) == want
    plain = fixture_vocab(tmp_path)
    proc = subprocess.run(
        [str(engine_bin), "tokenize", "-m", str(plain), "-p", "hi", "--chat"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.startswith("bmoe: error: --chat: the model has no chat template") and proc.stderr.count("\n") == 1
    )


def test_run_chat_refused_without_template(engine_bin: Path, tmp_path: Path, fixtures: dict[str, Path]) -> None:
    """`bmoe run --chat` on a fixture (no tokenizer.chat_template): one line, exit 2."""
    name = sorted(fixtures)[0]
    proc = subprocess.run(
        [str(engine_bin), "run", "--mmap", "-m", str(fixtures[name]), "-p", "hi", "--chat", "-n", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--chat" in proc.stderr and proc.stderr.count("\n") == 1


def _spm_tokens() -> tuple[list[str], list[int]]:
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "a"]
    types = [int(TokenType.UNKNOWN), int(TokenType.CONTROL), int(TokenType.CONTROL)] + [int(TokenType.BYTE)] * 256
    return toks, types + [int(TokenType.NORMAL)] * 2


MALFORMED = {
    "merge_unknown_token": (
        lambda p: write_vocab(p, ["a", "b", "ab"], [1, 1, 1], merges=["a zz"]),
        "tokenizer.ggml.merges[0] names a token",
    ),
    "merge_result_unknown": (
        lambda p: write_vocab(p, ["a", "b"], [1, 1], merges=["a b"]),
        "merges into a text the vocabulary does not have",
    ),
    "merge_without_space": (lambda p: write_vocab(p, ["a", "b", "ab"], [1, 1, 1], merges=["ab"]), "no space"),
    "types_not_integers": (
        lambda p: write_vocab(p, ["a", "b"], [1, 1], types_wrong=True),
        "tokenizer.ggml.token_type",
    ),
    "spm_without_scores": (
        lambda p: write_vocab(p, *_spm_tokens(), model="llama", pre=None),
        "tokenizer.ggml.scores is missing",
    ),
    "spm_nan_score": (
        lambda p: write_vocab(p, *_spm_tokens(), model="llama", pre=None, scores=[0.0] * 260 + [float(np.nan)]),
        "is not a number",
    ),
    "unknown_pre": (lambda p: write_vocab(p, ["a"], [1], pre="starcoder"), "tokenizer.ggml.pre"),
    "unknown_model": (lambda p: write_vocab(p, ["a"], [1], model="bert"), "tokenizer.ggml.model"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_tokenizer_metadata(engine_asan_bin: Path, tmp_path: Path, name: str) -> None:
    """Bad tokenizer metadata: one line naming the file and the key, exit 3, no crash (ASan build)."""
    make, expect = MALFORMED[name]
    path = make(tmp_path / f"{name}.gguf")
    proc = subprocess.run(
        [str(engine_asan_bin), "tokenize", "-m", str(path), "-p", "a"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and str(path) in proc.stderr and expect in proc.stderr, proc.stderr

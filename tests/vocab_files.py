"""Small vocabulary-only GGUF files for the tokenizer tests (tests/test_tokenizers*.py)."""

from __future__ import annotations

from pathlib import Path

from gguf import GGUFWriter

from bmoe_ci.models.model import vocabulary


def write_vocab(
    path: Path,
    tokens: list[str],
    types: list[int],
    model: str = "gpt2",
    pre: str | None = "qwen2",
    merges: list[str] | None = None,
    scores: list[float] | None = None,
    chat_template: str | None = None,
    types_wrong: bool = False,
) -> Path:
    w = GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if types_wrong:
        w.add_array("tokenizer.ggml.token_type", [str(t) for t in types])
    else:
        w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_eos_token_id(len(tokens) - 1)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fixture_vocab(tmp_path: Path, chat_template: str | None = None) -> Path:
    """The fixtures' tokenizer metadata (byte-level: GPT-2 byte images in byte order, no merges, pre
    qwen2, then the control tokens) without their tensors."""
    tokens, types = vocabulary()
    return write_vocab(tmp_path / "fixture-vocab.gguf", tokens, types, merges=[], chat_template=chat_template)

"""The end-of-generation tokens of a vocabulary, as docs/tokenizers.md#end-of-generation states llama.cpp's
rule: greedy generation stops after producing any of them.

Written from that description, not from the engine's C, so that the gates' reference stops where a
correct engine stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: token texts that end generation wherever they appear in a vocabulary
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})  # fmt: skip

#: per fill-in-the-middle kind that ends generation: its id key, and the texts that stand for it without one
FIM_KINDS = (
    ("tokenizer.ggml.fim_pad_token_id", ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    ("tokenizer.ggml.fim_rep_token_id", ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)),
)

#: the EOS a vocabulary has without an eos_token_id key, per tokenizer.ggml.model
DEFAULT_EOS = {"gpt2": 11, "llama": 2}


def eog_ids(vocab: Sequence[str], get: Callable[[str, Any], Any]) -> frozenset[int]:
    """`get(key, default)` reads the GGUF metadata."""
    n = len(vocab)
    ids = {text: i for i, text in enumerate(vocab)}  # a repeated text: the last id, as the loaders do
    out: set[int] = set()
    for key, texts in FIM_KINDS:
        val = get(key, None)
        found = [ids[t] for t in texts if t in ids]
        if val is not None:
            out.add(int(val))
        elif found:
            out.add(min(found))
    out.update(i for t, i in ids.items() if t in EOG_TEXTS)
    eos = get("tokenizer.ggml.eos_token_id", None)
    if eos is None:
        eos = DEFAULT_EOS.get(str(get("tokenizer.ggml.model", "gpt2")))
    for v in (eos, get("tokenizer.ggml.eot_token_id", None), get("tokenizer.ggml.eom_token_id", None)):
        if v is not None and 0 <= int(v) < n:
            out.add(int(v))
    eog_texts = {vocab[i] for i in out}
    if "<|end|>" in eog_texts and eog_texts & {"<|call|>", "<|calls|>"} and eog_texts & {"<|return|>", "<|flush|>"}:
        out.discard(ids["<|end|>"])
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        out.discard(ids["</s>"])
    return frozenset(out)


#: gpt-oss's harmony markers: user-defined in any vocabulary (llama.cpp prints them and finds them in any text)
RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def retyped(vocab: Sequence[str], eog: frozenset[int]) -> dict[int, int]:
    """The token types llama.cpp's loader changes beside the end-of-generation set (eog_ids): the harmony
    markers become user-defined, an `<|end|>` that left the set user-defined and a `</s>` that left it
    normal. Applied after the end-of-generation tokens found by text became control tokens."""
    ids = {text: i for i, text in enumerate(vocab)}
    out = {ids[t]: 4 for t in RENDERED if t in ids}
    if "<|end|>" in ids and ids["<|end|>"] not in eog:
        out[ids["<|end|>"]] = 4
    if "</s>" in ids and ids["</s>"] not in eog:
        out[ids["</s>"]] = 1
    return out

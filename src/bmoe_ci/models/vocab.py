"""The fixtures' vocabularies (docs/fixtures.md, "Vocabularies").

`bytes` is the vocabulary every fixture had first: the 256 GPT-2 byte images in byte order, then
`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, and no merges (one token per byte). The others are real
vocabularies cut down to a few thousand tokens and committed as JSON under `fixtures/vocabs/`: the
first tokens of a model's vocabulary in its own order (for a byte-level BPE the merges that make them,
for a SentencePiece the pieces with their scores), plus that model's chat specials. A cut keeps the
rules whole: a BPE vocabulary lists its merges in rank order and merge `i` makes token `256 + i`, so
the first `n` merges make exactly the first `256 + n` tokens; a SentencePiece vocabulary lists its
pieces by falling score, so the cut keeps the likeliest pieces and byte fallback spells the rest.

The cut vocabularies come from the test vocabularies llama.cpp ships (`models/ggml-vocab-*.gguf` in
the llama-cpp-python source distribution, `bmoe_ci.vocabs.fetch`), by::

    python -m bmoe_ci.models.vocab derive          # rewrites fixtures/vocabs/*.json

which needs the network once (pip download of the source distribution); everything after that (the
fixtures, the gates, CI) reads the committed files only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFValueType

from bmoe_ci.paths import Places

SCHEMA = "bmoe-ci.vocab/1"
BYTES = "bytes"
#: token types of tokenizer.ggml.token_type (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Cut:
    """How one committed vocabulary is cut from a llama.cpp test vocabulary."""

    name: str
    source: str  # ggml-vocab-<source>.gguf
    size: int  # tokens in the cut vocabulary, specials included
    specials: tuple[str, ...]  # the source's chat specials kept, renumbered after the cut
    about: str


#: the committed vocabularies (fixtures/vocabs/<name>.json)
CUTS = (
    Cut(
        "qwen2-2k",
        "qwen2",
        2048,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        "Qwen2's byte-level BPE (pre-tokenizer qwen2): its 256 byte tokens, 1789 of its merges in rank order "
        "(every merge the gates' texts use under the full vocabulary, the merges those are made of, then the "
        "lowest ranks) with the tokens they make, and its three chatml specials",
    ),
    Cut(
        "phi3-spm-2k",
        "phi-3",
        2048,
        ("<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"),
        "Phi-3's SentencePiece vocabulary (byte fallback): <unk>, <s>, </s>, the 256 byte tokens, its "
        "1784 highest-scoring pieces with their scores, and its five chat specials",
    ),
)


@dataclass(frozen=True)
class Vocab:
    """A vocabulary as the GGUF tokenizer keys hold it."""

    name: str
    model: str  # tokenizer.ggml.model: gpt2 | llama | gemma4
    pre: str | None  # tokenizer.ggml.pre
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    merges: tuple[str, ...] | None  # gpt2: "left right" in rank order
    scores: tuple[float, ...] | None  # llama
    bos: int | None
    eos: int | None
    unk: int | None = None
    pad: int | None = None
    add_bos: bool | None = None  # None: the key is not written (llama.cpp's default applies)
    add_eos: bool | None = None
    chat_template: str | None = None
    add_space_prefix: bool | None = None

    @property
    def bos_always(self) -> bool:
        """llama.cpp adds this tokenizer's BOS to every prompt whatever add_bos_token says (gemma4)."""
        return self.model == GEMMA4

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def special_ids(self) -> list[int]:
        """Tokens that are not text (control, unknown, unused): their output logit is held at 0."""
        return [i for i, t in enumerate(self.types) if t in (UNKNOWN, CONTROL, UNUSED)]

    def with_pre(self, pre: str | None, add_bos: bool | None) -> Vocab:
        """The same tokens under another pre-tokenizer (the TOK gate's configurations)."""
        return Vocab(**{**self.__dict__, "pre": pre, "add_bos": add_bos})

    def to_json(self) -> dict[str, Any]:
        # add_space_prefix only where written (gemma4_vocab): the committed cuts leave llama.cpp's default
        return {
            "schema": SCHEMA,
            **{k: v for k, v in self.__dict__.items() if k != "add_space_prefix" or v is not None},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Vocab:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"vocabulary: schema {data.get('schema')!r}, expected {SCHEMA}")
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("tokens", "types", "merges", "scores"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        return cls(**fields)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: the specials of gpt-oss's o200k_harmony vocabulary that decide its end-of-generation set (tokenizer
#: `gpt-4o`): <|return|> and <|call|> end generation, and with both present <|end|> does not
HARMONY_SPECIALS = ("<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>")
#: the generated vocabularies a fixture's `tokenizer` names (spec.FixtureSpec.tokenizer): the byte-level
#: ones, as tokenizer.ggml.pre and the specials after the 256 byte images; and gemma4 (gemma4_vocab)
BYTE_TOKENIZERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "qwen2": ("qwen2", BYTE_SPECIALS),
    "qwen35": ("qwen35", BYTE_SPECIALS),
    "lfm2": ("lfm2", BYTE_SPECIALS),
    "gpt-4o": ("gpt-4o", HARMONY_SPECIALS),
}
GEMMA4 = "gemma4"
BYTE_EOS = 256


def byte_vocab(tokenizer: str = "qwen2") -> Vocab:
    """The byte-level vocabulary: one token per byte (no merges), then the tokenizer's specials; EOS and
    BOS 256, no BOS added; tokenizer.ggml.pre is `tokenizer`'s."""
    pre, specials = BYTE_TOKENIZERS[tokenizer]
    table = bytes_to_unicode()
    tokens = tuple(table[b] for b in range(256)) + specials
    types = (NORMAL,) * 256 + (CONTROL,) * len(specials)
    return Vocab(BYTES, "gpt2", pre, tokens, types, (), None, bos=BYTE_EOS, eos=BYTE_EOS, add_bos=False)


#: the gemma4 vocabulary (tokenizer.ggml.model gemma4): its specials (EOS 1, BOS 2, <unk> 3; <turn|>
#: ends generation by its text), the 256 byte tokens <0xXX>, the characters \t, \n, U+2581 (the space)
#: and printable ASCII, then the words the merges build, each merged left to right
GEMMA4_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>")
GEMMA4_WORDS = ("\u2581the", "\u2581quick", "\u2581brown", "\u2581fox", "ing", "\u2581Hello", "\u2581world", "er",
                "\u2581is", "\u2581a", "\n\n", "ism", ",\u2581")  # fmt: skip


def gemma4_vocab() -> Vocab:
    """Gemma 4's tokenizer as its converter writes it (BPE over UTF-8 with U+2581 for spaces, byte
    fallback, BOS always; docs/tokenizers.md), on a small generated vocabulary."""
    tokens = list(GEMMA4_SPECIALS)
    types = [CONTROL] * len(tokens)
    types[3] = UNKNOWN
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    chars = ["\t", "\n", "\u2581", *(chr(c) for c in range(0x21, 0x7F))]
    tokens += chars
    types += [NORMAL] * len(chars)
    merges: list[str] = []
    for w in GEMMA4_WORDS:
        for i in range(1, len(w)):
            merge, made = f"{w[:i]} {w[i]}", w[: i + 1]
            if merge not in merges:
                merges.append(merge)
            if made not in tokens:
                tokens.append(made)
                types.append(NORMAL)
    return Vocab(
        GEMMA4,
        GEMMA4,
        None,
        tuple(tokens),
        tuple(types),
        tuple(merges),
        None,
        bos=2,
        eos=1,
        unk=3,
        pad=0,
        add_bos=True,
        add_space_prefix=False,
    )


def fixture_vocab(vocab: str, tokenizer: str = "qwen2") -> Vocab:
    """A fixture's vocabulary: the committed one `vocab` names, else the generated one of `tokenizer`
    (byte-level under its pre-tokenizer, or gemma4's)."""
    if vocab != BYTES:
        return load_vocab(vocab)
    return gemma4_vocab() if tokenizer == GEMMA4 else byte_vocab(tokenizer)


def vocab_dir(places: Places | None = None) -> Path:
    return (places or Places()).source_tree() / "fixtures" / "vocabs"


def vocab_path(name: str, places: Places | None = None) -> Path:
    return vocab_dir(places) / f"{name}.json"


def known() -> tuple[str, ...]:
    return (BYTES, *(c.name for c in CUTS))


def load_vocab(name: str, places: Places | None = None) -> Vocab:
    if name == BYTES:
        return byte_vocab()
    path = vocab_path(name, places)
    try:
        return Vocab.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"vocabulary {name!r}: cannot read {path}: {exc}") from None


def vocab_digest(name: str, places: Places | None = None) -> str:
    """sha256 of what decides the vocabulary's bytes in a fixture (the committed file; `bytes`: its name)."""
    if name == BYTES:
        return hashlib.sha256(b"bytes/1").hexdigest()
    return hashlib.sha256(vocab_path(name, places).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------- metadata


def metadata(v: Vocab) -> list[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """(key, value, value type, array item type) of the tokenizer keys, in a fixed order."""
    STR, ARR, U32, BOOL = GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.UINT32, GGUFValueType.BOOL
    kv: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]] = [("tokenizer.ggml.model", v.model, STR, None)]
    if v.pre is not None:
        kv.append(("tokenizer.ggml.pre", v.pre, STR, None))
    kv += [
        ("tokenizer.ggml.tokens", list(v.tokens), ARR, STR),
        ("tokenizer.ggml.token_type", list(v.types), ARR, GGUFValueType.INT32),
    ]
    if v.merges is not None:
        kv.append(("tokenizer.ggml.merges", list(v.merges), ARR, STR))
    if v.scores is not None:
        kv.append(("tokenizer.ggml.scores", list(v.scores), ARR, GGUFValueType.FLOAT32))
    for key, value in (("eos", v.eos), ("bos", v.bos), ("unknown", v.unk), ("padding", v.pad)):
        if value is not None:
            kv.append((f"tokenizer.ggml.{key}_token_id", value, U32, None))
    if v.add_space_prefix is not None:
        kv.append(("tokenizer.ggml.add_space_prefix", v.add_space_prefix, BOOL, None))
    if v.add_bos is not None:
        kv.append(("tokenizer.ggml.add_bos_token", v.add_bos, BOOL, None))
    if v.add_eos is not None:
        kv.append(("tokenizer.ggml.add_eos_token", v.add_eos, BOOL, None))
    if v.chat_template is not None:
        kv.append(("tokenizer.chat_template", v.chat_template, STR, None))
    return kv


def write_vocab_only(path: Path, v: Vocab, general_name: str) -> Path:
    """A vocabulary-only GGUF (no tensors): what `bmoe tokenize` and llama.cpp's vocab_only load read.
    `general_name` must not name a model llama.cpp treats specially (phi-3 strips spaces after specials)."""
    from .ggufwriter import EmptyArrayWriter

    w = EmptyArrayWriter(str(path), arch="llama")
    w.add_name(general_name)
    for key, value, vtype, sub in metadata(v):
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------- derive


def _bpe_keep(get: Any, tokens: list[str], texts: list[str], n_keep: int) -> list[int]:
    """The ids a byte-level BPE cut keeps: the byte tokens, every merged token the texts are made of under
    the full vocabulary (with the pre-tokenizers of gate TOK), with the tokens each of those merges from,
    and then the lowest-ranked merges until `n_keep`; in the vocabulary's order. Merge i of the full
    vocabulary makes token 256 + i, so any such set keeps its merges whole, in rank order."""
    from bmoe_ci.reference.tokenizer import PRE, Tokenizer

    parts: dict[int, tuple[int, int]] = {}
    ids = {t: i for i, t in enumerate(tokens)}
    for rank, m in enumerate(get("tokenizer.ggml.merges")):
        left, _, right = str(m).partition(" ")
        parts[256 + rank] = (ids[left], ids[right])
    used: set[int] = set()
    full = Tokenizer.from_metadata(get)
    for pre in ("qwen2", "llama-bpe", "gpt-2", "default"):
        assert pre in PRE
        tok = dataclasses.replace(full, pre=pre)
        for t in texts:
            used.update(i for i in tok.tokenize(t, add_special=False, parse_special=True) if i in parts)
    todo = list(used)
    while todo:  # the tokens each kept merge is made of
        for p in parts[todo.pop()]:
            if p >= 256 and p not in used:
                used.add(p)
                todo.append(p)
    if 256 + len(used) > n_keep:
        raise ValueError(f"the texts use {len(used)} merged tokens: more than the cut's {n_keep - 256}")
    keep = set(range(256)) | used
    nxt = 256
    while len(keep) < n_keep:
        keep.add(nxt)
        nxt += 1
    return sorted(keep)


def cut(c: Cut, source: Path, texts: list[str] | None = None) -> Vocab:
    """The cut vocabulary from llama.cpp's ggml-vocab-<source>.gguf (a BPE cut keeps what `texts` use)."""
    from gguf import GGUFReader

    r = GGUFReader(str(source))

    def get(key: str, default: Any = None) -> Any:
        f = r.fields.get(key)
        return default if f is None else f.contents()

    tokens: list[str] = list(get("tokenizer.ggml.tokens"))
    types: list[int] = [int(t) for t in get("tokenizer.ggml.token_type")]
    model = str(get("tokenizer.ggml.model"))
    ids = {t: i for i, t in enumerate(tokens)}
    missing = [s for s in c.specials if s not in ids]
    if missing:
        raise ValueError(f"{source.name}: no special token {missing[0]!r}")
    n_keep = c.size - len(c.specials)
    keep = list(range(n_keep))
    if model == "gpt2" and texts:
        keep = _bpe_keep(get, tokens, texts, n_keep)
    if any(types[i] not in (NORMAL, BYTE, UNKNOWN, CONTROL, USER_DEFINED) for i in keep):
        raise ValueError(f"{source.name}: an unused token among the first {n_keep}")
    new_tokens = [tokens[i] for i in keep] + list(c.specials)
    new_types = [types[i] for i in keep] + [types[ids[s]] for s in c.specials]
    remap = {old: new for new, old in enumerate(keep)} | {ids[s]: n_keep + j for j, s in enumerate(c.specials)}

    def mapped(key: str) -> int | None:
        old = get(key)
        if old is None:
            return None
        if int(old) not in remap:
            raise ValueError(f"{source.name}: {key} {old} is not kept by the cut")
        return remap[int(old)]

    merges: list[str] | None = None
    scores: list[float] | None = None
    if model == "gpt2":
        all_merges: list[str] = list(get("tokenizer.ggml.merges"))
        merges = [all_merges[t - 256] for t in keep[256:]]
        for i, m in enumerate(merges):  # merge i makes token 256 + i, from tokens before it
            left, _, right = m.partition(" ")
            made = remap.get(ids.get(left + right, -1))
            if made != 256 + i or remap.get(ids[left], n_keep) >= made or remap.get(ids[right], n_keep) >= made:
                raise ValueError(f"{source.name}: merge {i} ({m!r}) does not make token {256 + i} of the cut")
    elif model == "llama":
        all_scores = [float(s) for s in get("tokenizer.ggml.scores")]
        scores = [all_scores[i] for i in keep] + [all_scores[ids[s]] for s in c.specials]
    else:
        raise ValueError(f"{source.name}: tokenizer.ggml.model {model!r} is not cut here")
    add_bos, add_eos = get("tokenizer.ggml.add_bos_token"), get("tokenizer.ggml.add_eos_token")
    return Vocab(
        name=c.name,
        model=model,
        pre=get("tokenizer.ggml.pre"),
        tokens=tuple(new_tokens),
        types=tuple(new_types),
        merges=None if merges is None else tuple(merges),
        scores=None if scores is None else tuple(scores),
        bos=mapped("tokenizer.ggml.bos_token_id"),
        eos=mapped("tokenizer.ggml.eos_token_id"),
        unk=mapped("tokenizer.ggml.unknown_token_id"),
        pad=mapped("tokenizer.ggml.padding_token_id"),
        add_bos=None if add_bos is None else bool(add_bos),
        add_eos=None if add_eos is None else bool(add_eos),
        chat_template=get("tokenizer.chat_template"),
    )


def cut_texts(places: Places | None = None) -> list[str]:
    """The texts whose merges a BPE cut keeps: gate TOK's held texts and the gates' prompt and scoring
    inputs (gates/data)."""
    from bmoe_ci.reference import GATE_REQUEST

    data = (places or Places()).source_tree() / "gates" / "data"
    texts = list(json.loads((data / "tok" / "texts.json").read_text(encoding="utf-8"))["texts"])
    texts.append(GATE_REQUEST.prompt)
    texts += (data / "score.txt").read_text(encoding="utf-8").splitlines()
    texts += (data / "session.txt").read_text(encoding="utf-8").splitlines()
    for line in (data / "choices.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            q = json.loads(line)
            texts += [q["context"] + o for o in q["options"]]
    return texts


def derive(models: Path, out: Path) -> list[Path]:
    """Writes every cut of CUTS from llama.cpp's test vocabularies in `models` to `out`/<name>.json."""
    from bmoe_ci import vocabs

    written = []
    out.mkdir(parents=True, exist_ok=True)
    for c in CUTS:
        source = models / f"ggml-vocab-{c.source}.gguf"
        v = cut(c, source, cut_texts())
        doc = {
            "schema": SCHEMA,
            "about": c.about,
            "source": f"{vocabs.PACKAGE} {vocabs.VERSION}, vendor/llama.cpp/models/{source.name} (sha256 "
            f"{hashlib.sha256(source.read_bytes()).hexdigest()})",
            "command": "python -m bmoe_ci.models.vocab derive",
            **{k: val for k, val in v.to_json().items() if k != "schema"},
        }
        path = out / f"{c.name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
        written.append(path)
    return written


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bmoe_ci.models.vocab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("derive", help="cut the committed vocabularies from llama.cpp's test vocabularies")
    d.add_argument("--models", type=Path, help="a directory of ggml-vocab-*.gguf (default: bmoe_ci.vocabs.fetch())")
    d.add_argument("--out", type=Path, default=None, help="default: fixtures/vocabs of the source tree")
    args = ap.parse_args(argv)
    from bmoe_ci import vocabs

    try:
        models = args.models or vocabs.fetch()
        for p in derive(models, args.out or vocab_dir()):
            print(p)
    except (vocabs.VocabFetchError, ValueError, OSError) as exc:
        print(f"vocab: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

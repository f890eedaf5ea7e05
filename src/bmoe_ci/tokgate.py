"""The TOK gate's inputs: held texts, the tokenizer configurations they are cut with, and the token ids
llama.cpp gives for each (docs/gates.md, TOK).

A configuration is a vocabulary-only GGUF made from a committed vocabulary (bmoe_ci.models.vocab),
under one pre-tokenizer: the real vocabularies' tokens, merges and scores, so every device runs BPE
merges, SentencePiece scores, byte fallback, each pre-tokenizer's classes and the special tokens on
texts chosen for them (`gates/data/tok/texts.json`). The expected ids are llama.cpp's own
(`llama_tokenize(add_special=true, parse_special=true)` and `llama_detokenize` of them), pinned in
`gates/data/tok/pinned.json` by::

    python -m bmoe_ci.tokgate pin          # needs llama-cpp-python (the bench extra)

and checked against the files they were made from (the texts' and each vocabulary file's sha256), so a
changed text or vocabulary without a new pin is an error of the gate's setup, never a pass.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_ci.models.vocab import Vocab, load_vocab, write_vocab_only
from bmoe_ci.paths import Places

SCHEMA = "bmoe-ci.tok-pinned/1"
#: the device directory of the gate's inputs, beside the fixtures
TOK_DIR = "tok"
TEXTS_BLOB = "texts.bin"


@dataclass(frozen=True)
class TokConfig:
    name: str
    vocab: str  # a committed vocabulary (or `bytes`)
    pre: str | None = None  # another tokenizer.ggml.pre than the vocabulary's own
    keep_add_bos: bool = True  # False: no add_bos_token key (the pre-tokenizer's default applies)

    def make(self, places: Places | None = None) -> Vocab:
        v = load_vocab(self.vocab, places)
        if self.pre is None and self.keep_add_bos:
            return v
        return v.with_pre(self.pre if self.pre is not None else v.pre, v.add_bos if self.keep_add_bos else None)

    @property
    def filename(self) -> str:
        return f"tok-{self.name}.gguf"


CONFIGS = (
    TokConfig("bpe-qwen2", "qwen2-2k"),  # Qwen2's own: one digit per word
    # llama3's pattern on the same merges: numbers in threes, whole-token words taken as they are
    # (ignore_merges), and BOS added by the pre-tokenizer's default
    TokConfig("bpe-llama3", "qwen2-2k", pre="llama-bpe", keep_add_bos=False),
    TokConfig("bpe-gpt2", "qwen2-2k", pre="gpt-2"),
    TokConfig("bpe-default", "qwen2-2k", pre="default"),
    TokConfig("spm", "phi3-spm-2k"),  # scores, byte fallback, the space prefix after specials
    TokConfig("bytes", "bytes"),  # the generated fixtures' one token per byte
)


def data_dir(places: Places | None = None) -> Path:
    return (places or Places()).source_tree() / "gates" / "data" / TOK_DIR


def texts(places: Places | None = None) -> list[str]:
    return list(json.loads((data_dir(places) / "texts.json").read_text(encoding="utf-8"))["texts"])


def texts_blob(items: list[str]) -> bytes:
    """`bmoe tokenize --texts` input: every text NUL-terminated."""
    return b"".join(t.encode("utf-8") + b"\0" for t in items)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_inputs(out: Path, places: Places | None = None) -> dict[str, Path]:
    """The vocabulary-only GGUF of every configuration and the texts blob, in `out` (rewritten only
    when their bytes change). Returns file name -> path."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    # concurrent gate runs share the cache: each writes under a name of its own and renames into place
    # (atomic), so none reads another's half-written file or loses its temporary to another's rename
    part = f".part-{os.getpid()}-{secrets.token_hex(4)}"
    for c in CONFIGS:
        path = out / c.filename
        tmp = out / (c.filename + part)
        write_vocab_only(tmp, c.make(places), f"tok-{c.name}")
        if path.is_file() and path.read_bytes() == tmp.read_bytes():
            tmp.unlink()
        else:
            tmp.replace(path)
        files[c.filename] = path
    blob = texts_blob(texts(places))
    bpath = out / TEXTS_BLOB
    if not (bpath.is_file() and bpath.read_bytes() == blob):
        tmp = out / (TEXTS_BLOB + part)
        tmp.write_bytes(blob)
        tmp.replace(bpath)
    files[TEXTS_BLOB] = bpath
    return files


@dataclass(frozen=True)
class Pinned:
    texts_sha256: str
    configs: dict[str, dict[str, Any]]  # name -> {vocab_sha256, ids: [[id]], decoded_hex: [hex]}
    source: str

    def stale(self, inputs: dict[str, Path], places: Places | None = None) -> str | None:
        """Why the pinned ids do not belong to these inputs (None: they do)."""
        if _sha(texts_blob(texts(places))) != self.texts_sha256:
            return "gates/data/tok/texts.json changed since the ids were pinned"
        for c in CONFIGS:
            got = self.configs.get(c.name)
            if got is None:
                return f"configuration {c.name} has no pinned ids"
            if _sha(inputs[c.filename].read_bytes()) != got["vocab_sha256"]:
                return f"configuration {c.name}: its vocabulary file changed since the ids were pinned"
        return None


def load_pinned(places: Places | None = None) -> Pinned:
    doc = json.loads((data_dir(places) / "pinned.json").read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"gates/data/tok/pinned.json: schema {doc.get('schema')!r}, expected {SCHEMA}")
    return Pinned(doc["texts_sha256"], doc["configs"], doc["source"])


def pin(places: Places | None = None) -> Path:
    """Tokenizes every held text with llama.cpp (llama-cpp-python) under every configuration and writes
    gates/data/tok/pinned.json."""
    import ctypes
    import tempfile

    import llama_cpp

    items = texts(places)
    configs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = write_inputs(Path(tmp), places)
        for c in CONFIGS:
            path = files[c.filename]
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            ids, decoded = [], []
            for t in items:
                want = llm.tokenize(t.encode("utf-8"), add_bos=True, special=True)
                arr = (llama_cpp.llama_token * max(len(want), 1))(*want)
                cap = 64 + 64 * len(want)
                buf = ctypes.create_string_buffer(cap)
                n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(want), buf, cap, False, False)
                if n < 0:
                    raise RuntimeError("llama_detokenize: buffer too small")
                ids.append(list(want))
                decoded.append(buf.raw[:n].hex())
            configs[c.name] = {
                "vocab": c.vocab,
                "pre": c.make(places).pre,
                "vocab_sha256": _sha(path.read_bytes()),
                "ids": ids,
                "decoded_hex": decoded,
            }
        doc = {
            "schema": SCHEMA,
            "source": f"llama.cpp of llama-cpp-python {llama_cpp.__version__}: llama_tokenize(add_special=true, "
            "parse_special=true) and llama_detokenize(remove_special=false, unparse_special=false)",
            "command": "python -m bmoe_ci.tokgate pin",
            "texts_sha256": _sha(texts_blob(items)),
            "configs": configs,
        }
    out = data_dir(places) / "pinned.json"
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return out


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bmoe_ci.tokgate", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pin", help="pin llama.cpp's ids of the held texts (needs llama-cpp-python)")
    w = sub.add_parser("inputs", help="write the configurations' vocabulary files and the texts blob")
    w.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "pin":
        try:
            print(pin())
        except ImportError as exc:
            print(f"tokgate: error: llama-cpp-python is needed to pin the ids: {exc}", file=sys.stderr)
            return 1
    else:
        for p in write_inputs(args.out).values():
            print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

"""The reference tokenizer: text -> token ids as llama.cpp's `llama_tokenize(text, add_special=true,
parse_special=true)` gives them, for the vocabularies the engine supports (docs/tokenizers.md).

Written from that document and from llama.cpp's algorithms, never from the engine's C: the
pre-tokenizers are the models' own regular expressions run by the `regex` package (the engine has
hand-written matchers and its own Unicode table), byte-level BPE merges by rank and SentencePiece
pieces by score with the queue orders llama.cpp uses, Gemma 4's BPE over UTF-8 characters (U+2581 for
spaces, runs of newlines apart, byte fallback, BOS always), and the special tokens found before anything
else, longest first. REF and SCORE compare the engine's prompt and text tokens with
it; tests/test_reference_tokenizer.py holds it to llama.cpp's vocabulary test sets (the ids of the
Hugging Face tokenizers) and to llama.cpp itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import regex

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPECIAL_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
#: tokenizer.ggml.pre -> (the pre-tokenizer's expressions, applied one after the other; ignore_merges;
#: add_bos when the vocabulary has no add_bos_token key)
PRE: dict[str, tuple[tuple[str, ...], bool, bool]] = {}
for _names, _exprs, _ignore, _bos in (
    (("gpt-2", "phi-2", "mpt", "olmo"), (_GPT2,), False, False),
    (
        ("llama-bpe", "llama3", "llama-v3", "falcon3", "pixtral"),
        (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
        True,
        True,
    ),
    (
        ("qwen2", "deepseek-r1-qwen", "stablelm2"),
        (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
        False,
        False,
    ),
    (
        ("default",),
        (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
        False,
        False,
    ),
):
    for _n in _names:
        PRE[_n] = (_exprs, _ignore, _bos)


class TokenizerError(ValueError):
    """A vocabulary the reference does not model, or a text it cannot spell."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def utf8_chars(data: bytes) -> list[int]:
    """Code points of `data` the way llama.cpp reads them: a byte that does not start a whole, well-formed
    sequence (lead byte and continuation bytes only; no check of overlong forms or surrogates) is U+FFFD."""
    out: list[int] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(b)
            i += 1
            continue
        length = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 0
        if length and i + length <= n and all(data[i + k] & 0xC0 == 0x80 for k in range(1, length)):
            cp = b & (0x7F >> length)
            for k in range(1, length):
                cp = (cp << 6) | (data[i + k] & 0x3F)
            out.append(cp)
            i += length
        else:
            out.append(0xFFFD)
            i += 1
    return out


def _utf8(cps: Sequence[int]) -> bytes:
    return "".join(map(chr, cps)).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Tokenizer:
    model: str  # gpt2 | llama | gemma4
    pre: str
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    ranks: dict[tuple[str, str], int]
    scores: tuple[float, ...]
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    specials: tuple[int, ...]  # ids found in a text before anything else, longest text first

    @classmethod
    def from_metadata(
        cls, get: Callable[[str, Any], Any], eog: frozenset[int] = frozenset(), retype: dict[int, int] | None = None
    ) -> Tokenizer:
        """`get(key, default)` reads the GGUF metadata; `eog`: the end-of-generation tokens found by their
        text, which llama.cpp makes control tokens whatever their stored type; `retype`: the types its
        loader sets after that (eog.retyped: gpt-oss's markers and a dropped `<|end|>` user-defined)."""
        model = str(get("tokenizer.ggml.model", "gpt2"))
        tokens = tuple(str(t) for t in get("tokenizer.ggml.tokens", []))
        types = [int(t) for t in get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))]
        for i in eog:
            if types[i] in (NORMAL, USER_DEFINED):
                types[i] = CONTROL
        for i, t in (retype or {}).items():
            types[i] = t
        ranks: dict[tuple[str, str], int] = {}
        scores: tuple[float, ...] = ()
        if model == "gpt2":
            pre = str(get("tokenizer.ggml.pre", "default"))
            merges = list(get("tokenizer.ggml.merges", []))
            if pre not in PRE:
                if merges:
                    raise TokenizerError(f"tokenizer.ggml.pre {pre!r} is not modelled")
                pre = "default"  # without merges every byte is its own token, however the words are cut
            for rank, merge in enumerate(merges):
                left, sep, right = str(merge)[1:].partition(" ")  # the separator is the first space after 1
                if sep:
                    ranks.setdefault((str(merge)[0] + left, right), rank)
            default_bos, default_eos, space_prefix = PRE[pre][2], False, False
            bos_default = 11
        elif model == "gemma4":
            pre = "gemma4"
            for rank, merge in enumerate(get("tokenizer.ggml.merges", [])):
                left, sep, right = str(merge)[1:].partition(" ")
                if sep:
                    ranks.setdefault((str(merge)[0] + left, right), rank)
            default_bos, default_eos, space_prefix = True, False, False
            bos_default = 2
        elif model == "llama":
            pre = "spm"
            scores = tuple(float(s) for s in get("tokenizer.ggml.scores", [0.0] * len(tokens)))
            default_bos, default_eos, space_prefix = True, False, True
            bos_default = 1
        else:
            raise TokenizerError(f"tokenizer.ggml.model {model!r} is not modelled")
        bos = get("tokenizer.ggml.bos_token_id", bos_default if bos_default < len(tokens) else None)
        eos = get("tokenizer.ggml.eos_token_id", None)
        specials = sorted(
            (i for i, t in enumerate(types) if t in SPECIAL_TYPES and tokens[i]), key=lambda i: (-len(tokens[i]), i)
        )
        return cls(
            model=model,
            pre=pre,
            tokens=tokens,
            types=tuple(types),
            ranks=ranks,
            scores=scores,
            bos=None if bos is None else int(bos),
            eos=None if eos is None else int(eos),
            # llama.cpp adds BOS to a gemma4 prompt whatever the key says
            add_bos=model == "gemma4" or bool(get("tokenizer.ggml.add_bos_token", default_bos)),
            add_eos=bool(get("tokenizer.ggml.add_eos_token", default_eos)),
            add_space_prefix=bool(get("tokenizer.ggml.add_space_prefix", space_prefix)),
            specials=tuple(specials),
        )

    # ------------------------------------------------------------------------------------------ encode
    @property
    def _ids(self) -> dict[str, int]:
        cached = self.__dict__.get("_ids_cache")
        if cached is None:
            cached = {t: i for i, t in enumerate(self.tokens)}  # a repeated text: the last id, as llama.cpp
            object.__setattr__(self, "_ids_cache", cached)
        return cached

    def _fragments(self, data: bytes, parse_special: bool) -> list[bytes | int]:
        """The text cut at its special tokens (llama.cpp's tokenizer_st_partition): bytes or a token id."""
        out: list[bytes | int] = [data] if data else []
        for sid in self.specials:
            if not parse_special and self.types[sid] in (CONTROL, UNKNOWN):
                continue
            needle = self.tokens[sid].encode("utf-8")
            nxt: list[bytes | int] = []
            for frag in out:
                if isinstance(frag, int):
                    nxt.append(frag)
                    continue
                start = 0
                while True:
                    at = frag.find(needle, start)
                    if at < 0:
                        break
                    if at > start:
                        nxt.append(frag[start:at])
                    nxt.append(sid)
                    start = at + len(needle)
                if start < len(frag):
                    nxt.append(frag[start:])
            out = nxt
        return out

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        frags = self._fragments(data, parse_special)
        out: list[int] = []
        if self.model == "llama":
            prev_special = True
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)  # type: ignore[arg-type]
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                piece = (b" " if self.add_space_prefix and prev_special else b"") + frag
                out += self._spm(piece.replace(b" ", "\u2581".encode()))
                prev_special = False
        else:
            if add_special and self.add_bos:
                self._need(self.bos, "BOS")
                out.append(self.bos)  # type: ignore[arg-type]
            for frag in frags:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out += self._gemma4(frag) if self.model == "gemma4" else self._bpe(frag)
        if add_special and self.add_eos:
            self._need(self.eos, "EOS")
            out.append(self.eos)  # type: ignore[arg-type]
        return out

    def _need(self, token: int | None, what: str) -> None:
        if token is None or not 0 <= token < len(self.tokens):
            raise TokenizerError(f"the vocabulary adds a {what} it does not have")

    # ------------------------------------------------------------------------------------------ BPE
    def _words(self, data: bytes) -> list[str]:
        """The pre-tokenizer's words (as text; invalid UTF-8 read as U+FFFD)."""
        words = ["".join(map(chr, utf8_chars(data)))]
        for expr in PRE[self.pre][0]:
            pattern = _compiled(expr)
            nxt: list[str] = []
            for w in words:
                start = 0
                for m in pattern.finditer(w):
                    if m.start() > start:
                        nxt.append(w[start : m.start()])
                    if m.end() > m.start():
                        nxt.append(m.group())
                    start = m.end()
                if start < len(w):
                    nxt.append(w[start:])
            words = nxt
        return words

    def _bpe(self, data: bytes) -> list[int]:
        b2u = _B2U
        ids = self._ids
        ignore_merges = PRE[self.pre][1]
        out: list[int] = []
        for word in self._words(data):
            enc = "".join(b2u[b] for b in word.encode("utf-8", "surrogatepass"))
            if ignore_merges and enc in ids:
                out.append(ids[enc])
                continue
            for sym in self._merge(list(enc)):
                tid = ids.get(sym)
                if tid is not None:
                    out.append(tid)
                    continue
                for ch in sym:  # llama.cpp spells a symbol without a token byte by byte (dropping unknowns)
                    if ch not in ids:
                        raise TokenizerError(f"byte image {ch!r} has no token in this vocabulary")
                    out.append(ids[ch])
        return out

    def _merge(self, syms: list[str]) -> list[str]:
        """Adjacent pairs merge lowest rank first, leftmost among equal ranks (llama.cpp's queue)."""
        n = len(syms)
        text = list(syms)
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        heap: list[tuple[int, int, int, str]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = self.ranks.get((text[left], text[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, text[left] + text[right]))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if not text[left] or not text[right] or text[left] + text[right] != joined:
                continue  # outdated
            text[left] = joined
            text[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        return [t for t in text if t]

    # ------------------------------------------------------------------------------------------ gemma4
    def _gemma4(self, data: bytes) -> list[int]:
        """Gemma 4's BPE: spaces become U+2581; the text is cut into runs of newlines and runs of anything
        else; a run of newlines that is a token is taken whole; otherwise each character is a symbol and
        the pairs merge by rank (_merge); a symbol left that is not a token is spelled with the <0xXX>
        tokens of its UTF-8 bytes."""
        ids = self._ids
        text = "".join(map(chr, utf8_chars(data))).replace(" ", "\u2581")
        words: list[str] = []
        for ch in text:
            if words and (words[-1][-1] == "\n") == (ch == "\n"):
                words[-1] += ch
            else:
                words.append(ch)
        out: list[int] = []
        for w in words:
            if w[0] == "\n" and w in ids:
                out.append(ids[w])
                continue
            for sym in self._merge(list(w)):
                tid = ids.get(sym)
                if tid is not None:
                    out.append(tid)
                    continue
                for b in sym.encode("utf-8", "surrogatepass"):
                    fb = ids.get(f"<0x{b:02X}>")
                    if fb is None:
                        raise TokenizerError(f"byte 0x{b:02x} has no token in this vocabulary")
                    out.append(fb)
        return out

    # ------------------------------------------------------------------------------------------ SPM
    def _spm(self, data: bytes) -> list[int]:
        ids = self._ids
        # characters by their lead byte (llama.cpp does not validate here), each at least one byte
        chars: list[bytes] = []
        i = 0
        while i < len(data):
            b = data[i]
            length = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            chars.append(data[i : i + length])
            i += length
        n = len(chars)
        text = list(chars)
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            joined = text[left] + text[right]
            tid = ids.get(joined.decode("utf-8", "surrogateescape"))
            if tid is not None:
                # highest score first, the leftmost among equal scores
                heapq.heappush(heap, (-self.scores[tid], left, right, len(joined)))

        for k in range(1, n):
            push(k - 1, k)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not text[left] or not text[right] or len(text[left]) + len(text[right]) != size:
                continue
            text[left] = text[left] + text[right]
            text[right] = b""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        out: list[int] = []
        for sym in text:
            if not sym:
                continue
            tid = ids.get(sym.decode("utf-8", "surrogateescape"))
            if tid is not None:
                out.append(tid)
                continue
            for b in sym:  # byte fallback
                fb = ids.get(f"<0x{b:02X}>")
                if fb is None:
                    fb = ids.get(chr(b)) if b < 0x80 else None
                if fb is None:
                    raise TokenizerError(f"byte 0x{b:02x} has no token in this vocabulary")
                out.append(fb)
        return out

    # ------------------------------------------------------------------------------------------ decode
    def piece(self, token: int) -> bytes:
        """What a generated token prints (llama.cpp's token_to_piece without specials)."""
        t, text = self.types[token], self.tokens[token]
        if t in (CONTROL, UNKNOWN, UNUSED) or t == 0:
            return b""
        if t == USER_DEFINED:
            return text.encode("utf-8")
        if t == BYTE:
            return bytes([int(text[3:5], 16)])
        if self.model in ("llama", "gemma4"):
            return text.replace("\u2581", " ").encode("utf-8")
        return bytes(_U2B[c] for c in text)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return b"".join(self.piece(t) for t in tokens)


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_PATTERNS: dict[str, Any] = {}


def _compiled(expr: str) -> Any:
    p = _PATTERNS.get(expr)
    if p is None:
        p = _PATTERNS[expr] = regex.compile(expr)
    return p

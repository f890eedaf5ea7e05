"""The gemma4 tokenizer (tokenizer.ggml.model = gemma4), as docs/tokenizers.md describes llama.cpp's:
written from that description, not from the engine's C.

A text's spaces become U+2581; the text is cut into runs of newlines and runs of anything else; a run
of newlines that is a token is taken whole; otherwise each UTF-8 character is a symbol and the adjacent
pair with the lowest merge rank merges first (the leftmost among equal ranks) until no pair has a rank;
a symbol left that is not a token is spelled with the <0xXX> tokens of its bytes. BOS always comes first.
Special-token texts in the input are not parsed (the gates' prompts have none)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

SPACE = "\u2581"


class Gemma4Tokenizer:
    def __init__(self, vocab: Sequence[str], types: Sequence[int], merges: Sequence[str], bos: int | None) -> None:
        self.vocab = list(vocab)
        self.types = list(types)
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        self.rank: dict[tuple[str, str], int] = {}
        for r, m in enumerate(merges):
            cut = m.find(" ", 1)  # the first space after the first character separates the two parts
            if cut > 0:
                self.rank.setdefault((m[:cut], m[cut + 1 :]), r)
        self.bos = bos

    def _word(self, w: str) -> list[int]:
        if w.strip("\n") == "" and w in self.ids:
            return [self.ids[w]]
        syms = list(w)
        while len(syms) > 1:
            best = min(
                ((self.rank[(a, b)], i) for i, (a, b) in enumerate(pairwise(syms)) if (a, b) in self.rank),
                default=None,
            )
            if best is None:
                break
            i = best[1]
            syms[i : i + 2] = [syms[i] + syms[i + 1]]
        out: list[int] = []
        for s in syms:
            if s in self.ids:
                out.append(self.ids[s])
            else:
                out.extend(self.ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
        return out

    def encode(self, text: str) -> list[int]:
        t = text.replace(" ", SPACE)
        words: list[str] = []
        for ch in t:
            if words and (words[-1][-1] == "\n") == (ch == "\n"):
                words[-1] += ch
            else:
                words.append(ch)
        out = [] if self.bos is None else [self.bos]
        for w in words:
            out += self._word(w)
        return out

    def decode(self, tokens: Sequence[int]) -> bytes:
        out = bytearray()
        for t in tokens:
            kind, text = self.types[t], self.vocab[t]
            if kind == 6 and text.startswith("<0x") and len(text) == 6:  # a byte token
                out.append(int(text[3:5], 16))
            elif kind in (1,):  # normal: U+2581 back to spaces
                out += text.replace(SPACE, " ").encode("utf-8")
            elif kind == 4:  # user-defined: its text
                out += text.encode("utf-8")
        return bytes(out)

"""The BAD-DATA gate's cases: corrupted copies of a fixture the engine must refuse (docs/gates.md, BAD-DATA).

A NaN or infinite scale in a weight block does not crash a matmul: it turns the logits into NaN, and
greedy decoding of NaN is garbage that looks like output. The engine checks every block's floats before
computing with them (dense tensors when the model opens, each expert the first time it is used) and
refuses the file: exit 3, one line naming the tensor, the expert and the block (docs/engine.md). The
cases are written from the GGUF block layouts (below), not from the engine's checker:

  first-block    the first quantised dense tensor's block 0, its first scale a NaN
  last-block     the last quantised dense tensor's last block, its last scale an infinity
  expert         one expert of the last MoE layer, an expert the prompt also routes in layer 0 (so a
                 check remembered by expert id alone would pass it), its last block's first scale a NaN
  cut            the file cut in the middle of its last tensor's last block

Each copy is made on the device from the pushed fixture (`cp`, then `printf | dd conv=notrunc` for the
bytes, `dd count=1` for the cut: POSIX tools, on Android's toybox too), so nothing more is pushed.

The layouts table is a row per type: a type the engine gains gets its row here (block bytes, and each f16
scale's byte offset in the block) and is then covered wherever a fixture holds it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUFReader

#: per ggml type: bytes per block and its floats the checker must find, (name, byte offset in the block,
#: kind). A quantised type's scales are f16; an F32/F16/BF16 tensor's "blocks" are its values.
LAYOUTS: dict[str, tuple[int, tuple[tuple[str, int, str], ...]]] = {
    "Q8_0": (34, (("d", 0, "f16"),)),
    "Q4_0": (18, (("d", 0, "f16"),)),
    "Q5_0": (22, (("d", 0, "f16"),)),
    "Q4_K": (144, (("d", 0, "f16"), ("dmin", 2, "f16"))),
    "Q5_K": (176, (("d", 0, "f16"), ("dmin", 2, "f16"))),
    "Q6_K": (210, (("d", 208, "f16"),)),  # Q6_K keeps its scale last
    "F16": (2, (("value", 0, "f16"),)),
    "BF16": (2, (("value", 0, "bf16"),)),
    "F32": (4, (("value", 0, "f32"),)),
}
#: the non-finite bit patterns (little endian) and how the engine prints them (C's %g)
BITS = {
    ("f16", "nan"): b"\x00\x7e",
    ("f16", "inf"): b"\x00\x7c",
    ("bf16", "nan"): b"\xc0\x7f",
    ("bf16", "inf"): b"\x80\x7f",
    ("f32", "nan"): b"\x00\x00\xc0\x7f",
    ("f32", "inf"): b"\x00\x00\x80\x7f",
}
CASES = ("first-block", "last-block", "expert", "cut")


@dataclass(frozen=True)
class Case:
    name: str
    file: str  # the copy's file name on the device
    expect: str  # what the engine's one error line must say (after "bmoe: error: <path>: ")
    poke: tuple[int, bytes] | None = None  # (file offset, bytes) written into the copy
    cut: int | None = None  # the copy's length (a prefix of the fixture)

    def script(self, base: str, path: str) -> str:
        """The shell commands that make this copy at `path` from the fixture at `base`."""
        b, p = shlex.quote(base), shlex.quote(path)
        if self.cut is not None:
            return f"dd if={b} of={p} bs={self.cut} count=1 2>/dev/null"
        assert self.poke is not None
        at, data = self.poke
        octal = "".join(f"\\{x:03o}" for x in data)
        return f"cp {b} {p} && printf '{octal}' | dd of={p} bs=1 seek={at} conv=notrunc 2>/dev/null"


@dataclass(frozen=True)
class _Tensor:
    name: str
    type: str
    offset: int  # absolute, in the file
    nbytes: int
    n_expert: int  # 0 for a dense tensor


def _tensors(path: Path) -> list[_Tensor]:
    r = GGUFReader(str(path))
    out = []
    for t in r.tensors:
        n_expert = int(t.shape[2]) if len(t.shape) == 3 and "_exps" in t.name else 0
        out.append(_Tensor(t.name, t.tensor_type.name, int(t.data_offset), int(t.n_bytes), n_expert))
    return out


def _scale(t: _Tensor, block: int, field: int, value: str, expert: int | None = None) -> tuple[int, bytes, str]:
    """(file offset, bytes, expected message) of a non-finite value in one block's scale."""
    size, fields = LAYOUTS[t.type]
    name, off, kind = fields[field]
    base = t.offset + (0 if expert is None else expert * (t.nbytes // t.n_expert))
    where = f"{t.name}: expert {expert}: " if expert is not None else f"{t.name}: "
    return base + block * size + off, BITS[(kind, value)], f"{where}block {block} has a non-finite {name} ({value})"


def cases(path: Path, routed: dict[int, set[int]]) -> list[Case]:
    """The cases for the fixture file at `path`; `routed`: layer -> experts the gate prompt routes there
    (the reference's routing of the prompt, layer 0 and the layers after it)."""
    tensors = _tensors(path)
    quantised = [t for t in tensors if t.type in LAYOUTS and t.type not in ("F32", "F16", "BF16")]
    dense = [t for t in quantised if not t.n_expert]
    experts = [t for t in quantised if t.n_expert]
    if not dense or not experts:
        raise ValueError(f"{path.name}: BAD-DATA needs quantised dense and expert tensors")
    out: list[Case] = []
    first = dense[0]
    at, data, expect = _scale(first, 0, 0, "nan")
    out.append(Case("first-block", "baddata-first-block.gguf", expect, poke=(at, data)))
    last = dense[-1]
    size, fields = LAYOUTS[last.type]
    at, data, expect = _scale(last, last.nbytes // size - 1, len(fields) - 1, "inf")
    out.append(Case("last-block", "baddata-last-block.gguf", expect, poke=(at, data)))
    # the last MoE layer's last expert tensor, an expert layer 0 routes too
    layer = max(routed)
    tensor = [t for t in experts if t.name.startswith(f"blk.{layer}.")][-1]
    both = sorted(routed[layer] & routed.get(min(routed), set()))
    if layer == min(routed) or not both:
        raise ValueError(f"{path.name}: no expert routed in layer {min(routed)} and in layer {layer}")
    e = both[0]
    size, _ = LAYOUTS[tensor.type]
    at, data, expect = _scale(tensor, tensor.nbytes // tensor.n_expert // size - 1, 0, "nan", expert=e)
    out.append(Case("expert", "baddata-expert.gguf", expect, poke=(at, data)))
    end = max(tensors, key=lambda t: t.offset + t.nbytes)
    size, _ = LAYOUTS.get(end.type, (2, ()))
    cut = end.offset + end.nbytes - size // 2
    out.append(
        Case(
            "cut",
            "baddata-cut.gguf",
            f"({end.name}): offset {end.offset} + {end.nbytes} bytes past end of file",
            cut=cut,
        )
    )
    return out


def routed_by_layer(routes: Sequence[object]) -> dict[int, set[int]]:
    """layer -> experts, from the reference's routes (bmoe_ci.reference.Route)."""
    out: dict[int, set[int]] = {}
    for r in routes:
        out.setdefault(int(r.layer), set()).update(int(i) for i in r.ids)  # type: ignore[attr-defined]
    return out

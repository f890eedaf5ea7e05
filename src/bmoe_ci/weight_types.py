"""The weight types the engine computes with, named once for the Python side.

The engine's type table (engine/src/type_table.c) and this module list the same types with the same
facts: ggml's name and type id, values and bytes per block, and the format a matmul's input is rounded
to before the type's dot product (the activation format ggml's CPU backend gives the type:
docs/model-math.md, "Activation quantisation"). The numpy reference reads the activation format from
here, the fixture writer the types it may write (and checks it has a quantizer for each), INV and
REPLAY the byte sizes. tests/test_weight_types.py holds this table to the engine's (`bmoe info`) and to
gguf's own block sizes.

This module imports neither the reference nor the fixture generator: both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

Activation = Literal["f32", "q8_0", "q8_1", "q8_K"]


@dataclass(frozen=True)
class WeightType:
    qtype: GGMLQuantizationType
    activation: Activation
    #: Q8_1 types: the byte offset in a block of its f16 minimum m. Q8_1 carries each input block's sum
    #: rounded to f16 (s = f16(d sum q)), which the dot product multiplies by m, so the reference needs m
    #: to compute what the engine (and ggml) compute
    min_offset: int | None = None

    @property
    def name(self) -> str:
        """ggml's name ("q4_K"), as the engine prints it."""
        n = self.qtype.name.lower()
        return n[:-1] + "K" if n.endswith("_k") else n  # the K-quants keep ggml's capital K

    @property
    def block(self) -> int:
        """Values per block."""
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]

    @property
    def quantised_input(self) -> bool:
        """Whether the matmul's input is rounded to 8-bit blocks first (every block type)."""
        return self.activation != "f32"

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of n values (a whole number of blocks)."""
        if n % self.block:
            raise ValueError(f"{self.name}: a row of {n} values is not a whole number of {self.block}-value blocks")
        return n // self.block * self.block_bytes


#: Every type the engine computes with, in ggml id order (the engine's table lists the same ones).
TYPES: tuple[WeightType, ...] = (
    WeightType(Q.F32, "f32"),
    WeightType(Q.F16, "f32"),
    WeightType(Q.Q4_0, "q8_0"),
    WeightType(Q.Q4_1, "q8_1", min_offset=2),
    WeightType(Q.Q5_0, "q8_0"),
    WeightType(Q.Q5_1, "q8_1", min_offset=2),
    WeightType(Q.Q8_0, "q8_0"),
    WeightType(Q.Q2_K, "q8_K"),
    WeightType(Q.Q3_K, "q8_K"),
    WeightType(Q.Q4_K, "q8_K"),
    WeightType(Q.Q5_K, "q8_K"),
    WeightType(Q.Q6_K, "q8_K"),
    WeightType(Q.IQ4_NL, "q8_0"),
    WeightType(Q.IQ4_XS, "q8_K"),
    WeightType(Q.BF16, "f32"),
    WeightType(Q.MXFP4, "q8_0"),
)

BY_QTYPE: dict[GGMLQuantizationType, WeightType] = {t.qtype: t for t in TYPES}
BY_NAME: dict[str, WeightType] = {t.name: t for t in TYPES}


def weight_type(qtype: GGMLQuantizationType | int) -> WeightType:
    """The type's facts; KeyError (naming the type) for one the engine does not compute with."""
    q = Q(int(qtype))
    try:
        return BY_QTYPE[q]
    except KeyError:
        raise KeyError(f"{q.name} is not a weight type the engine computes with") from None


def supported(qtype: GGMLQuantizationType | int) -> bool:
    try:
        return Q(int(qtype)) in BY_QTYPE
    except ValueError:
        return False

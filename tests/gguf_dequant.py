"""A GGUF model with every tensor dequantised to F32: the same metadata, the same weight values.

llama.cpp's CPU backend and the engine multiply F32 weights with the float input as it is, so a model
run from such a copy has none of the 8-bit activation roundings whose boundary flips make two
implementations of a quantised model disagree by whole logits (docs/model-math.md, "Comparing with
llama.cpp"): what is left between the two is float-order noise, and a modelling error stands out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

#: fields the writer makes itself
_OWN = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}


@dataclass
class F32Model:
    """A file's metadata (key -> (value, type, array element type)) and its tensors as float32 arrays."""

    arch: str
    kv: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]]
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def read(cls, src: Path) -> F32Model:
        """The values as gguf.quants dequantises them, which are ggml's (docs/model-math.md)."""
        r = GGUFReader(src)
        kv = {}
        for name, f in r.fields.items():
            if name not in _OWN:
                vtype = f.types[0]
                kv[name] = (f.contents(), vtype, f.types[-1] if vtype == GGUFValueType.ARRAY else None)
        model = cls(str(r.fields["general.architecture"].contents()), kv)
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed([int(x) for x in t.shape]))
            if t.tensor_type == GGMLQuantizationType.F32:
                arr = np.array(t.data, dtype=np.float32).reshape(shape)
            else:
                arr = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
            model.tensors[t.name] = arr
        return model

    def write(
        self,
        dst: Path,
        kv: dict[str, tuple[Any, GGUFValueType, GGUFValueType | None]] | None = None,
        edit: Callable[[str, np.ndarray], np.ndarray] | None = None,
    ) -> Path:
        """dst: this model, with the keys of `kv` set (added or replaced) and each tensor through `edit`."""
        w = GGUFWriter(str(dst), arch=self.arch)
        for name, (value, vtype, sub) in {**self.kv, **(kv or {})}.items():
            w.add_key_value(name, value, vtype, sub_type=sub)
        for name, arr in self.tensors.items():
            w.add_tensor(name, edit(name, arr) if edit else arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return dst

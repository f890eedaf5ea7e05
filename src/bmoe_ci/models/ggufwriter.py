"""The GGUF writer the fixture files and the vocabulary-only files share."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType, GGUFWriter


class EmptyArrayWriter(GGUFWriter):
    """GGUFWriter that can also write an empty typed array (llama.cpp requires a `merges` key)."""

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)

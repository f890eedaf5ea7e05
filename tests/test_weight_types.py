"""The weight types are named once on each side and the two sides agree: the engine's type table
(engine/src/type_table.c, printed by `bmoe info --types`) and bmoe_ci.weight_types list the same types
with the same ids, block sizes and activation formats; gguf's own block sizes are the same; every type has
a kernel on every path this machine's build has; and the fixture writer has a quantizer for every type."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from bmoe_ci import weight_types
from bmoe_ci.models import writer


def engine_types(engine: Path) -> list[dict]:
    out = subprocess.run([str(engine), "info", "--types"], capture_output=True, check=True, text=True).stdout
    data = json.loads(out)
    assert data["ok"] is True
    return data["weight_types"]


def test_engine_and_python_tables_agree(engine_bin: Path) -> None:
    got = [(t["type"], t["id"], t["block_values"], t["block_bytes"], t["activation"]) for t in engine_types(engine_bin)]
    want = [(t.name, int(t.qtype), t.block, t.block_bytes, t.activation) for t in weight_types.TYPES]
    assert got == want


def test_every_type_has_every_path_of_this_machine(engine_bin: Path) -> None:
    paths = {"x86_64": ["scalar", "avx2", "avx512-vnni"], "aarch64": ["scalar", "neon", "neon-dot"]}.get(
        platform.machine(), ["scalar"]
    )
    for t in engine_types(engine_bin):
        assert t["kernels"] == paths, t
        assert t["checked"], t  # every type has a float the block checker looks at


def test_block_sizes_are_gguf_s() -> None:
    for t in weight_types.TYPES:
        assert (t.block, t.block_bytes) == GGML_QUANT_SIZES[t.qtype]
        assert t.row_bytes(t.block * 3) == 3 * t.block_bytes


def test_the_writer_can_write_every_type() -> None:
    assert set(writer.QUANTIZERS) == {t.qtype for t in weight_types.TYPES} - {GGMLQuantizationType.F32}


def test_unsupported_types_are_named() -> None:
    assert not weight_types.supported(GGMLQuantizationType.IQ2_XXS)
    assert not weight_types.supported(12345)
    try:
        weight_types.weight_type(GGMLQuantizationType.IQ2_XXS)
    except KeyError as e:
        assert "IQ2_XXS" in str(e)
    else:
        raise AssertionError("IQ2_XXS is not a weight type the engine computes with")

"""The fixture writer's quantizers write ggml's bytes: every type of bmoe_ci.models.writer.QUANTIZERS but the
16-bit ones, quantized by the project (gguf.quants where it can, else the ports in kquant.py and
iquant.py) and by ggml itself (`ggml_quantize_chunk` of the libggml-base that llama-cpp-python ships, no
importance matrix: what llama.cpp's quantizer runs for a tensor), on rows of several scales, zero and
constant blocks, one-sign blocks and coarse values. Skipped when llama-cpp-python is not installed (CI
does not install it)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from bmoe_ci.models import writer
from bmoe_ci.weight_types import weight_type

Q = GGMLQuantizationType
#: the types whose matrices ggml writes by rounding to 16 bits (no quantizer to compare with)
SIXTEEN = {Q.F16, Q.BF16}


def _libggml() -> ctypes.CDLL:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        pytest.skip("llama-cpp-python is not installed: no ggml to compare the quantizers with")
    lib = Path(spec.origin).parent / "lib" / "libggml-base.so"
    if not lib.exists():
        pytest.skip(f"{lib} is missing")
    g = ctypes.CDLL(str(lib))
    g.ggml_quantize_chunk.restype = ctypes.c_size_t
    g.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    g.ggml_quantize_init.argtypes = [ctypes.c_int]
    return g


def _ggml(g: ctypes.CDLL, qtype: GGMLQuantizationType, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n = x.shape
    row_bytes = weight_type(qtype).row_bytes(n)
    out = np.zeros((rows, row_bytes), dtype=np.uint8)
    g.ggml_quantize_init(int(qtype))
    done = g.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, n, None)
    assert done == rows * row_bytes
    return out


def _rows(seed: int) -> np.ndarray:
    """32 rows of 1024 values: a scale per seed, and the edges the quantizers branch on."""
    rng = np.random.default_rng(100 + seed)
    x = (rng.standard_normal((32, 1024)) * [0.02, 1.0, 50.0, 1e-4, 3.0, 0.5][seed]).astype(np.float32)
    x[0] = 0.0
    x[1, :256] = 0.0
    x[2] = np.abs(x[2])  # one sign: the K-quants' mins are 0
    x[3, :64] = x[3, 0]  # constant blocks
    x[4, 7] *= 40.0  # an outlier
    if seed == 4:
        x[:, ::7] = 0.0
    if seed == 5:
        x = np.round(x * 8) / 8  # coarse values: ties in the searches
    return x


QUANTIZED = sorted((q for q in writer.QUANTIZERS if q not in SIXTEEN), key=int)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=[q.name for q in QUANTIZED])
def test_the_writers_bytes_are_ggmls(qtype: GGMLQuantizationType) -> None:
    g = _libggml()
    for seed in range(6):
        x = _rows(seed)
        ours, theirs = writer.QUANTIZERS[qtype](x), _ggml(g, qtype, x)
        assert ours.shape == theirs.shape
        bb = weight_type(qtype).block_bytes
        bad = np.nonzero((ours.reshape(-1, bb) != theirs.reshape(-1, bb)).any(axis=1))[0]
        assert not len(bad), f"{qtype.name}, rows of seed {seed}: {len(bad)} blocks differ from ggml's, first {bad[:4]}"

"""ggml's IQ4_NL and IQ4_XS quantizers for the fixtures, in numpy.

gguf.quants dequantizes these types but does not quantize them. This is a port of what ggml's quantizer
runs for them without an importance matrix (ggml-quants.c: `quantize_iq4_nl` and `quantize_iq4_xs`, both
`quantize_row_iq4_nl_impl` with ntry 7 and weights x^2; `best_index_int8`, `nearest_int`), in float32 with
every sum in ggml's element order, like kquant.py; the bytes are ggml's block layouts. tests/
test_quantizers.py holds the bytes to llama.cpp's own quantizer where llama-cpp-python is installed.
"""

from __future__ import annotations

import numpy as np

from .kquant import GROUP_MAX_EPS, _f16, _le16, _nearest

F = np.float32
QK_K = 256
#: ggml-common.h's kvalues_iq4nl
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
_KV = KVALUES.astype(F)
NTRY = 7


def _best_index(x: np.ndarray) -> np.ndarray:
    """best_index_int8(16, kvalues, x) elementwise: the nearest level's index, the upper one of a tie."""
    x = x.astype(F)
    mu = np.clip(np.searchsorted(_KV, x, side="right"), 1, 15)  # first level above x (for x inside)
    lo, hi = _KV[mu - 1], _KV[mu]
    idx = np.where((x - lo).astype(F) < (hi - x).astype(F), mu - 1, mu)
    return np.where(x <= _KV[0], 0, np.where(x >= _KV[15], 15, idx)).astype(np.int32)


def _sums(x: np.ndarray, w: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum w q x and sum w q q over each row, in element order (q = the levels of idx)."""
    q = _KV[idx]
    sumqx = np.zeros(x.shape[0], dtype=F)
    sumq2 = np.zeros(x.shape[0], dtype=F)
    for j in range(x.shape[1]):
        wq = (w[:, j] * q[:, j]).astype(F)
        sumqx = (sumqx + wq * x[:, j]).astype(F)
        sumq2 = (sumq2 + wq * q[:, j]).astype(F)
    return sumqx, sumq2


def _block_scales(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The per-block part of quantize_row_iq4_nl_impl (blocks of 32, rows of xb): (scale d, zero mask)."""
    m = xb.shape[0]
    w = (xb * xb).astype(F)
    ax = np.abs(xb)
    amax = np.zeros(m, dtype=F)
    mx = np.zeros(m, dtype=F)
    for j in range(xb.shape[1]):
        gt = ax[:, j] > amax
        amax = np.where(gt, ax[:, j], amax)
        mx = np.where(gt, xb[:, j], mx)
    zero = amax < GROUP_MAX_EPS
    mxs = np.where(zero, F(1), mx).astype(F)
    d = (-mxs / F(-127)).astype(F)  # ntry > 0: -max / values[0]
    sumqx, sumq2 = _sums(xb, w, _best_index((F(1) / d)[:, None] * xb))
    pos = sumq2 > 0
    d = np.where(pos, sumqx / np.where(pos, sumq2, F(1)), F(0)).astype(F)
    best = (d * sumqx).astype(F)
    for itry in range(-NTRY, NTRY + 1):
        idv = (F(itry - 127) / mxs).astype(F)
        sx, s2 = _sums(xb, w, _best_index(idv[:, None] * xb))
        take = (s2 > 0) & ((sx * sx).astype(F) > (best * s2).astype(F))
        d = np.where(take, sx / np.where(s2 > 0, s2, F(1)), d).astype(F)
        best = np.where(take, d * sx, best).astype(F)
    return np.where(zero, F(0), d).astype(F), zero


def _pack4(L: np.ndarray) -> np.ndarray:
    """Levels [rows, 32k] -> nibbles: byte 16i + j is value 32i + j low, 32i + 16 + j high."""
    Lr = L.reshape(L.shape[0], -1, 2, 16)
    return (Lr[:, :, 0, :] | (Lr[:, :, 1, :] << 4)).reshape(L.shape[0], -1).astype(np.uint8)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """x [..., n] float32 (n a multiple of 32) -> uint8 [..., n / 32 * 18]: ggml's quantize_iq4_nl."""
    shape = x.shape
    xb = np.ascontiguousarray(x, dtype=F).reshape(-1, 32)
    d, _ = _block_scales(xb)
    nz = d != 0
    idv = np.where(nz, F(1) / np.where(nz, d, F(1)), F(0)).astype(F)
    L = _best_index(idv[:, None] * xb)  # recomputed with the block's own scale (a zero scale: level 8)
    out = np.concatenate([_le16(_f16(d)), _pack4(L)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 18)


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """x [..., n] float32 (n a multiple of 256) -> uint8 [..., n / 256 * 136]: ggml's quantize_iq4_xs."""
    shape = x.shape
    xs = np.ascontiguousarray(x, dtype=F).reshape(-1, QK_K)
    nb = xs.shape[0]
    xb = xs.reshape(nb * 8, 32)
    scales, _ = _block_scales(xb)
    scales = scales.reshape(nb, 8)
    amax = np.zeros(nb, dtype=F)
    max_scale = np.zeros(nb, dtype=F)
    for ib in range(8):
        a = np.abs(scales[:, ib])
        gt = a > amax
        amax = np.where(gt, a, amax)
        max_scale = np.where(gt, scales[:, ib], max_scale)
    d = (-max_scale / F(32)).astype(F)
    nz = d != 0
    idv = np.where(nz, F(1) / np.where(nz, d, F(1)), F(0)).astype(F)
    ls = np.clip(_nearest(idv[:, None] * scales), -32, 31)  # [nb, 8]
    dl = (d[:, None] * ls.astype(F)).astype(F)
    dnz = dl != 0
    idl = np.where(dnz, F(1) / np.where(dnz, dl, F(1)), F(0)).astype(F)
    L = _best_index(idl.reshape(-1)[:, None] * xb).reshape(nb, QK_K)
    lu = ls + 32
    scales_l = ((lu[:, 0::2] & 0xF) | ((lu[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    scales_h = np.zeros(nb, dtype=np.int64)
    for ib in range(8):
        scales_h |= (lu[:, ib] >> 4).astype(np.int64) << (2 * ib)
    sh = scales_h.astype("<u2").view(np.uint8).reshape(nb, 2)
    out = np.concatenate([_le16(_f16(d)), sh, scales_l, _pack4(L)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 136)

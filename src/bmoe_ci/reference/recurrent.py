"""The recurrent layers of the hybrid architectures, in float64, written from docs/model-math.md
("Recurrent layers"), not from the C engine: the short causal convolution (lfm2moe's conv layers and
the input of qwen35moe's delta-net layers), the gated delta rule, and the M-RoPE section rule.

A layer's state is a dict the caller keeps per context (Model.new_cache): `conv` holds the K-1 latest
inputs of the convolution, oldest first, and `ssm` (delta-net layers) one S x S matrix per value head,
`ssm[h][i, j]` with key index i and value index j. Positions run one after the other whatever the
batch: the reference has no notion of prefill and decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DeltaNetDims", "causal_conv", "delta_net", "l2norm", "mrope_rotated", "short_conv", "softplus"]

#: (input rows [n, in], tensor name) -> rows @ tensor.T, the input quantised as the tensor's type asks
MatMul = Callable[[np.ndarray, str], np.ndarray]


@dataclass(frozen=True)
class DeltaNetDims:
    """qwen35moe's `ssm.*` keys: S = state_size (head width of q, k and v), Hk = group_count (q/k heads),
    Hv = time_step_rank (value heads), K = conv_kernel (taps)."""

    S: int
    Hk: int
    Hv: int
    K: int

    @property
    def conv_channels(self) -> int:
        return 2 * self.Hk * self.S + self.Hv * self.S


def _silu(z: np.ndarray) -> np.ndarray:
    return z / (1.0 + np.exp(-z))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + e^z), and z itself above 20 (where the two agree to float precision)."""
    return np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0))))


def l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(x: np.ndarray, w: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution: x [n, C] new inputs, w [C, K] (tap K-1 meets the newest input),
    state [K-1, C] the previous inputs, oldest first. Returns (y [n, C], the new state)."""
    K = w.shape[1]
    win = np.concatenate([state, x])  # [K-1+n, C]
    n = x.shape[0]
    y = np.zeros_like(x)
    for i in range(K):
        y += win[i : i + n] * w[:, i]
    return y, win[n:].copy() if K > 1 else state


def mrope_rotated(n_rot: int, sections: tuple[int, ...] | list[int]) -> np.ndarray:
    """Which rotation pairs j < n_rot/2 move with the position under interleaved M-RoPE (qwen35moe's
    rope.dimension_sections [t, h, w, e]): pair j belongs to sector s = j mod (t+h+w+e); s mod 3 == 0 and
    s < 3t is temporal, == 1 and s < 3h height, == 2 and s < 3w width, anything else the extra sector.
    A text token's temporal, height and width positions are its position, its extra position is 0: a
    pair of the extra sector is not rotated at all."""
    t, h, w, e = (int(v) for v in sections)
    dims = t + h + w + e
    out = np.zeros(n_rot // 2, dtype=bool)
    for j in range(n_rot // 2):
        s = j % dims
        out[j] = (s % 3 == 0 and s < 3 * t) or (s % 3 == 1 and s < 3 * h) or (s % 3 == 2 and s < 3 * w)
    return out


def short_conv(h: np.ndarray, b: str, t: dict[str, np.ndarray], state: dict[str, Any], mm: MatMul) -> np.ndarray:
    """lfm2moe's conv layer on the normed rows h [n, d]: in_proj gives B, C, X (d each, in that order),
    the convolution runs over B * X, the layer's output is out_proj(C * conv)."""
    d = h.shape[1]
    bcx = mm(h, b + "shortconv.in_proj.weight")
    bb, cc, xx = bcx[:, :d], bcx[:, d : 2 * d], bcx[:, 2 * d :]
    w = t[b + "shortconv.conv.weight"]  # [d, K]
    if state.get("conv") is None:
        state["conv"] = np.zeros((w.shape[1] - 1, d))
    y, state["conv"] = causal_conv(bb * xx, w, state["conv"])
    return mm(cc * y, b + "shortconv.out_proj.weight")


def delta_net(
    h: np.ndarray, b: str, t: dict[str, np.ndarray], dims: DeltaNetDims, eps: float, state: dict[str, Any], mm: MatMul
) -> np.ndarray:
    """qwen35moe's gated delta-net layer on the normed rows h [n, d] (docs/model-math.md)."""
    S, Hk, Hv = dims.S, dims.Hk, dims.Hv
    n = h.shape[0]
    qkv = mm(h, b + "attn_qkv.weight")  # [n, 2 Hk S + Hv S]: q, k, v
    z = mm(h, b + "attn_gate.weight").reshape(n, Hv, S)
    beta = _sigmoid(mm(h, b + "ssm_beta.weight"))  # [n, Hv]
    alpha = mm(h, b + "ssm_alpha.weight")  # [n, Hv]
    g = softplus(alpha + t[b + "ssm_dt.bias"]) * t[b + "ssm_a"]  # [n, Hv], the log of the decay
    w = t[b + "ssm_conv1d.weight"]  # [C, K]
    if state.get("conv") is None:
        state["conv"] = np.zeros((dims.K - 1, dims.conv_channels))
        state["ssm"] = np.zeros((Hv, S, S))
    c, state["conv"] = causal_conv(qkv, w, state["conv"])
    c = _silu(c)
    q = l2norm(c[:, : Hk * S].reshape(n, Hk, S), eps)
    k = l2norm(c[:, Hk * S : 2 * Hk * S].reshape(n, Hk, S), eps)
    v = c[:, 2 * Hk * S :].reshape(n, Hv, S)
    st = state["ssm"]
    o = np.zeros((n, Hv, S))
    for p in range(n):
        for hv in range(Hv):
            hk = hv % Hk  # value head hv reads key head hv mod Hk
            M = st[hv] * np.exp(g[p, hv])
            d = (v[p, hv] - k[p, hk] @ M) * beta[p, hv]
            M = M + np.outer(k[p, hk], d)
            st[hv] = M
            o[p, hv] = (q[p, hk] @ M) / np.sqrt(S)
    y = o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * t[b + "ssm_norm.weight"] * _silu(z)
    return mm(y.reshape(n, Hv * S), b + "ssm_out.weight")

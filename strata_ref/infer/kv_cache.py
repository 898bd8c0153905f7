"""The key/value cache of the attention layers, stored in float16 as
llama.cpp's default (`type_k = type_v = F16`): each K/V row is rounded to
fp16 (RNE) when stored, and read back as float32.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KVCache"]


class KVCache:
    """K and V of `n_layer` layers, (n_head_kv, n_ctx, head_dim) float16 each.

    `n` is the number of positions filled. `store(il, k, v)` writes rows for
    positions n .. n + len(k) - 1 (k, v float32 (len, n_head_kv, head_dim));
    the model advances `n` after the last layer. `keys(il, T)` /
    `values(il, T)` return float32 (n_head_kv, T, head_dim) views' copies.
    """

    @staticmethod
    def bytes_needed(n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int) -> int:
        """Bytes of K and V for these sizes (float16: 2 bytes a value)."""
        return 2 * 2 * int(n_layer) * int(n_head_kv) * int(head_dim) * int(n_ctx)

    def __init__(self, n_layer: int, n_head_kv: int, head_dim: int, n_ctx: int):
        if n_ctx <= 0:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        self.n_ctx = int(n_ctx)
        self.n = 0
        shape = (n_layer, n_head_kv, self.n_ctx, head_dim)
        self.k = np.zeros(shape, np.float16)
        self.v = np.zeros(shape, np.float16)

    def store(self, il: int, k: np.ndarray, v: np.ndarray) -> None:
        m = k.shape[0]
        if self.n + m > self.n_ctx:
            raise ValueError(f"KV cache full: {self.n} + {m} > n_ctx {self.n_ctx}")
        self.k[il, :, self.n:self.n + m] = k.transpose(1, 0, 2)
        self.v[il, :, self.n:self.n + m] = v.transpose(1, 0, 2)

    def keys(self, il: int, T: int) -> np.ndarray:
        return self.k[il, :, :T].astype(np.float32)

    def values(self, il: int, T: int) -> np.ndarray:
        return self.v[il, :, :T].astype(np.float32)

    def truncate(self, n: int) -> None:
        """Forget positions n and later."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        self.n = n


class HybridCache(KVCache):
    """The memory of a hybrid model (llama.cpp `llama_memory_hybrid`): the
    F16 KV cache of the attention layers (slot i for the i-th of them) and,
    for each recurrent layer (slot i for the i-th), the Gated DeltaNet's
    float32 state: `conv` (n_recr, channels, d_conv - 1), the last d_conv -
    1 inputs of the short convolution per channel, and `ssm` (n_recr,
    n_v_heads, S, S), the delta-rule state (row j = column j of S, ggml's
    layout); both start at zero and are F32 as in llama.cpp
    (`llama_memory_recurrent` with GGML_TYPE_F32).

    The recurrent state cannot be rewound: `truncate(n)` only accepts n ==
    self.n (a no-op) or 0 (everything cleared)."""

    @staticmethod
    def bytes_needed(n_attn: int, n_head_kv: int, head_dim: int, n_ctx: int, n_recr: int = 0,
                     conv_state: int = 0, ssm_state: int = 0) -> int:
        return KVCache.bytes_needed(n_attn, n_head_kv, head_dim, n_ctx) + \
            4 * int(n_recr) * (int(conv_state) + int(ssm_state))

    def __init__(self, n_attn: int, n_head_kv: int, head_dim: int, n_ctx: int, n_recr: int,
                 channels: int, d_conv: int, n_v_heads: int, state: int):
        super().__init__(n_attn, n_head_kv, head_dim, n_ctx)
        self.conv = np.zeros((n_recr, channels, d_conv - 1), np.float32)
        self.ssm = np.zeros((n_recr, n_v_heads, state, state), np.float32)

    def truncate(self, n: int) -> None:
        if n == self.n:
            return
        if n != 0:
            raise ValueError(f"the recurrent state of a hybrid model cannot be rewound to {n} "
                             f"positions (only cleared, or kept at {self.n})")
        self.n = 0
        self.conv[:] = 0
        self.ssm[:] = 0

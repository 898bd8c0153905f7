"""Choosing the next token from logits: greedy, or seeded sampling with
temperature, top-k and top-p.

The order of the filters is llama.cpp's common sampler order
(`common/sampling.cpp`): top-k, then top-p on the untempered distribution,
then temperature, then a draw. The random stream is NumPy's PCG64 seeded
with `seed`, so a run is reproducible here but does not reproduce
llama.cpp's draws (its RNG is a std::mt19937).
"""
from __future__ import annotations

import numpy as np

__all__ = ["Sampler", "greedy"]


def greedy(logits: np.ndarray) -> int:
    """Index of the largest logit (the first on ties, like llama.cpp's greedy
    sampler)."""
    return int(np.argmax(logits))


class Sampler:
    """Sampler(temperature=0.0, top_k=40, top_p=0.95, seed=0).

    temperature <= 0 means greedy; a positive temperature too small for
    float64 (1e-320) samples among the largest logits only. top_k <= 0
    disables top-k; top_p >= 1 disables top-p. `__call__(logits)` returns a token id (int). Raises
    ValueError for a negative or NaN temperature or top_p outside (0, 1].
    """

    def __init__(self, temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95,
                 seed: int = 0):
        temperature, top_p = float(temperature), float(top_p)
        if not temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature, self.top_k, self.top_p = temperature, int(top_k), top_p
        self.rng = np.random.Generator(np.random.PCG64(int(seed)))

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, np.float64)
        if self.temperature <= 0.0:
            return greedy(logits)
        idx = np.argsort(-logits, kind="stable")
        if 0 < self.top_k < idx.size:
            idx = idx[:self.top_k]
        z = logits[idx]
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one)
            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
            idx, z = idx[:keep], z[:keep]
        with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
            zt = z / self.temperature
            if not np.isfinite(zt).all():
                # a temperature so small (1e-320) that z / T overflows: the
                # differences to the maximum go to -inf instead, so every
                # maximum keeps weight 1 and the rest 0 (greedy, ties drawn)
                zt = (z - z.max()) / self.temperature
            p = np.exp(zt - zt.max())
        p /= p.sum()
        return int(idx[self.rng.choice(idx.size, p=p)])

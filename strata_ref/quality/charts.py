"""Charts of the quality measurements (matplotlib, the `quality` extra:
`pip install strata-ref[quality]`), written as PNG files. Every number a
chart shows is also in the command's `--json` output.

* `kl_distribution`: the KL at every generated position (a histogram on a
  log axis, with the noise floor's beside it).
* `layer_kl`: per layer, the single-layer KL stacked as its weight part and
  its activation part.
* `crest`: per layer, the median crest factor of the attention input and of
  the FFN input.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["kl_distribution", "layer_kl", "crest", "slug"]


def slug(spec: str) -> str:
    """A file-name part for a model spec: letters, digits, '.', '_', '-'."""
    import re
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(spec).rsplit("/", 1)[-1])[:80] or "model"


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("charts need matplotlib: pip install 'strata-ref[quality]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _out(directory, name: str) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def kl_distribution(directory, results, title: str, name: str | None = None) -> Path:
    """`kl_distribution.png` (or `name`): histograms of the per-position KL
    of TEST and of the noise floor (`kl.run_kl` results), log-spaced bins.
    Returns the path."""
    plt = _plt()
    kl = np.concatenate([r.test["kl"] for r in results])
    fl = np.concatenate([r.floor["kl"] for r in results])
    pos = np.concatenate([kl[kl > 0], fl[fl > 0]])
    lo = max(pos.min() if pos.size else 1e-12, 1e-12)
    hi = max(pos.max() if pos.size else 1.0, lo * 10)
    bins = np.logspace(np.log10(lo), np.log10(hi), 50)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(np.clip(kl, lo, None), bins=bins, alpha=0.7, label=f"TEST (mean {kl.mean():.3g})")
    ax.hist(np.clip(fl, lo, None), bins=bins, alpha=0.7, label=f"noise floor (mean {fl.mean():.3g})")
    ax.set_xscale("log")
    ax.set_xlabel("KL(REF || TEST) at a generated position (nats)")
    ax.set_ylabel("positions")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    p = _out(directory, name or "kl_distribution.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def layer_kl(directory, study: dict) -> Path:
    """`layer_kl.png`: per layer the single-layer KL as two stacked bars,
    the weight part and the activation part (`layers.run_layers` output;
    a negative activation part is drawn as zero and marked)."""
    plt = _plt()
    L = study["layers"]
    x = np.arange(len(L))
    w = np.array([max(r["kl_weight"], 0.0) for r in L])
    a = np.array([r["kl_act"] for r in L])
    fig, ax = plt.subplots(figsize=(max(7, len(L) * 0.35), 4))
    ax.bar(x, w, label="weights (float activations)")
    ax.bar(x, np.maximum(a, 0), bottom=w, label="+ ggml's activation quantization")
    for i in np.flatnonzero(a < 0):
        ax.annotate("-", (x[i], w[i]), ha="center", va="bottom")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean KL at generated positions (nats)")
    ax.set_title(f"{study['model']}: one layer requantized to {study['type']} ({study['cpu']})")
    ax.legend()
    fig.tight_layout()
    p = _out(directory, "layer_kl.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def crest(directory, study: dict) -> Path:
    """`crest.png`: per layer the median crest factor (max / rms over the
    hidden dimension, per token) of the attention and FFN inputs."""
    plt = _plt()
    L = study["layers"]
    x = np.arange(len(L))
    fig, ax = plt.subplots(figsize=(max(7, len(L) * 0.35), 4))
    ax.plot(x, [r["attn_input"]["crest_median"] for r in L], "o-", label="attention input")
    ax.plot(x, [r["ffn_input"]["crest_median"] for r in L], "s-", label="FFN input")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("median crest factor")
    ax.set_title(f"{study['model']}: crest factor of the linears' inputs")
    ax.legend()
    fig.tight_layout()
    p = _out(directory, "crest.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p

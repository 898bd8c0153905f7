"""Charts of the quality measurements (matplotlib, the `quality` extra:
`pip install strata-ref[quality]`), written as PNG files. Every number a
chart shows is also in the command's `--json` output.

* `kl_distribution`: the KL at every generated position (a histogram on a
  log axis, with the noise floor's beside it).
* `layer_kl`: per layer, the single-layer KL stacked as its weight part and
  its activation part.
* `crest`: per layer, the median crest factor of the attention input and of
  the FFN input.
* `rotation_crest`, `rotation_a8`, `rotation_kl`: rotated against unrotated
  (`rotate.rotation_study`): the crest factor of each linear input per
  layer, the per-token int8 output error per linear and layer, and the KL
  of each variant beside the noise floor.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["kl_distribution", "layer_kl", "crest", "slug", "rotation_crest", "rotation_a8",
           "rotation_kl"]


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


_INPUT_LABELS = (("attn", "attention input"), ("attn_out", "attn_output input"),
                 ("ffn", "FFN input"), ("ffn_mid", "ffn_down input"))


def _name(study) -> str:
    return Path(str(study["model"])).stem


def rotation_crest(directory, study: dict) -> Path:
    """`rotation_crest.png`: per layer the median crest factor of each of
    the four linear inputs, unrotated (solid) and rotated (dashed)."""
    plt = _plt()
    L = study["layers"]
    x = np.arange(len(L))
    fig, ax = plt.subplots(figsize=(max(7, len(L) * 0.35), 4.5))
    for j, (k, label) in enumerate(_INPUT_LABELS):
        c = f"C{j}"
        ax.plot(x, [r["orig"][k]["crest_median"] for r in L], "o-", color=c, label=f"{label}")
        ax.plot(x, [r["rot"][k]["crest_median"] for r in L], "s--", color=c, label=f"{label}, rotated")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("median crest factor (max / rms)")
    ax.set_title(f"{_name(study)}: crest factor of the linears' inputs, rotated vs unrotated")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    p = _out(directory, "rotation_crest.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def rotation_a8(directory, study: dict) -> Path:
    """`rotation_a8.png`: per layer and linear the relative output error of
    per-token int8 activations (float weights), unrotated and rotated."""
    plt = _plt()
    L = study["layers"]
    lin = list(L[0]["orig"]["linears"])
    x = np.arange(len(L))
    fig, axes = plt.subplots(1, 2, figsize=(max(10, len(L) * 0.5), 4.2), sharey=True)
    for ax, which, title in ((axes[0], "orig", "unrotated"), (axes[1], "rot", "rotated")):
        for j, a in enumerate(lin):
            ax.plot(x, [r[which]["linears"][a]["out_a8"] for r in L], "o-", ms=3, label=a)
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_title(title)
    axes[0].set_ylabel("relative output error, per-token int8 input")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{_name(study)}: per-linear error of per-token int8 activations")
    fig.tight_layout()
    p = _out(directory, "rotation_a8.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def rotation_kl(directory, study: dict) -> Path:
    """`rotation_kl.png`: mean KL against the unrotated @float model per
    variant, unrotated and rotated side by side, the noise floor as a
    line."""
    plt = _plt()
    kinds = ["float", "a8token"] + list(study["types"])
    kl = study["kl"]
    orig = [kl.get(f"orig@{k}", {}).get("kl_mean", np.nan) if k != "float" else np.nan for k in kinds]
    rot = [kl[f"rot@{k}"]["kl_mean"] for k in kinds]
    x = np.arange(len(kinds))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(x - 0.2, orig, 0.4, label="unrotated")
    ax.bar(x + 0.2, rot, 0.4, label="rotated")
    ax.axhline(study["floor"]["kl_mean"], color="k", ls=":", label="noise floor")
    ax.set_xticks(x, ["@float" if k == "float" else f"@{k}" for k in kinds])
    ax.set_yscale("log")
    ax.set_ylabel("mean KL vs unrotated @float (nats)")
    ax.set_title(f"{_name(study)}: rotated vs unrotated at the same weight / activation type")
    ax.legend()
    fig.tight_layout()
    p = _out(directory, "rotation_kl.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p

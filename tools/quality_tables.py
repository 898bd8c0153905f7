"""Markdown tables for docs/quality.md from the JSON of `strata-ref kl`,
`strata-ref layers` and `strata-ref rotate --measure`, so that the
figures there are the runs' own numbers, not copied by hand.

  python tools/quality_tables.py kl FILE.json
  python tools/quality_tables.py layers FILE.json
  python tools/quality_tables.py rotate FILE.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _kl_row(name: str, s: dict) -> str:
    return (f"| {name} | {s['kl_mean']:.4g} ± {s['kl_se']:.2g} | {s['kl_median']:.3g} | "
            f"{s['kl_p99']:.3g} | {s['kl_max']:.3g} | {100 * s['top1']:.1f} % | "
            f"{s['dp_mean']:.3g} | {s['dp_p1']:.3g} |")


_KL_HEAD = ("| TEST | KL mean ± se | median | p99 | max | top-1 | Δp mean | Δp p1 |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|")


def kl_table(d) -> str:
    """`strata-ref kl --json` with one or several TESTs."""
    tests = d["tests"] if "tests" in d else [d]
    out = [f"REF `{tests[0]['ref']}`, profile {tests[0]['cpu']}, {tests[0]['floor']['n']} generated "
           f"positions, {len(tests[0]['prompts'])} prompts, {tests[0]['max_tokens']} tokens each", "",
           _KL_HEAD, _kl_row("noise floor (REF batched)", tests[0]["floor"])]
    out += [_kl_row(f"`{t['test_spec']}`", t["test"]) for t in tests]
    return "\n".join(out)


def layers_table(d) -> str:
    """`strata-ref layers --json`: per layer, crest factors, the median
    linear errors and the single-layer KLs."""
    out = [f"`{d['model']}` requantized to {d['type']}, profile {d['cpu']}, {d['prompts']} prompts, "
           f"{d['positions']} generated positions", "",
           "| layer | crest attn in (channel) | crest FFN in (channel) | w err (median linear) | "
           "out err: weights / blocks / int8 (median linear) | KL weight part | KL activation part |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for L in d["layers"]:
        lin = L["linears"].values()
        med = lambda k: float(np.median([x[k] for x in lin]))
        out.append(f"| {L['layer']} | {L['attn_input']['crest_median']:.1f} ({L['attn_input']['channel']}) | "
                   f"{L['ffn_input']['crest_median']:.1f} ({L['ffn_input']['channel']}) | {med('w_err'):.3f} | "
                   f"{med('out_w'):.3f} / {med('out_blocks'):.4f} / {med('out_a8'):.4f} | "
                   f"{L['kl_weight']:.3g} | {L['kl_act']:.3g} |")
    w, sm = d["whole"], d["sum"]
    out += ["", f"Sum of the single-layer KLs: weight part {sm['kl_weight']:.4g}, weight + activation "
            f"{sm['kl_full']:.4g}; every layer requantized at once: weights {w['kl_weight']:.4g}, weights + "
            f"activations {w['kl_full']:.4g}; noise floor {d['floor']:.2g}."]
    return "\n".join(out)


def rotate_table(d) -> str:
    """`strata-ref rotate --measure --json`."""
    s = d["study"]
    name = Path(s["model"]).stem if s["model"].endswith(".gguf") else s["model"]
    out = [f"`{name}`, profile {s['cpu']}, {s['prompts']} prompts, {s['positions']} generated "
           f"positions; randomized Hadamard {' x '.join(map(str, d['hadamard']))} (seed {d['seed']}), "
           f"heads {' x '.join(map(str, d['head_hadamard']))}", "",
           "| linear input | crest, unrotated: median / max over layers | rotated | per-token int8 output error "
           f"(median linear of the kind), unrotated | rotated | {s['types'][0]} blocks, unrotated | rotated |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for key, a, label in (("attn", "wq", "attention (q, k, v)"), ("attn_out", "wo", "attn_output"),
                          ("ffn", "w_gate", "FFN (gate, up)"), ("ffn_mid", "w_down", "ffn_down")):
        c = {k: [L[k][key]["crest_median"] for L in s["layers"]] for k in ("orig", "rot")}
        e = {k: [L[k]["linears"][a]["out_a8"] for L in s["layers"]] for k in ("orig", "rot")}
        b = {k: [L[k]["linears"][a]["out_blocks"] for L in s["layers"]] for k in ("orig", "rot")}
        out.append(f"| {label} | {np.median(c['orig']):.1f} / {max(c['orig']):.1f} | "
                   f"{np.median(c['rot']):.1f} / {max(c['rot']):.1f} | {np.median(e['orig']):.4f} | "
                   f"{np.median(e['rot']):.4f} | {np.median(b['orig']):.4f} | {np.median(b['rot']):.4f} |")
    out += ["", f"KL against `{name}@float` (orig: the unrotated model, rot: the rotated one):", "", _KL_HEAD,
            _kl_row("noise floor (REF batched)", s["floor"])]
    out += [_kl_row(f"`{k}`", v) for k, v in s["kl"].items()]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("kl", "layers", "rotate"))
    ap.add_argument("json")
    a = ap.parse_args(argv)
    with open(a.json) as f:
        d = json.load(f)
    print({"kl": kl_table, "layers": layers_table, "rotate": rotate_table}[a.kind](d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

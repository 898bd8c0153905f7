"""Text and JSON reports of the quality measurements (`strata-ref kl`,
`strata-ref layers`, `strata-ref rotate --measure`). Printed prompts and
names are escaped."""
from __future__ import annotations

from .._text import count

__all__ = ["kl_text", "kl_json", "stats_line", "STAT_HEADER", "layers_text", "rotation_text"]

STAT_HEADER = (f"{'':14s} {'KL mean':>10s} {'(se)':>9s} {'median':>9s} {'p90':>9s} {'p99':>9s} "
               f"{'p99.9':>9s} {'max':>9s} {'top-1':>7s} {'dp mean':>9s} {'dp p1':>9s}")


def _g(v) -> str:
    return f"{v:9.3g}"


def stats_line(label: str, s: dict) -> str:
    """One row of the statistics table (`kl.summarize` output)."""
    if not s.get("n"):
        return f"{label:14s} (no generated positions)"
    return (f"{label:14s} {s['kl_mean']:10.4g} ({s['kl_se']:7.2g}) {_g(s['kl_median'])} "
            f"{_g(s['kl_p90'])} {_g(s['kl_p99'])} {_g(s['kl_p999'])} {_g(s['kl_max'])} "
            f"{100 * s['top1']:6.2f}% {s['dp_mean']:9.3g} {s['dp_p1']:9.3g}")


def _esc(text: str, n: int = 48) -> str:
    from .._text import printable
    t = printable(text)
    return t if len(t) <= n else t[:n - 3] + "..."


def kl_text(header: str, results, test: dict, floor: dict) -> str:
    """The `strata-ref kl` report: the header line, the overall table (TEST
    and the noise floor), then one line per prompt."""
    out = [header, STAT_HEADER, stats_line("TEST", test), stats_line("noise floor", floor), "",
           f"{'#':>3s} {'gen':>4s} {'KL mean':>10s} {'KL max':>10s} {'top-1':>7s} {'floor mean':>11s}  prompt"]
    for i, r in enumerate(results):
        kl, fl = r.test["kl"], r.floor["kl"]
        if kl.size == 0:
            out.append(f"{i:3d} {0:4d} {'':>10s} {'':>10s} {'':>7s} {'':>11s}  {_esc(r.prompt)}")
            continue
        out.append(f"{i:3d} {kl.size:4d} {kl.mean():10.4g} {kl.max():10.4g} "
                   f"{100 * r.test['top1'].mean():6.1f}% {fl.mean():11.4g}  {_esc(r.prompt)}")
    return "\n".join(out)


def kl_json(meta: dict, results, test: dict, floor: dict) -> dict:
    """The `--json` document: meta, overall statistics, and per prompt the
    tokens and every position's KL and Δp (so any chart can be redrawn)."""
    from .kl import summarize
    per = []
    for r in results:
        per.append({"prompt": r.prompt, "n_prompt": r.n_prompt, "tokens": [int(t) for t in r.tokens],
                    "test": summarize(r.test), "floor": summarize(r.floor),
                    "kl": r.test["kl"].tolist(), "dp": r.test["dp"].tolist(),
                    "top1": r.test["top1"].tolist(), "floor_kl": r.floor["kl"].tolist()})
    return {**meta, "test": test, "floor": floor, "prompts": per}


def layers_text(study: dict) -> str:
    """The `strata-ref layers` report: per layer the crest factors and the
    single-layer KLs, then per linear its type and errors, then the sums
    beside the whole model."""
    out = [f"layers of {_esc(study['model'], 60)} requantized to {study['type']} against its "
           f"@float baseline (cpu {study['cpu']}, {count(study['prompts'], 'prompt')}, "
           f"{count(study['positions'], 'generated position')}; noise floor KL {study['floor']:.3g})",
           f"{'layer':>5s} {'attn crest':>10s} {'ch (share, ratio)':>22s} {'ffn crest':>10s} "
           f"{'ch (share, ratio)':>22s} {'KL weight':>10s} {'KL act':>10s} {'KL full':>10s}"]
    for L in study["layers"]:
        a, f = L["attn_input"], L["ffn_input"]
        out.append(f"{L['layer']:5d} {a['crest_median']:10.3g} "
                   f"{a['channel']:6d} ({100 * a['channel_share']:4.0f}%, {a['channel_ratio']:6.3g}) "
                   f"{f['crest_median']:10.3g} "
                   f"{f['channel']:6d} ({100 * f['channel_share']:4.0f}%, {f['channel_ratio']:6.3g}) "
                   f"{L['kl_weight']:10.3g} {L['kl_act']:10.3g} {L['kl_full']:10.3g}")
    s, w = study["sum"], study["whole"]
    out.append(f"{'sum':>5s} {'':>66s} {s['kl_weight']:10.3g} {s['kl_act']:10.3g} {s['kl_full']:10.3g}")
    out.append(f"{'whole':>5s} {'':>66s} {w['kl_weight']:10.3g} {w['kl_act']:10.3g} {w['kl_full']:10.3g}")
    out += ["", f"{'layer':>5s} {'linear':>7s} {'type':>7s} {'w err':>9s} {'out w':>9s} {'out blk':>9s} "
                f"{'out a8':>9s} {'out w+blk':>9s}"]
    for L in study["layers"]:
        for name, e in L["linears"].items():
            out.append(f"{L['layer']:5d} {name:>7s} {e['type']:>7s} {e['w_err']:9.3g} {e['out_w']:9.3g} "
                       f"{e['out_blocks']:9.3g} {e['out_a8']:9.3g} {e['out_wb']:9.3g}")
    return "\n".join(out)


def rotation_text(study: dict) -> str:
    """The `strata-ref rotate --measure` report: per layer the median crest
    factors of the four linear inputs and the mean per-token int8 output
    error of the layer's linears, unrotated -> rotated; then the KL of each
    variant against the unrotated @float model beside the noise floor."""
    from .rotate import _INPUTS
    out = [f"rotation of {_esc(study['model'], 40)} ({_esc(study['rotated'], 40)}), cpu {study['cpu']}, "
           f"{count(study['prompts'], 'prompt')}, {count(study['positions'], 'generated position')}",
           f"{'layer':>5s} " + " ".join(f"{k + ' crest':>19s}" for k, _ in _INPUTS) + f" {'int8 err':>19s}"]
    for L in study["layers"]:
        cells = [f"{L['orig'][k]['crest_median']:8.3g} -> {L['rot'][k]['crest_median']:<7.3g}" for k, _ in _INPUTS]
        ea = sum(v["out_a8"] for v in L["orig"]["linears"].values()) / len(L["orig"]["linears"])
        eb = sum(v["out_a8"] for v in L["rot"]["linears"].values()) / len(L["rot"]["linears"])
        out.append(f"{L['layer']:5d} " + " ".join(f"{c:>19s}" for c in cells) + f" {ea:8.3g} -> {eb:<7.3g}")
    out += ["", "KL against the unrotated @float model", STAT_HEADER]
    for name, s in study["kl"].items():
        out.append(stats_line(name, s))
    out.append(stats_line("noise floor", study["floor"]))
    return "\n".join(out)

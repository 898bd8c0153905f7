"""`strata-ref experts` and `matmul`: one MoE layer's experts, or one weight
times an engine's activations, through llama.cpp's CPU arithmetic and a
GPU route's oracle."""
from __future__ import annotations

import json

from .._text import printable
from .._npio import atomic_output
from .common import Help, decimal, cpu_problem, err, json_out, out_problem


_NPY_ASK = "give float32 (n, n_embd) saved with numpy.save"


def _load_activations(path, what="--activations", cols=None, ask=_NPY_ASK):
    """(array, None) of `experts --activations FILE` (and `matmul`'s
    --activations / --compare, cols: the width the weight needs, a 1-D
    array taken as one row), or (None, the line that says why not): a
    regular file in NumPy's .npy format holding a 2-D float32 array; never
    unpickled (`_npio.read_npy`)."""
    import numpy as np

    from .._npio import NpyError, read_npy
    try:
        x = read_npy(path, what, ask)
    except NpyError as e:
        return None, str(e)
    if cols is not None and x.ndim == 1:
        x = x[None]
    if x.dtype != np.float32 or x.ndim != 2 or (cols is not None and (x.shape[1] != cols or not x.shape[0])):
        if cols is None:
            return None, f"{what} {path}: needs a float32 .npy array (n, n_embd), got {x.dtype} {x.shape}"
        who = "the weight needs" if what == "--activations" else "the route's result is"
        return None, f"{what} {path}: {x.dtype} {x.shape}, {who} (tokens, {cols}) of float32"
    return np.ascontiguousarray(x), None


def cmd_experts(a) -> int:
    from ..hashing import hash_array
    from ..infer import load
    from ..infer.expert_check import check_experts
    if (a.prompt is None) == (a.activations is None):
        return err("experts takes --prompt TEXT or --activations FILE.npy (one of them)")
    bad_cpu = cpu_problem(a.cpu)
    if bad_cpu:
        return err(bad_cpu)
    bad_out = out_problem(a.out, "--out", "npz", "experts.npz") if a.out else None
    if bad_out:
        return err(bad_out)
    x = None
    if a.activations is not None:
        x, bad = _load_activations(a.activations)
        if bad:
            return err(bad)
    c = check_experts(load(a.model, cpu=a.cpu), a.layer, x=x, prompt=a.prompt)
    agree = c.agreement()
    doc = {"arch": c.arch, "layer": c.layer, "cpu_profile": c.profile, "tokens": int(c.x.shape[0]),
           "experts_used": int(c.ids.shape[1]),
           "fnv1a64": {"x": f"{hash_array(c.x):016x}", "cpu": f"{hash_array(c.cpu):016x}",
                       "route": f"{hash_array(c.route):016x}"}, **agree}
    if a.out:
        import numpy as np
        with atomic_output(a.out) as f:
            np.savez(f, x=c.x, ids=c.ids, weights=c.weights, cpu=c.cpu, route=c.route,
                     **{k: np.array(str(v)) for k, v in doc.items() if k != "fnv1a64"})
        doc["out"] = a.out
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{c.arch} layer {c.layer}: {doc['tokens']} tokens, {doc['experts_used']} experts each "
          f"(ids of token 0: {c.ids[0].tolist()})")
    print(f"  llama.cpp CPU ({c.profile}):  fnv1a64 {doc['fnv1a64']['cpu']}")
    print(f"  mode-8 expert route:    fnv1a64 {doc['fnv1a64']['route']}")
    nan = []
    if agree["nan_both"]:
        nan.append(f"{agree['nan_both']} NaN on both sides, counted equal as in the hashes")
    if agree["nan_vs_number"]:
        nan.append(f"{agree['nan_vs_number']} NaN on one side only")
    print(f"  max |cpu - route| {agree['max_abs_diff']:.3g} ({agree['max_rel_diff']:.3g} of max |cpu|), "
          f"{100 * agree['equal_values']:.1f} % of values equal" + (f" ({'; '.join(nan)})" if nan else ""))
    if a.out:
        print(f"  written: {printable(a.out)} (x, ids, weights, cpu, route)")
    return 0


def cmd_matmul(a) -> int:
    import numpy as np

    from ..hashing import hash_array
    from ..probe import compare_output, open_tensor, route_matmul
    if (a.out is None) == (a.compare is None):
        return err("matmul takes --out Y.npy or --compare Y.npy (one of them)")
    if a.route != "cpu" and a.cpu is not None:
        return err("--cpu goes with --route cpu")
    bad = cpu_problem(a.cpu) if a.route == "cpu" else None
    if bad:
        return err(bad)
    if a.worst < 0:
        return err(f"--worst must be >= 0, got {a.worst}")
    if a.out is not None:
        bad = out_problem(a.out, "--out", "npy", "y.npy", inputs=(a.model, a.activations))
        if bad:
            return err(bad)
    _, t = open_tensor(a.model, a.tensor)
    ask = f"give float32 (tokens, {t.cols}) saved with numpy.save"
    x, bad = _load_activations(a.activations, "--activations", t.cols, ask)
    if bad:
        return err(bad)
    got = None
    if a.compare is not None:
        got, bad = _load_activations(a.compare, "--compare", t.rows,
                                     f"give float32 (tokens, {t.rows}) saved with numpy.save")
        if bad:
            return err(bad)
    y, bound = route_matmul(a.model, a.tensor, x, a.route, a.cpu)
    head = (f"{printable(a.tensor)} ({t.type.name}, {t.rows} x {t.cols}) x {x.shape[0]} activation rows, "
            f"route {a.route}: fnv1a64 {hash_array(y):016x}")
    if a.out is not None:
        with atomic_output(a.out) as f:
            np.save(f, y, allow_pickle=False)
        print(f"{head}; written {printable(a.out)} (float32 {y.shape[0]} x {y.shape[1]})")
        return 0
    rep = compare_output(got, y, bound, n_worst=a.worst)
    if a.json:
        json_out({"tensor": a.tensor, "type": t.type.name, "route": a.route, **rep})
        return 0 if rep["equal"] else 1
    print(head)
    print(f"  {rep['n_diff']} of {rep['n']} values differ from the route's bits"
          + (f" (max {rep['max_ulp']} ulp, median {rep['median_ulp']:g})" if "max_ulp" in rep else ""))
    for w in rep["worst"]:
        print(f"    {w['ulps']:>10} ulp at token {w['row']}, output row {w['col']}")
    if bound is None:
        print("  EQUAL" if rep["equal"] else "  DIFFERENT")
    else:
        print(f"  largest |y - oracle| / bound {rep['max_ratio']:.3g} (token {rep['at']['row']}, output row "
              f"{rep['at']['col']}); NaN positions differing {rep['nan_mismatch']}")
        print("  WITHIN the route's error bound" if rep["within"] else "  OUTSIDE the route's error bound")
    return 0 if rep["equal"] else 1


def add_experts(sub) -> None:
    ex = sub.add_parser("experts", help="one MoE layer's routed experts: llama.cpp's CPU "
                                        "result and the mode-8 expert route's")
    ex.add_argument("model", metavar="MODEL", help="registry name, alias or .gguf path of a "
                                                   "qwen3moe, glm4moe, qwen3next or qwen35moe model")
    ex.add_argument("--layer", type=decimal, required=True, metavar="N", help="the layer (0-based)")
    ex.add_argument("--prompt", metavar="TEXT",
                    help="take the FFN input that llama.cpp's graph has at the layer for this text")
    ex.add_argument("--activations", metavar="FILE.npy",
                    help="or these activations: float32 (n_tokens, n_embd), the FFN input")
    ex.add_argument("--cpu", default=None, metavar="PROFILE",
                    help="the llama.cpp CPU build to reproduce (as for generate)")
    ex.add_argument("--out", metavar="FILE.npz", help="also write x, ids, weights, cpu, route")
    ex.add_argument("--json", action="store_true", help="machine-readable output")
    ex.set_defaults(func=cmd_experts)


def add_matmul(sub) -> None:
    mm = sub.add_parser(
        "matmul", help="one weight times activations through a route, or an engine's result checked",
        description="y = x W^T for weight TENSOR and --activations X.npy (float32, tokens x cols) through "
                    "a route: cpu (ggml-cpu's mat-mul of a profile, bitwise), mmvq (the CUDA q8_1 "
                    "mat-vec, bitwise), gemm-f16 / gemm-f32 (the cuBLAS routes, within their derived "
                    "error bound). --out writes the route's y; --compare checks an engine's y. Exit 0 "
                    "when equal (within the bound), 1 when not, 2 on bad input.",
        formatter_class=Help)
    mm.add_argument("model", metavar="MODEL", help="registry model or .gguf path")
    mm.add_argument("tensor", metavar="TENSOR", help="a 2-D weight tensor")
    mm.add_argument("--activations", required=True, metavar="X.npy", help="float32 (tokens, cols) or (cols,)")
    mm.add_argument("--route", required=True, choices=["mmvq", "gemm-f16", "gemm-f32", "cpu"], help="the route")
    mm.add_argument("--cpu", default=None, metavar="PROFILE", help="the profile of --route cpu")
    mm.add_argument("--out", default=None, metavar="Y.npy", help="write the route's float32 (tokens, rows)")
    mm.add_argument("--compare", default=None, metavar="Y.npy", help="an engine's float32 (tokens, rows)")
    mm.add_argument("--worst", type=decimal, default=5, metavar="N", help="largest ulp distances listed")
    mm.add_argument("--json", action="store_true", help="machine-readable comparison")
    mm.set_defaults(func=cmd_matmul)

"""`strata-ref experts` and `matmul`: one MoE layer's experts, or one weight
times an engine's activations, through llama.cpp's CPU arithmetic and a
GPU route's oracle."""
from __future__ import annotations

import json
import os

from .._text import printable
from .common import Help, cpu_problem, err, json_out


_NPY_ASK = "give float32 (n, n_embd) saved with numpy.save"


def _load_activations(path):
    """(array, None) of `experts --activations FILE`, or (None, the line
    that says why not): a regular file in NumPy's .npy format holding a
    2-D float32 array; never unpickled."""
    import stat

    import numpy as np
    where = f"--activations {path}"
    if not stat.S_ISREG(os.stat(path).st_mode):
        return None, f"{where}: not a regular file"
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic[:4] == b"PK\x03\x04":
        return None, f"{where}: a .npz archive, not a .npy array; {_NPY_ASK}"
    if magic != b"\x93NUMPY":
        return None, f"{where}: not a .npy file (no NumPy header); {_NPY_ASK}"
    fmt = np.lib.format
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(f)
        except ValueError as e:
            return None, f"{where}: a damaged .npy header ({e}); {_NPY_ASK}"
        data_at = f.tell()
    if dtype.hasobject:
        return None, f"{where}: holds Python objects, not numbers; {_NPY_ASK}"
    if dtype != np.float32 or len(shape) != 2:
        return None, f"{where}: needs a float32 .npy array (n, n_embd), got {dtype} {shape}"
    need = data_at + shape[0] * shape[1] * 4
    size = os.path.getsize(path)
    if size < need:
        return None, (f"{where}: the header says float32 {shape}, {need - data_at} bytes, the file "
                      f"holds {size - data_at}; is it cut short?")
    return np.load(path, allow_pickle=False), None


def _npz_out_problem(path) -> str | None:
    """Why `experts --out PATH` would not be written, or None: PATH must not
    be a directory, nor a file other than a .npz (zip) archive, and its
    directory must exist; checked before the work."""
    where = f"--out {path}"
    if os.path.isdir(path):
        return f"{where}: a directory; give a file name, such as {os.path.join(path, 'experts.npz')}"
    if os.path.lexists(path):
        if not os.path.isfile(path):
            return f"{where}: not a regular file"
        with open(path, "rb") as f:
            if f.read(4) not in (b"PK\x03\x04", b""):
                return f"{where}: the file exists and is not a .npz archive; give another --out, or remove it"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{where}: {parent} is not a directory"
    return None


def _save_npz(path, **arrays) -> None:
    """numpy.savez into exactly `path` (savez given a name adds `.npz`),
    through a temporary file beside it, so that a failure leaves no half
    archive and the old one, if any, whole."""
    import tempfile

    import numpy as np
    real = os.path.realpath(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(real), prefix=".strata-ref-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, real)
    except BaseException:
        os.unlink(tmp)
        raise


def cmd_experts(a) -> int:
    from ..hashing import hash_array
    from ..infer import load
    from ..infer.expert_check import check_experts
    if (a.prompt is None) == (a.activations is None):
        return err("experts takes --prompt TEXT or --activations FILE.npy (one of them)")
    bad_cpu = cpu_problem(a.cpu)
    if bad_cpu:
        return err(bad_cpu)
    bad_out = _npz_out_problem(a.out) if a.out else None
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
        _save_npz(a.out, x=c.x, ids=c.ids, weights=c.weights, cpu=c.cpu, route=c.route,
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
    from ..probe import compare_output, load_activations, open_tensor, route_matmul
    if (a.out is None) == (a.compare is None):
        return err("matmul takes --out Y.npy or --compare Y.npy (one of them)")
    if a.route != "cpu" and a.cpu is not None:
        return err("--cpu goes with --route cpu")
    bad = cpu_problem(a.cpu) if a.route == "cpu" else None
    if bad:
        return err(bad)
    _, t = open_tensor(a.model, a.tensor)
    x = load_activations(a.activations, t.cols)
    y, bound = route_matmul(a.model, a.tensor, x, a.route, a.cpu)
    head = (f"{printable(a.tensor)} ({t.type.name}, {t.rows} x {t.cols}) x {x.shape[0]} activation rows, "
            f"route {a.route}: fnv1a64 {hash_array(y):016x}")
    if a.out is not None:
        np.save(a.out, y, allow_pickle=False)
        print(f"{head}; written {printable(a.out)} (float32 {y.shape[0]} x {y.shape[1]})")
        return 0
    try:
        got = np.load(a.compare, allow_pickle=False)
    except (OSError, ValueError) as e:
        return err(f"--compare {a.compare}: cannot be read as .npy ({e})")
    if not isinstance(got, np.ndarray) or got.dtype != np.float32:
        return err(f"--compare {a.compare}: needs float32 values, got {getattr(got, 'dtype', '?')}")
    if got.ndim == 1 and y.shape[0] == 1:
        got = got[None]
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
                                                   "qwen3moe or qwen3next model")
    ex.add_argument("--layer", type=int, required=True, metavar="N", help="the layer (0-based)")
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
    mm.add_argument("--worst", type=int, default=5, metavar="N", help="largest ulp distances listed")
    mm.add_argument("--json", action="store_true", help="machine-readable comparison")
    mm.set_defaults(func=cmd_matmul)

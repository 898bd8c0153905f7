"""Dump llama.cpp's intermediate tensors of one forward pass, to find where
our CPU inference departs from ggml-cpu's arithmetic.

Runs a model through llama-cpp-python 0.3.36 with the settings of
`tools/llama_ref.py` (n_ctx 512, 2 threads, flash attention off, F16 KV
cache) and a graph-evaluation callback (`cb_eval`) that copies every F32 node
llama.cpp computes, in evaluation order, with its name (e.g. `attn_norm-0`,
`Qcur-0`, `kq_soft_max-0`, `ffn_out-3`, `result_output`) and ggml op.

  python tools/llama_dump.py MODEL.gguf OUT.npz [--tokens 1,2,3 | --prompt-ref]
      [--split N]

  python tools/llama_dump.py MODEL.gguf OUT.npz --prompt-ref --split 5
      --vectors 2,3 [--call 7]
      (small test vectors instead of a dump: `vectors` below)
  python tools/llama_dump.py MODEL.gguf OUT.npz --tokens IDS --split 5
      --matrix 0|output [--call 3]
      (one weight matrix with its inputs and outputs: `matrix_vectors`)

`--profile P` runs against the llama.cpp peer built for CPU profile P
(tools/peer_build.py, tools/peer_env.py): OUT may then be a bare file name,
written under tests/data/P/, and `--prompt-ref` reads that profile's
reference ids.

`--prompt-ref` takes the 37 ids (prompt + greedy continuation) stored in
tests/data/llama_ref_<stem of MODEL>.npz. `--split N` evaluates the first N ids in
one call and then the rest one id per call (the incremental pass); the
default is one batched call. Keys of OUT: `<call>:<index>:<name>` with the
tensor as float32 in ggml's ne order reversed (numpy shape (ne3, ne2, ne1,
ne0)), `<...>:op` its ggml op number. The dumps are large: keep them out of
git.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))


class GGMLTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml/include/ggml.h (GGML_MAX_DIMS 4,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _read(t: GGMLTensor) -> np.ndarray | None:
    """The tensor's values as float32 (ne3, ne2, ne1, ne0), F32 and F16 only."""
    if t.type not in (0, 1) or not t.data:
        return None
    esz = 4 if t.type == 0 else 2
    ne, nb = list(t.ne), list(t.nb)
    span = sum((n - 1) * b for n, b in zip(ne, nb)) + esz
    buf = (ctypes.c_char * span).from_address(t.data)
    raw = np.frombuffer(bytes(buf), np.uint8)
    a = np.lib.stride_tricks.as_strided(raw.view(np.float32 if esz == 4 else np.float16),
                                        shape=ne[::-1], strides=nb[::-1])
    return np.array(a, np.float32)


def dump(model: str, ids: list[int], split: int | None):
    import llama_cpp
    from llama_cpp import llama_cpp as C
    path = Path(model)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2,
                          n_threads_batch=2, seed=0, logits_all=True, verbose=False)
    store: dict[str, np.ndarray] = {}
    state = {"call": 0, "i": 0}

    @C.ggml_backend_sched_eval_callback
    def cb(tp, ask, _ud):
        if ask:
            return True
        t = ctypes.cast(tp, ctypes.POINTER(GGMLTensor)).contents
        a = _read(t)
        if a is not None:
            key = f"{state['call']}:{state['i']:04d}:{t.name.decode()}"
            store[key] = a
            store[key + ":op"] = np.int32(t.op)
            state["i"] += 1
        return True

    params = llm.context_params
    params.cb_eval = cb
    params.cb_eval_user_data = None
    params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = C.llama_init_from_model(llm.model, params)
    calls = [ids] if split is None else [ids[:split]] + [[t] for t in ids[split:]]
    pos = 0
    logits = []
    for call in calls:
        n = len(call)
        batch = C.llama_batch_init(n, 0, 1)
        for i, tok in enumerate(call):
            batch.token[i] = tok
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = n
        state["i"] = 0
        if C.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        nv = llm.n_vocab()
        lp = C.llama_get_logits(ctx)
        logits.append(np.ctypeslib.as_array(lp, shape=(n * nv,)).reshape(n, nv).copy())
        C.llama_batch_free(batch)
        pos += n
        state["call"] += 1
    C.llama_free(ctx)
    store["logits"] = np.concatenate(logits).astype(np.float32)
    store["ids"] = np.array(ids, np.int32)
    return store


def _by_name(store: dict, call: int) -> dict:
    """{name: [arrays in evaluation order]} of one call of a dump."""
    out: dict = {}
    for k in sorted(store):
        parts = k.split(":")
        if len(parts) == 3 and parts[0] == str(call):
            out.setdefault(parts[2], []).append(store[k])
    return out


def vectors(model: str, ids: list[int], layers: list[int], split: int, call: int) -> dict:
    """Small llama.cpp reference vectors for tests/test_infer_ggml_ops.py:
    for each layer in `layers`, the inputs and outputs of its mat-muls, the
    attention of KV head 0 (query heads 0 .. G-1), SwiGLU and RoPE, for rows
    0 and n-1 of the batched pass over `ids` ("b_" keys, n = len(ids)) and
    for the single-token call `call` of the incremental pass that evaluates
    ids[:split] first ("d_" keys). Float32, except the F16 K/V cache cells
    (float16)."""
    out: dict = {"ids": np.array(ids, np.int32), "layers": np.array(layers, np.int32),
                 "split": np.int32(split), "call": np.int32(call)}
    for tag, st, c, rows in (("b", dump(model, ids, None), 0, [0, len(ids) - 1]),
                             ("d", dump(model, ids, split), call, [0])):
        g = _by_name(st, c)
        pos = np.array(rows) if tag == "b" else np.array([split + call - 1])
        out[f"{tag}_rows"] = np.array(rows, np.int32)
        out[f"{tag}_pos"] = pos.astype(np.int32)
        out[f"{tag}_n"] = np.int32(len(ids) if tag == "b" else 1)
        for il in layers:
            q = g[f"Qcur-{il}"]        # mul_mat, (+ bias), reshaped, roped
            v = g[f"Vcur-{il}"]
            T = int(pos.max()) + 1
            nh = q[-1].shape[2]
            nkv = g[f"cache_k_l{il} (view) (permuted)"][0].shape[1]
            G = nh // nkv
            sel = {
                "attn_norm": g[f"attn_norm-{il}"][0][0, 0][rows],
                "q_mm": q[0][0, 0][rows], "v_mm": v[0][0, 0][rows],
                "q_biased": q[-2][0][rows], "q_rope": q[-1][0][rows],
                "k_cache": g[f"cache_k_l{il} (view) (permuted)"][0][0, 0, :T].astype(np.float16),
                "v_cache": g[f"cache_v_l{il} (view) (permuted)"][0][0, 0, :, :T].astype(np.float16),
                "q_attn": g[f"Qcur-{il} (view) (permuted)"][0][0, :G][:, rows],
                "kq": g[f"kq-{il}"][0][0, :G][:, rows], "kq_soft_max": g[f"kq_soft_max-{il}"][0][0, :G][:, rows],
                "kqv": g[f"kqv-{il}"][0][0, :G][:, rows],
                "ffn_norm": g[f"ffn_norm-{il}"][0][0, 0][rows],
                "ffn_gate": g[f"ffn_gate-{il}"][0][0, 0][rows], "ffn_up": g[f"ffn_up-{il}"][0][0, 0][rows],
                "ffn_swiglu": g[f"ffn_swiglu-{il}"][0][0, 0][rows], "ffn_out": g[f"ffn_out-{il}"][0][0, 0][rows],
            }
            for k, a in sel.items():
                out[f"{tag}_{il}_{k}"] = a if a.dtype == np.float16 else a.astype(np.float32)
    return out


def matrix_vectors(model: str, ids: list[int], split: int, call: int, which: str) -> dict:
    """Test vectors of one weight matrix, self-contained: the raw GGUF bytes
    of `blk.<which>.attn_q.weight` (which = a layer number) or of
    `output.weight` (which = "output"), read with strata_ref.gguf (so run
    this with an interpreter that has both strata_ref and llama_cpp), and
    llama.cpp's input (`attn_norm` / `result_norm`) and output (the mul_mat
    node of `Qcur` / `result_output`) rows of the batched pass over `ids`
    ("b_x", "b_y") and of the single-token call `call` after a prompt of
    `split` ids ("d_x", "d_y")."""
    sys.path.insert(0, str(REPO))
    from strata_ref import gguf
    if which == "output":
        name, x_name, y_name = "output.weight", "result_norm", "result_output"
    else:
        name, x_name, y_name = f"blk.{which}.attn_q.weight", f"attn_norm-{which}", f"Qcur-{which}"
    t = {t.name: t for t in gguf.read(model).tensors}[name]
    out = {"w_raw": np.asarray(t.data, np.uint8).reshape(-1), "w_type": np.int32(t.type),
           "w_rows": np.int32(t.rows), "w_cols": np.int32(t.cols), "w_name": np.array(name),
           "ids": np.array(ids, np.int32)}
    for tag, st, c in (("b", dump(model, ids, None), 0), ("d", dump(model, ids, split), call)):
        g = _by_name(st, c)
        out[f"{tag}_x"] = g[x_name][0][0, 0].astype(np.float32)
        out[f"{tag}_y"] = g[y_name][0][0, 0].astype(np.float32)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--tokens")
    ap.add_argument("--prompt-ref", action="store_true")
    ap.add_argument("--split", type=int)
    ap.add_argument("--vectors", metavar="LAYERS",
                    help="comma-separated layers: write test vectors (see `vectors`) instead of a dump; "
                         "needs --split; the decode call is --call")
    ap.add_argument("--call", type=int, default=7)
    ap.add_argument("--matrix", metavar="LAYER|output",
                    help="write `matrix_vectors` of this layer's attn_q (or of output.weight) "
                         "instead of a dump (needs --split)")
    ap.add_argument("--profile", help="run against the peer built for this CPU profile")
    if argv is None:
        from peer_env import ensure_profile
        ensure_profile(__file__)
    args = ap.parse_args(argv)
    from peer_env import data_dir, provenance
    if args.profile and Path(args.out).name == args.out:
        args.out = str(data_dir() / args.out)
    if args.prompt_ref:
        ref = np.load(data_dir() / f"llama_ref_{Path(args.model).stem}.npz")
        ids = [int(t) for t in np.concatenate([ref["prompt_ids"], ref["greedy_ids"]])]
    else:
        ids = [int(t) for t in args.tokens.split(",")]
    if args.vectors or args.matrix is not None:
        import llama_cpp
        if args.matrix is not None:
            store = matrix_vectors(args.model, ids, args.split, args.call, args.matrix)
        else:
            store = vectors(args.model, ids, [int(v) for v in args.vectors.split(",")], args.split, args.call)
        store.update(provenance("tools/llama_dump.py"))
        argv_s = [Path(args.model).name if a == args.model else a for a in (argv or sys.argv[1:])]
        store["command"] = np.array("python tools/llama_dump.py " + " ".join(argv_s))
        np.savez_compressed(args.out, **store)
        print(f"{args.out}: {len(store)} arrays")
        return 0
    store = dump(args.model, ids, args.split)
    np.savez(args.out, **store)
    names = sorted({k.split(":")[2] for k in store if k.count(":") == 2 and k.startswith("0:")})
    print(f"{args.out}: {len(store)} arrays; call 0 names: {', '.join(names[:40])} ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

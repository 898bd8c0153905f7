"""Dump llama.cpp's intermediate tensors of one forward pass, to find where
our CPU inference departs from ggml-cpu's arithmetic.

Runs a model through llama-cpp-python 0.3.36 with the settings of
`tools/llama_ref.py` (n_ctx 512, 2 threads; flash attention off and an F16
KV cache unless `--flash-attn on`, `--cache-type-k T`, `--cache-type-v T`
say otherwise) and a graph-evaluation callback (`cb_eval`) that copies every F32 node
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
  python tools/llama_dump.py MODEL.gguf OUT.npz --kv-ref CONFIG --split 6
      --attn 2 --calls 1,8 --cache-type-k q8_0 --cache-type-v q8_0
      --flash-attn on
      (one layer's flash attention and Hadamard rotations: `attn_vectors`)
  python tools/llama_dump.py MODEL.gguf OUT.npz --trace (--tokens IDS | --prompt TEXT)
      [--split N] [--tensors PATTERNS] [--all] [--compress] [--flash-attn on]
      (the Python driver of the trace container, docs/trace.md: `trace` below;
      tools/llama_trace.c is the C one)

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


#: ggml type ids of the KV cache types -> (block values, block bytes)
_KV_TYPE_BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20),
                  6: (32, 22), 7: (32, 24), 20: (32, 18)}
_KV_TYPE_NAMES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6,
                  "q5_1": 7, "iq4_nl": 20}
_KV_ID_NAMES = {v: k for k, v in _KV_TYPE_NAMES.items()}
#: ggml ops (`enum ggml_op`, ggml.h) and the mul_mat hint the dumps look for
OP_MUL_MAT, OP_FLASH_ATTN_EXT, HINT_SRC0_IS_HADAMARD = 29, 74, 1


def _read_rows(t: GGMLTensor) -> np.ndarray:
    """Any tensor's rows as raw bytes, uint8 (ne3, ne2, ne1, row bytes),
    following its strides (a permuted view of a quantized cache too)."""
    blck, tsize = _KV_TYPE_BLOCK[t.type]
    ne, nb = list(t.ne), list(t.nb)
    rb = ne[0] // blck * tsize
    out = np.empty((ne[3], ne[2], ne[1], rb), np.uint8)
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                a = t.data + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
                out[i3, i2, i1] = np.frombuffer(bytes((ctypes.c_char * rb).from_address(a)), np.uint8)
    return out


def _src(t: GGMLTensor, i: int) -> GGMLTensor | None:
    return ctypes.cast(t.src[i], ctypes.POINTER(GGMLTensor)).contents if t.src[i] else None


def dump(model: str, ids: list[int], split: int | None, type_k: int = 1, type_v: int = 1,
         flash_attn: bool = False, capture=None, on_init=None):
    """Run `ids` through llama.cpp (n_ctx 512, or the next multiple of 256
    that holds the ids; 2 threads; KV cache types `type_k` / `type_v` as
    ggml type ids, flash attention on or off) and return {key: array} of
    every F32/F16 node (`<call>:<index>:<name>`, `...:op`), or what
    `capture(t, call, store)` stores for each evaluated node when given;
    plus "logits" and "ids". on_init(llm): called once the model is
    loaded, before the first call."""
    import llama_cpp
    from llama_cpp import llama_cpp as C
    path = Path(model)
    n_ctx = max(512, -(-len(ids) // 256) * 256)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2,
                          n_threads_batch=2, seed=0, logits_all=True, verbose=False)
    store: dict[str, np.ndarray] = {}
    state = {"call": 0, "i": 0}

    @C.ggml_backend_sched_eval_callback
    def cb(tp, ask, _ud):
        if ask:
            return True
        t = ctypes.cast(tp, ctypes.POINTER(GGMLTensor)).contents
        if capture is not None:
            capture(t, state["call"], store)
            return True
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
    params.flash_attn_type = (C.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else C.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    params.type_k = type_k
    params.type_v = type_v
    ctx = C.llama_init_from_model(llm.model, params)
    if not ctx:
        raise RuntimeError(f"llama.cpp refused the context (type_k {type_k}, type_v {type_v}, "
                           f"flash_attn {flash_attn})")
    if on_init is not None:
        on_init(llm)
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


def _ggml_base():
    """libggml-base of the llama_cpp package this process imports, with
    `ggml_op_desc` declared."""
    import os
    import llama_cpp
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_op_desc.restype = ctypes.c_char_p
    lib.ggml_op_desc.argtypes = [ctypes.c_void_p]
    return lib


def _model_info(llm) -> dict:
    """The model identity llama.cpp reports (`strata_ref.tracefile.MODEL_KEYS`)."""
    from llama_cpp import llama_cpp as C
    m = llm.model

    def meta(key):
        buf = ctypes.create_string_buffer(512)
        n = C.llama_model_meta_val_str(m, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "backslashreplace") if n >= 0 else ""
    return {"arch": meta("general.architecture"), "name": meta("general.name"),
            "n_params": int(C.llama_model_n_params(m)), "size": int(C.llama_model_size(m)),
            "n_vocab": int(llm.n_vocab()), "n_embd": int(C.llama_model_n_embd(m)),
            "n_layer": int(C.llama_model_n_layer(m))}


def trace(model: str, ids: list[int], split: int | None, out: str, type_k: int = 1, type_v: int = 1,
          flash_attn: bool = False, patterns=None, all_nodes: bool = False, compress: bool = False,
          options: dict | None = None) -> int:
    """The Python driver of the trace container (docs/trace.md): run `ids`
    through llama.cpp as `dump` does and stream every node `cb_eval`
    reports into `out` with `strata_ref.tracefile.TraceWriter`: named as
    llama.cpp named it, a node ggml left unnamed by its op and sources
    (`tracefile.derived_name`), its op by `ggml_op_desc`, values of F32
    (float32), F16 (float16) and I32 (int32) nodes. Views and the copies
    into the KV cache (`tracefile.SKIPPED_OPS`) are left out unless
    all_nodes; patterns: fnmatch globs of names to keep. Returns the
    number of nodes written (tools/llama_trace.c writes the same).
    options: more keys for the container's `options` (the command, the
    model's sha256)."""
    import fnmatch
    import llama_cpp
    sys.path.insert(0, str(REPO))
    from strata_ref.tracefile import SKIPPED_OPS, TraceWriter, derived_name, is_auto_name
    lib = _ggml_base()
    calls = [ids] if split is None else [ids[:split]] + [[t] for t in ids[split:]]
    names: dict = {}
    state: dict = {}

    def name_of(addr) -> str:
        if addr in names:
            return names[addr]
        t = ctypes.cast(addr, ctypes.POINTER(GGMLTensor)).contents
        return t.name.decode("utf-8", "backslashreplace")

    def on_init(llm):
        opts = {"flash_attn": bool(flash_attn), "type_k": _KV_ID_NAMES[type_k], "type_v": _KV_ID_NAMES[type_v],
                "n_threads": 2, "n_ctx": llm.n_ctx(), "llama_cpp_version": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode(), **(options or {})}
        state["w"] = TraceWriter(out, ids, [len(c) for c in calls], _model_info(llm),
                                 "tools/llama_dump.py --trace (llama-cpp-python "
                                 f"{llama_cpp.__version__})", opts, compress)

    def capture(t, call, store):
        addr = ctypes.addressof(t)
        op = lib.ggml_op_desc(addr).decode()
        name = t.name.decode("utf-8", "backslashreplace")
        if is_auto_name(name):
            name = derived_name(op, [name_of(s) for s in t.src if s])
            names[addr] = name
        else:
            names.pop(addr, None)
        if not all_nodes and op in SKIPPED_OPS:
            return
        if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            return
        if 0 in list(t.ne):
            a = np.zeros(list(t.ne)[::-1], {26: np.int32, 1: np.float16}.get(t.type, np.float32))
        elif t.type == 26:                            # GGML_TYPE_I32
            ne, nb = list(t.ne), list(t.nb)
            span = sum((n - 1) * b for n, b in zip(ne, nb)) + 4
            raw = np.frombuffer(bytes((ctypes.c_char * span).from_address(t.data)), np.uint8)
            a = np.array(np.lib.stride_tricks.as_strided(raw.view(np.int32), shape=ne[::-1],
                                                         strides=nb[::-1]))
        elif t.type in (0, 1) and t.data:
            a = _read(t)
            a = a if t.type == 0 else a.astype(np.float16)
        else:
            return
        state["w"].add(call, op, name, a)

    try:
        dump(model, ids, split, type_k, type_v, flash_attn, capture=capture, on_init=on_init)
    except BaseException:
        if "w" in state:
            state["w"].abort()
        raise
    state["w"].close()
    return state["w"].n


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


def attn_vectors(model: str, ids: list[int], split: int, calls: list[int], layer: int,
                 type_k: int, type_v: int, flash_attn: bool) -> dict:
    """Test vectors of llama.cpp's attention around a KV cache of types
    type_k / type_v with flash attention on (tests/test_kv_cache.py): for
    the batched pass over `ids` ("b_") and the single-token calls `calls`
    of the incremental pass after ids[:split] ("d<call>_"), layer `layer`'s
    flash-attention node for KV head 0: its inputs q (float32 (G, n,
    head_dim): the G query heads of KV head 0), K and V (the cache view's
    rows, uint8 (n_kv, row bytes)) and mask (float32 (n, n_kv)), its output
    (float32 (n, G, head_dim)) and scale; and every Hadamard mul_mat of the
    layer (`llama_mul_mat_hadamard`, hint GGML_HINT_SRC0_IS_HADAMARD): its
    input and output rows (float32) and, once, the rotation matrices
    themselves ("rot_<n>", float32 (n, n))."""
    out: dict = {"ids": np.array(ids, np.int32), "split": np.int32(split),
                 "calls": np.array(calls, np.int32), "layer": np.int32(layer),
                 "type_k": np.int32(type_k), "type_v": np.int32(type_v),
                 "flash_attn": np.bool_(flash_attn)}

    def capture(t, call, store):
        # store: this call's captures; "_fa" counts the flash-attention
        # nodes seen (one per layer, in layer order)
        if t.op == OP_FLASH_ATTN_EXT:
            il = store.get("_fa", 0)
            store["_fa"] = il + 1
            if il != layer:
                return
            q, k, v, mask = (_src(t, i) for i in range(4))
            g = q.ne[2] // k.ne[2]
            store["fa_q"] = _read(q)[0, :g]
            store["fa_k"] = _read_rows(k)[0, 0]
            store["fa_v"] = _read_rows(v)[0, 0]
            store["fa_mask"] = _read(mask)[0, 0, :q.ne[1]]
            store["fa_out"] = _read(t)[0, :, :g]
            store["fa_scale"] = np.frombuffer(np.int32(t.op_params[0]).tobytes(), np.float32)[0]
        elif t.op == OP_MUL_MAT and t.op_params[1] == HINT_SRC0_IS_HADAMARD:
            rot, x = _src(t, 0), _src(t, 1)
            store.setdefault(f"rot_{rot.ne[0]}", _read(rot)[0, 0])
            name = x.name.decode()                 # "Qcur-3 (reshaped)", "kqv_out-3 (reshaped)"
            base = name.split(" ")[0]
            if base.endswith(f"-{layer}"):
                which = base.rsplit("-", 1)[0]
                store[f"rot_{which}_in"] = _read(x)[0, 0]
                store[f"rot_{which}_out"] = _read(t)[0, 0]

    for tag, split_at in (("b", None), ("d", split)):
        per_call: dict = {}
        dump(model, ids, split_at, type_k, type_v, flash_attn,
             capture=lambda t, call, store: capture(t, call, per_call.setdefault(call, {})))
        for call, got in per_call.items():
            if (tag == "b" and call != 0) or (tag == "d" and call not in calls):
                continue
            prefix = "b_" if tag == "b" else f"d{call}_"
            for key, a in got.items():
                if key.startswith("_"):
                    continue
                if key.startswith("rot_") and key[4:].isdigit():
                    out.setdefault(key, a)
                else:
                    out[prefix + key] = a
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
    ap.add_argument("--attn", metavar="LAYER", type=int,
                    help="write `attn_vectors` of this layer (needs --split and --flash-attn on); "
                         "the decode calls are --calls")
    ap.add_argument("--calls", default="1", help="comma-separated decode calls for --attn")
    ap.add_argument("--cache-type-k", default="f16", choices=sorted(_KV_TYPE_NAMES))
    ap.add_argument("--cache-type-v", default="f16", choices=sorted(_KV_TYPE_NAMES))
    ap.add_argument("--flash-attn", default="off", choices=("on", "off"))
    ap.add_argument("--kv-ref", metavar="CONFIG",
                    help="take the ids (prompt + greedy) of this configuration of "
                         "tests/data/<profile>/llama_kv_<stem of MODEL>.npz")
    ap.add_argument("--profile", help="run against the peer built for this CPU profile")
    ap.add_argument("--trace", action="store_true",
                    help="write OUT as a trace container (docs/trace.md; `trace` above) instead of a dump")
    ap.add_argument("--prompt", help="--trace: the ids of this text, tokenized by llama.cpp (BOS added "
                                     "as the model says, special tokens not parsed)")
    ap.add_argument("--tensors", help="--trace: comma-separated fnmatch patterns of node names to keep")
    ap.add_argument("--all", action="store_true", help="--trace: keep views and cache copies too")
    ap.add_argument("--compress", action="store_true", help="--trace: deflate the entries")
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
    elif args.prompt is not None:
        import llama_cpp
        ids = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False).tokenize(
            args.prompt.encode(), add_bos=True, special=False)
    elif args.kv_ref:
        ref = np.load(data_dir() / f"llama_kv_{Path(args.model).stem}.npz")
        ids = [int(t) for t in np.concatenate([ref[f"{args.kv_ref}:prompt_ids"],
                                               ref[f"{args.kv_ref}:greedy_ids"]])]
    else:
        ids = [int(t) for t in args.tokens.split(",")]
    tk, tv = _KV_TYPE_NAMES[args.cache_type_k], _KV_TYPE_NAMES[args.cache_type_v]
    fa = args.flash_attn == "on"
    if args.trace:
        pats = [p for p in (args.tensors or "").split(",") if p] or None
        import hashlib
        from peer_env import profile
        argv_s = [Path(args.model).name if a == args.model else a for a in (argv or sys.argv[1:])]
        extra = {"command": "python tools/llama_dump.py " + " ".join(argv_s), "profile": profile(),
                 "model_sha256": hashlib.sha256(Path(args.model).read_bytes()).hexdigest()}
        n = trace(args.model, ids, args.split, args.out, tk, tv, fa, pats, args.all, args.compress, extra)
        print(f"{args.out}: {n} tensors, {len(ids)} tokens")
        return 0
    if args.vectors or args.matrix is not None or args.attn is not None:
        import llama_cpp
        if args.attn is not None:
            store = attn_vectors(args.model, ids, args.split, [int(c) for c in args.calls.split(",")],
                                 args.attn, tk, tv, fa)
        elif args.matrix is not None:
            store = matrix_vectors(args.model, ids, args.split, args.call, args.matrix)
        else:
            store = vectors(args.model, ids, [int(v) for v in args.vectors.split(",")], args.split, args.call)
        store.update(provenance("tools/llama_dump.py"))
        argv_s = [Path(args.model).name if a == args.model else a for a in (argv or sys.argv[1:])]
        store["command"] = np.array("python tools/llama_dump.py " + " ".join(argv_s))
        np.savez_compressed(args.out, **store)
        print(f"{args.out}: {len(store)} arrays")
        return 0
    store = dump(args.model, ids, args.split, tk, tv, fa)
    np.savez(args.out, **store)
    names = sorted({k.split(":")[2] for k in store if k.count(":") == 2 and k.startswith("0:")})
    print(f"{args.out}: {len(store)} arrays; call 0 names: {', '.join(names[:40])} ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

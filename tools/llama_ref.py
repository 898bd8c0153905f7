"""Reference data from llama.cpp (through llama-cpp-python) for the CPU
inference tests, stored small and compressed under tests/data.

Needs llama-cpp-python 0.3.36 (built from source; see spec/models.md §7) in
the running interpreter. Subcommands:

  logits MODEL [--out tests/data/llama_ref_<name>.npz] [--topk 128]
      Greedy 32-token continuation of "The capital of France is" (n_ctx 512,
      n_batch 512, 2 threads, seed 0), then two sets of logits over the 37
      ids (prompt + continuation): "batched" (one teacher-forced pass) and
      "incr" (the prompt pass, then one token per call). Each row is kept as
      its top-k ids and logits plus the log-sum-exp over the full vocabulary
      (float64), enough to compute top-1 agreement and the KL divergence
      restricted to the top-k plus one tail bucket; with the model file's
      sha256. A rotated SmolLM2 (tests/test_rotate.py) is made by
      `strata-ref rotate smollm2 smollm2-rot-q8_0.gguf --type Q8_0
      --seed 0`, then `logits smollm2-rot-q8_0.gguf --out
      tests/data/<profile>/llama_ref_smollm2-rot-q8_0.npz`.

  synthetic [--out tests/data/llama_ref_tiny.npz]
      Tiny random qwen3 and gemma3 models (tests/infer_helpers.py
      `tiny_model`, seed 0; Q8_0 matrices, sliding window for gemma3): the
      logits of one batched pass over `TINY_IDS`, every row, float32, with
      the sha256 of each GGUF so a test can tell it rebuilt the same file.

  typed [--out tests/data/llama_ref_typed.npz]
      Small random qwen3 models whose matrices are all IQ4_NL, resp. MXFP4
      (tests/typed_models.py `typed_model`, seed 0; rows % 8 == 0, so the
      AVX2 builds repack them): the logits of every row of one batched
      pass over `IDS` and of an incremental one (`N_PROMPT` tokens, then
      one per call), float32, with the sha256 of each GGUF.

  moe [--arch A,B] [--out FILE]
      Tiny seeded MoE / hybrid models (tests/infer_helpers.py
      `tiny_moe_model`, seed `moe_seed(arch)`, one per architecture): the prompt
      `TINY_IDS`, llama.cpp's `MOE_N_GREEDY` greedy tokens, and every logit
      of every row of the incremental pass (prompt, then one token per call)
      and of one batched teacher-forced pass, float32, with the GGUF's
      sha256; one file per architecture, tests/data/<profile>/
      llama_ref_moe_<arch>.npz. All with n_ctx 512; the architectures of
      `MOE_CTX` also with each smaller context listed there (keys
      ctx<N>_greedy_ids, ctx<N>_batched, ctx<N>_incr: phi3's short LongRoPE
      factors).
      With --flash-attn: the same with flash attention on (F16 cache),
      into tests/data/<profile>/llama_ref_moe_fa_<arch>.npz, plus a long
      run (`FA_LONG_IDS`: 270 prompt ids, then 8 greedy tokens, keys
      long_prompt_ids, long_greedy_ids, and the `row_hashes` of every row,
      long_batched_hash, long_incr_hash): its batched pass takes flash
      attention's tiled path (64+ tokens), its decode steps the split-KV
      path (512 KV cells). The deepseek2 files were made by
      `python tools/llama_ref.py --profile P moe --arch deepseek2,deepseek2-v3
      --flash-attn` for P = scalar, avx2, and avx512 on a Sapphire Rapids
      CPU (as every avx512 file of this docstring). `--cache-type T` (with
      --flash-attn): K and V cache type T (llama.cpp requires them equal for
      MLA), into llama_ref_moe_fa_<T>_<arch>.npz. `--kv-lora-rank R`
      (deepseek2, deepseek2-v3): the model with compressed KV of rank R
      (`tiny_moe_model` kv_lora_rank), the file named after
      <arch>-r<R>; the files of the cached head of 192 (a multiple of 64,
      like DeepSeek V3's 576: tests/test_mla_head64.py) were made by
      `python tools/llama_ref.py --profile P moe --arch deepseek2
      --flash-attn --kv-lora-rank 160 --cache-type T` for P = scalar, avx2,
      avx512 and T = f16, q8_0, q4_0.
      `--real-yarn` (deepseek2-v3 only, with or without --flash-attn): the
      model with DeepSeek V3's own YaRN keys (`tiny_moe_model` real_yarn:
      factor 40, 4096 original positions, yarn_log_multiplier 0.1), into
      llama_ref_moe[_fa]_deepseek2-v3-yarn40.npz, which also store those
      keys (rope_scaling_factor, rope_orig_ctx, yarn_log_multiplier); made
      by `python tools/llama_ref.py --profile P moe --arch deepseek2-v3
      --real-yarn [--flash-attn]` for P = scalar, avx2
      (tests/test_deepseek2_yarn.py).

  moekv [--arch gemma4,gemma4-moe] [--configs NAME,...] [--out FILE]
      The tiny models of `moe` (same seeds) with a KV cache of another type
      or flash attention on (`MOEKV_CONFIGS`, names of `KV_CONFIGS`): for
      each configuration llama.cpp's greedy continuation and every logit of
      the incremental and batched passes as `moe` makes them. The "short"
      prompt is `TINY_IDS` (`MOE_N_GREEDY` greedy tokens), the "long" one
      BOS and the first `N_LONG` - 1 bytes of the quality prompts joined by
      newlines (byte b is token b in the tiny vocabulary; `N_GEN_LONG`
      greedy tokens): its batched pass takes flash attention's tiled path
      and its decode steps see 512 KV cells (the split-KV path). The rows
      of the configurations in `MOEKV_FULL` are stored as float32, the
      others' as their `row_hashes` hash and argmax (the files stay small;
      a hash still checks every bit of a row). One
      file per architecture, tests/data/<profile>/llama_kv_moe_<arch>.npz,
      made by `python tools/llama_ref.py --profile P moekv` (P: scalar,
      avx2; avx512 needs an AVX-512 CPU: its files were made with
      `--arch gemma4` and `--arch gemma4-moe` on a Sapphire Rapids CPU).

  pretok [--pre gpt-4o] [--corpus gpt-4o|wide] [--vocab NAME]
         [--out tests/data/llama_tok_<pre>.npz]
      llama.cpp's token ids (no BOS, no special parsing) of
      tests/infer_helpers.py `PRETOK_TEXTS` (`--corpus wide`:
      `pretok_corpus()`, the sdist's vocabulary-test texts plus
      `PRETOK_EXTRA`; the texts are stored) with the probe vocabulary
      `pretok_vocab(texts, PRE)`, in which every pre-tokenized piece is one
      token: a conformance set for a pre-tokenizer the sdist has no
      vocabulary of. `--vocab deepseek-llm` also stores the ids
      (vocab_lengths, vocab_ids) with the tokens and merges of that sdist
      vocabulary under PRE. The DeepSeek / Kimi files were made by
      `python tools/llama_ref.py --profile avx2 pretok --pre deepseek-v3
      --corpus wide --vocab deepseek-llm`, the same with `--pre kimi-k2`
      and `--pre deepseek-llm`, and with `--pre deepseek-coder --vocab
      deepseek-coder` (each file stores its command line).

  actquant [--out tests/data/ggml_act_quant.npz]
      Seeded activation vectors (and hand-made edge cases) quantized by
      ggml-cpu's own `from_float` for Q8_0, Q8_1 and Q8_K (the AVX2 build
      of the wheel), through ctypes on the wheel's libggml-cpu.so.

  kvcache MODEL [--configs NAME,...] [--out tests/data/llama_kv_<name>.npz]
      [--topk 32]
      llama.cpp with a KV cache of another type, flash attention on or off
      and the Hadamard rotation on or off (`KV_CONFIGS`, `KV_MODEL_CONFIGS`
      the ones made per model): for each configuration the greedy
      continuation of a prompt and the logits of prompt + continuation,
      batched and incremental as `logits` does, each row kept as its top-k
      ids and logits, the log-sum-exp and an 8-byte blake2b hash of the
      whole row's float32 bytes (`row_hashes`), so that a test can check
      every logit of a row. The "short" prompt is `logits`' (32 greedy
      tokens), the "long" one the first 270 ids of the quality prompts
      joined by newlines (8 greedy tokens): its batched pass has 64+
      tokens (flash attention's tiled path) and its decode steps see 512 KV
      cells (the split-KV path).

Every subcommand takes `--profile P` (a `strata_ref.cpu.profiles` name): it
then runs against the peer built for that profile by `tools/peer_build.py`
(the tool re-executes itself with that build first on PYTHONPATH), refuses
to run on a CPU that cannot execute the build, and writes under
tests/data/<profile>/. Without it, the llama_cpp importable here is used and
the files go to tests/data/.

The command line that made a file is stored in it (key "command"), with the
build's `llama_print_system_info()` ("system_info") and the profile.
"""
from __future__ import annotations

import argparse
import hashlib
import ctypes
import os
import shlex
import sys
from pathlib import Path

import numpy as np

PROMPT = "The capital of France is"
N_GEN = 32
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))


def _provenance() -> dict:
    from peer_env import provenance
    return provenance("tools/llama_ref.py")


def _data_dir() -> Path:
    from peer_env import data_dir
    return data_dir()


def _llama(path, logits_all=True):
    from llama_cpp import Llama
    return Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2,
                 n_threads_batch=2, seed=0, logits_all=logits_all, verbose=False)


def _topk(rows: np.ndarray, k: int):
    rows = rows.astype(np.float32)
    idx = np.argsort(-rows, axis=1, kind="stable")[:, :k]
    vals = np.take_along_axis(rows, idx, axis=1)
    r64 = rows.astype(np.float64)
    m = r64.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(r64 - m).sum(axis=1)))
    return idx.astype(np.int32), vals, lse


def cmd_logits(args) -> None:
    sys.path.insert(0, str(REPO))
    from strata_ref.models import resolve
    path = resolve(args.model)
    llm = _llama(path)
    ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    n_vocab = llm.n_vocab()
    # incremental: prompt pass, then one token per call
    llm.reset()
    llm.eval(ids)
    gen, incr = [], [np.array(llm.scores[:len(ids)], np.float32)]
    for _ in range(N_GEN):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(tok)
        llm.eval([tok])
        incr.append(np.array(llm.scores[llm.n_tokens - 1:llm.n_tokens], np.float32))
    incr = np.concatenate(incr)[:len(ids) + N_GEN]
    # batched teacher-forced pass over prompt + continuation
    llm.reset()
    llm.eval(ids + gen)
    batched = np.array(llm.scores[:len(ids) + N_GEN], np.float32)
    bi, bv, bl = _topk(batched, args.topk)
    ii, iv, il = _topk(incr, args.topk)
    out = Path(args.out or _data_dir() / f"llama_ref_{Path(path).stem}.npz")
    np.savez_compressed(
        out, prompt=np.array(PROMPT), prompt_ids=np.array(ids, np.int32),
        greedy_ids=np.array(gen, np.int32), n_vocab=np.int64(n_vocab),
        batched_ids=bi, batched_logits=bv, batched_lse=bl,
        incr_ids=ii, incr_logits=iv, incr_lse=il,
        sha256=np.array(hashlib.sha256(Path(path).read_bytes()).hexdigest()), **_provenance())
    print(f"{out}: prompt {ids}, greedy {gen}")
    print(repr(llm.detokenize(gen).decode("utf-8", "replace")))


#: name -> (type_k, type_v, flash_attn, rotation disabled, prompt)
KV_CONFIGS = {
    "f16-f16-fa": ("f16", "f16", True, False, "short"),
    "f32-f32": ("f32", "f32", False, False, "short"),
    "f32-f32-fa": ("f32", "f32", True, False, "short"),
    "bf16-bf16": ("bf16", "bf16", False, False, "short"),
    "bf16-bf16-fa": ("bf16", "bf16", True, False, "short"),
    **{f"{t}-{t}-fa": (t, t, True, False, "short")
       for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")},
    **{f"{t}-f16": (t, "f16", False, False, "short")
       for t in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")},
    "q8_0-q8_0-fa-norot": ("q8_0", "q8_0", True, True, "short"),
    "f16-q4_0-fa": ("f16", "q4_0", True, False, "short"),
    "q5_1-bf16": ("q5_1", "bf16", False, False, "short"),
    "f16-f16-fa-long": ("f16", "f16", True, False, "long"),
    "q8_0-q4_1-fa-long": ("q8_0", "q4_1", True, False, "long"),
}
#: the configurations made for each model (default: all)
KV_MODEL_CONFIGS = {
    "Qwen2.5-Coder-0.5B-Instruct": ("f16-f16-fa", "bf16-bf16", "q8_0-q8_0-fa", "q4_0-q4_0-fa",
                                    "iq4_nl-iq4_nl-fa", "q4_1-f16", "f16-f16-fa-long"),
    "gemma-3-270m": ("f16-f16-fa", "bf16-bf16-fa", "q8_0-q8_0-fa", "q5_1-q5_1-fa", "q4_0-f16",
                     "f16-q4_0-fa", "f16-f16-fa-long"),
}
_GGML_TYPE_ID = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                 "iq4_nl": 20, "bf16": 30}
N_LONG, N_GEN_LONG = 270, 8


def greedy_passes(llm, ids: list, n_gen: int):
    """(greedy ids, batched rows, incremental rows) of llama.cpp on `ids`:
    the prompt pass and n_gen greedy single-token calls (the incremental
    rows), then one teacher-forced pass over prompt + continuation."""
    llm.reset()
    llm.eval(ids)
    gen, incr = [], [np.array(llm.scores[:len(ids)], np.float32)]
    for _ in range(n_gen):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(tok)
        llm.eval([tok])
        incr.append(np.array(llm.scores[llm.n_tokens - 1:llm.n_tokens], np.float32))
    incr = np.concatenate(incr)[:len(ids) + n_gen]
    llm.reset()
    llm.eval(ids + gen)
    return gen, np.array(llm.scores[:len(ids) + n_gen], np.float32), incr


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """tests/infer_helpers.py `row_hashes` (one definition for both)."""
    sys.path.insert(0, str(REPO / "tests"))
    from infer_helpers import row_hashes as rh
    return rh(rows)


def long_prompt_ids(tokenize) -> list:
    """The long prompt's ids: the quality prompts joined by newlines,
    tokenized with BOS as the model adds it, cut to N_LONG."""
    sys.path.insert(0, str(REPO))
    from strata_ref.quality.prompts import DEFAULT_PROMPTS
    return list(tokenize("\n".join(DEFAULT_PROMPTS)))[:N_LONG]


def _kv_run(path, cfg) -> dict:
    from llama_cpp import Llama
    tk, tv, fa, norot, prompt = cfg
    env_old = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    if norot:
        os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
    else:
        os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    try:
        llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2,
                    seed=0, logits_all=True, verbose=False, type_k=_GGML_TYPE_ID[tk],
                    type_v=_GGML_TYPE_ID[tv], flash_attn=fa)
    finally:
        if env_old is None:
            os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        else:
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = env_old
    if prompt == "short":
        ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        n_gen = N_GEN
    else:
        ids = long_prompt_ids(lambda text: llm.tokenize(text.encode(), add_bos=True, special=False))
        n_gen = N_GEN_LONG
    gen, batched, incr = greedy_passes(llm, ids, n_gen)
    del llm
    return {"prompt_ids": np.array(ids, np.int32), "greedy_ids": np.array(gen, np.int32),
            "batched": batched, "incr": incr}


def cmd_kvcache(args) -> None:
    sys.path.insert(0, str(REPO))
    from strata_ref.models import resolve
    path = resolve(args.model)
    stem = Path(path).stem
    names = (args.configs.split(",") if args.configs else
             list(KV_MODEL_CONFIGS.get(stem, KV_CONFIGS)))
    unknown = [n for n in names if n not in KV_CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown} (known: {', '.join(KV_CONFIGS)})")
    res = {"configs": np.array(names)}
    for name in names:
        tk, tv, fa, norot, prompt = KV_CONFIGS[name]
        r = _kv_run(path, KV_CONFIGS[name])
        res[f"{name}:type_k"] = np.array(tk)
        res[f"{name}:type_v"] = np.array(tv)
        res[f"{name}:flash_attn"] = np.bool_(fa)
        res[f"{name}:rot_disable"] = np.bool_(norot)
        res[f"{name}:prompt"] = np.array(prompt)
        res[f"{name}:prompt_ids"] = r["prompt_ids"]
        res[f"{name}:greedy_ids"] = r["greedy_ids"]
        for kind in ("batched", "incr"):
            i, v, l = _topk(r[kind], args.topk)
            res[f"{name}:{kind}_ids"] = i
            res[f"{name}:{kind}_logits"] = v
            res[f"{name}:{kind}_lse"] = l
            res[f"{name}:{kind}_hash"] = row_hashes(r[kind])
        print(f"{name}: greedy {r['greedy_ids'].tolist()}")
    out = Path(args.out or _data_dir() / f"llama_kv_{stem}.npz")
    np.savez_compressed(out, n_threads=np.int64(2), n_ctx=np.int64(512), **res, **_provenance())
    print(out)


def ggml_cpu_lib():
    """ctypes handle of the libggml-cpu.so inside the installed llama_cpp."""
    import llama_cpp
    libdir = Path(llama_cpp.__file__).parent / "lib"
    ctypes.CDLL(str(libdir / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(libdir / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    lib.ggml_cpu_init.restype = None
    lib.ggml_cpu_init()

    class Traits(ctypes.Structure):
        _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                    ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]

    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(Traits)
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    return lib


def ggml_from_float(lib, type_id: int, block_bytes: int, qk: int, x: np.ndarray) -> np.ndarray:
    fn_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    tr = lib.ggml_get_type_traits_cpu(type_id).contents
    fn = fn_t(tr.from_float)
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size // qk * block_bytes, np.uint8)
    fn(x.ctypes.data, out.ctypes.data, x.size)
    return out.reshape(-1, block_bytes)


def act_inputs() -> np.ndarray:
    """(8, 512) float32: seeded normals at several scales, plus rows made of
    exact halves of the quantization step (to tell half-even from
    half-away rounding), a zero block and a negative-maximum block."""
    rng = np.random.default_rng(20261130)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[1] *= 1e-3
    x[2] *= 300.0
    x[3] = (rng.integers(-127, 128, 512) + 0.5).astype(np.float32)   # x*127/amax = k + 0.5
    x[3, ::32] = 127.0
    x[4, :32] = 0.0
    x[4, 32:64] = -np.abs(x[4, 32:64])
    x[5] = rng.standard_normal(512).astype(np.float32) * np.float32(65504.0)
    x[6, :256] = 0.0
    x[7] = np.float32(1e-9) * rng.standard_normal(512).astype(np.float32)
    return x


def cmd_actquant(args) -> None:
    lib = ggml_cpu_lib()
    x = act_inputs()
    res = {}
    for name, tid, bb, qk in (("q8_0", 8, 34, 32), ("q8_1", 9, 36, 32), ("q8_k", 15, 292, 256)):
        res[name] = np.stack([ggml_from_float(lib, tid, bb, qk, row) for row in x])
    out = Path(args.out or _data_dir() / "ggml_act_quant.npz")
    np.savez_compressed(out, x=x, **res, **_provenance())
    print(out, {k: v.shape for k, v in res.items()})


def cmd_synthetic(args) -> None:
    import hashlib
    import tempfile
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from infer_helpers import TINY_IDS, tiny_model
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for arch in ("qwen3", "gemma3"):
            path = Path(d) / f"tiny_{arch}.gguf"
            tiny_model(arch, path, seed=0)
            llm = _llama(path)
            llm.reset()
            llm.eval(TINY_IDS)
            res[f"{arch}_logits"] = np.array(llm.scores[:len(TINY_IDS)], np.float32)
            res[f"{arch}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            del llm
    out = Path(args.out or _data_dir() / "llama_ref_tiny.npz")
    np.savez_compressed(out, ids=np.array(TINY_IDS, np.int32), **res, **_provenance())
    print(out, {k: v.shape for k, v in res.items()})


def cmd_typed(args) -> None:
    import hashlib
    import tempfile
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from typed_models import IDS, N_PROMPT, TYPED, typed_model
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for t in TYPED:
            path = Path(d) / f"typed_{t}.gguf"
            typed_model(t, path, seed=0)
            llm = _llama(path)
            llm.reset()
            llm.eval(IDS)
            res[f"{t}_batched"] = np.array(llm.scores[:len(IDS)], np.float32)
            llm.reset()
            llm.eval(IDS[:N_PROMPT])
            for tok in IDS[N_PROMPT:]:
                llm.eval([tok])
            res[f"{t}_incr"] = np.array(llm.scores[:len(IDS)], np.float32)
            res[f"{t}_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            del llm
    out = Path(args.out or _data_dir() / "llama_ref_typed.npz")
    np.savez_compressed(out, ids=np.array(IDS, np.int32), n_prompt=np.int64(N_PROMPT), **res,
                        **_provenance())
    print(out, {k: v.shape for k, v in res.items()})


def _moe_run(path, ids, n_greedy, n_ctx=512, flash_attn=False, cache_type="f16"):
    """llama.cpp's greedy continuation of `ids` and every logit of the
    incremental pass (prompt, then one greedy token per call) and of one
    batched teacher-forced pass over prompt + continuation."""
    from llama_cpp import Llama
    t = _GGML_TYPE_ID[cache_type]
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=2, n_threads_batch=2,
                seed=0, logits_all=True, verbose=False, flash_attn=flash_attn, type_k=t, type_v=t)
    return greedy_passes(llm, ids, n_greedy)


def _moe_fa(path, arch, args, name=None) -> None:
    """`moe --flash-attn` (module docstring): one file per architecture."""
    from infer_helpers import FA_LONG_IDS, FA_LONG_N_GREEDY, MOE_N_GREEDY, TINY_IDS, moe_seed
    ids = list(TINY_IDS)
    ct = args.cache_type
    gen, batched, incr = _moe_run(path, ids, MOE_N_GREEDY, flash_attn=True, cache_type=ct)
    lg, lb, li = _moe_run(path, list(FA_LONG_IDS), FA_LONG_N_GREEDY, flash_attn=True, cache_type=ct)
    tag = "fa" if ct == "f16" else f"fa_{ct}"
    out = Path(args.out or _data_dir() / f"llama_ref_moe_{tag}_{name or arch}.npz")
    extra = {} if args.kv_lora_rank is None else {"kv_lora_rank": np.int64(args.kv_lora_rank)}
    extra.update(_yarn_keys(path) if args.real_yarn else {})
    np.savez_compressed(out, seed=np.int64(moe_seed(arch)), flash_attn=np.bool_(True), **extra,
                        type_k=np.array(ct), type_v=np.array(ct),
                        prompt_ids=np.array(ids, np.int32), greedy_ids=np.array(gen, np.int32),
                        batched=batched, incr=incr, long_prompt_ids=np.array(FA_LONG_IDS, np.int32),
                        long_greedy_ids=np.array(lg, np.int32), long_batched_hash=row_hashes(lb),
                        long_incr_hash=row_hashes(li),
                        sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()), **_provenance())
    print(out, arch, "greedy", gen, "long greedy", lg)


def _yarn_keys(path) -> dict:
    """The YaRN keys of the GGUF at `path`, as stored with its logits
    (`moe --real-yarn`): rope_scaling_factor, rope_orig_ctx,
    yarn_log_multiplier."""
    sys.path.insert(0, str(REPO))
    from strata_ref.gguf import read_file
    md = read_file(path).metadata
    return {"rope_scaling_factor": np.float32(md["deepseek2.rope.scaling.factor"]),
            "rope_orig_ctx": np.int64(md["deepseek2.rope.scaling.original_context_length"]),
            "yarn_log_multiplier": np.float32(md["deepseek2.rope.scaling.yarn_log_multiplier"])}


def cmd_moe(args) -> None:
    import hashlib
    import tempfile
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from infer_helpers import MOE_CTX, MOE_LAYERS, MOE_N_GREEDY, TINY_IDS, moe_seed, tiny_moe_model
    archs = args.arch.split(",") if args.arch else list(MOE_LAYERS)
    with tempfile.TemporaryDirectory() as d:
        for arch in archs:
            path = Path(d) / f"tiny_{arch}.gguf"
            if args.real_yarn:
                if arch != "deepseek2-v3":
                    raise SystemExit("--real-yarn is for --arch deepseek2-v3 only")
                tiny_moe_model(arch, path, seed=moe_seed(arch), real_yarn=True)
                name = f"{arch}-yarn40"
                if args.flash_attn:
                    _moe_fa(path, arch, args, name=name)
                    continue
                gen, batched, incr = _moe_run(path, list(TINY_IDS), MOE_N_GREEDY)
                out = Path(args.out or _data_dir() / f"llama_ref_moe_{name}.npz")
                np.savez_compressed(out, seed=np.int64(moe_seed(arch)), prompt_ids=np.array(TINY_IDS, np.int32),
                                    greedy_ids=np.array(gen, np.int32), batched=batched, incr=incr,
                                    **_yarn_keys(path), sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
                                    **_provenance())
                print(out, arch, "greedy", gen)
                continue
            if args.kv_lora_rank is not None:
                if not args.flash_attn:
                    raise SystemExit("--kv-lora-rank needs --flash-attn")
                tiny_moe_model(arch, path, seed=moe_seed(arch), kv_lora_rank=args.kv_lora_rank)
                _moe_fa(path, arch, args, name=f"{arch}-r{args.kv_lora_rank}")
                continue
            tiny_moe_model(arch, path, seed=moe_seed(arch))
            if args.flash_attn:
                _moe_fa(path, arch, args)
                continue
            ids = list(TINY_IDS)
            gen, batched, incr = _moe_run(path, ids, MOE_N_GREEDY)
            extra = {}
            for n_ctx in MOE_CTX.get(arch, ()):
                g, b, i = _moe_run(path, ids, MOE_N_GREEDY, n_ctx)
                extra.update({f"ctx{n_ctx}_greedy_ids": np.array(g, np.int32), f"ctx{n_ctx}_batched": b,
                              f"ctx{n_ctx}_incr": i})
            out = Path(args.out or _data_dir() / f"llama_ref_moe_{arch}.npz")
            np.savez_compressed(out, seed=np.int64(moe_seed(arch)), prompt_ids=np.array(ids, np.int32),
                                greedy_ids=np.array(gen, np.int32), batched=batched, incr=incr, **extra,
                                sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
                                **_provenance())
            print(out, arch, "greedy", gen)


#: the tiny models `moekv` makes data for, and their configurations
#: (names of `KV_CONFIGS`)
MOEKV_CONFIGS = {arch: tuple(KV_CONFIGS) for arch in ("gemma4", "gemma4-moe")}
#: the configurations whose rows `moekv` stores whole (float32)
MOEKV_FULL = ("f16-f16-fa", "q8_0-q8_0-fa")


def moekv_long_ids() -> list:
    """The tiny models' long prompt: BOS (257), then the bytes of the
    quality prompts joined by newlines (byte b is token b), N_LONG ids."""
    sys.path.insert(0, str(REPO))
    from strata_ref.quality.prompts import DEFAULT_PROMPTS
    return ([257] + list("\n".join(DEFAULT_PROMPTS).encode("utf-8")))[:N_LONG]


def cmd_moekv(args) -> None:
    import tempfile
    from llama_cpp import Llama
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from infer_helpers import MOE_N_GREEDY, TINY_IDS, moe_seed, tiny_moe_model
    archs = args.arch.split(",") if args.arch else list(MOEKV_CONFIGS)
    with tempfile.TemporaryDirectory() as d:
        for arch in archs:
            names = args.configs.split(",") if args.configs else list(MOEKV_CONFIGS[arch])
            unknown = [n for n in names if n not in KV_CONFIGS]
            if unknown:
                raise SystemExit(f"unknown configurations {unknown} (known: {', '.join(KV_CONFIGS)})")
            path = Path(d) / f"tiny_{arch}.gguf"
            tiny_moe_model(arch, path, seed=moe_seed(arch))
            res = {"configs": np.array(names)}
            for name in names:
                tk, tv, fa, norot, prompt = KV_CONFIGS[name]
                old = os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
                if norot:
                    os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
                try:
                    llm = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_threads=2, n_threads_batch=2,
                                seed=0, logits_all=True, verbose=False, type_k=_GGML_TYPE_ID[tk],
                                type_v=_GGML_TYPE_ID[tv], flash_attn=fa)
                finally:
                    os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
                    if old is not None:
                        os.environ["LLAMA_ATTN_ROT_DISABLE"] = old
                ids = list(TINY_IDS) if prompt == "short" else moekv_long_ids()
                gen, batched, incr = greedy_passes(llm, ids, MOE_N_GREEDY if prompt == "short" else N_GEN_LONG)
                del llm
                res.update({f"{name}:type_k": np.array(tk), f"{name}:type_v": np.array(tv),
                            f"{name}:flash_attn": np.bool_(fa), f"{name}:rot_disable": np.bool_(norot),
                            f"{name}:prompt": np.array(prompt), f"{name}:prompt_ids": np.array(ids, np.int32),
                            f"{name}:greedy_ids": np.array(gen, np.int32)})
                for kind, rows in (("batched", batched), ("incr", incr)):
                    if name in MOEKV_FULL:
                        res[f"{name}:{kind}"] = rows
                    else:
                        res[f"{name}:{kind}_hash"] = row_hashes(rows)
                        res[f"{name}:{kind}_argmax"] = np.argmax(rows, axis=1).astype(np.int32)
                print(arch, name, "greedy", gen)
            out = Path(args.out or _data_dir() / f"llama_kv_moe_{arch}.npz")
            np.savez_compressed(out, seed=np.int64(moe_seed(arch)), n_threads=np.int64(2), n_ctx=np.int64(512),
                                sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()), **res,
                                **_provenance())
            print(out)


def cmd_pretok(args) -> None:
    import tempfile
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from infer_helpers import PRETOK_TEXTS, pretok_corpus, pretok_vocab, vocab_dir
    from llama_cpp import Llama
    from strata_ref import gguf
    from strata_ref.gguf import GGUFValueType as V, write_gguf
    texts = PRETOK_TEXTS if args.corpus == "gpt-4o" else pretok_corpus()

    def run(md):
        with tempfile.TemporaryDirectory() as t:
            dst = Path(t) / "pretok.gguf"
            write_gguf(dst, md, [])
            llm = Llama(model_path=str(dst), vocab_only=True, verbose=False)
            ids = [llm.tokenize(c.encode("utf-8"), add_bos=False, special=False) for c in texts]
            del llm
        return dict(lengths=np.array([len(i) for i in ids], np.int32),
                    ids=np.array([v for i in ids for v in i], np.int32))
    extra = {}
    if args.vocab:
        # a real byte-level BPE vocabulary (tokens, types, merges of the
        # sdist's ggml-vocab-<vocab>.gguf) with tokenizer.ggml.pre = PRE
        src = vocab_dir() / f"ggml-vocab-{args.vocab}.gguf"
        m = gguf.read(src).metadata
        md = {"general.architecture": "gpt2", "tokenizer.ggml.model": "gpt2",
              "tokenizer.ggml.pre": args.pre,
              "tokenizer.ggml.tokens": (V.ARRAY, list(m["tokenizer.ggml.tokens"]), V.STRING),
              "tokenizer.ggml.token_type": (V.ARRAY, [int(x) for x in m["tokenizer.ggml.token_type"]],
                                            V.INT32),
              "tokenizer.ggml.merges": (V.ARRAY, list(m["tokenizer.ggml.merges"]), V.STRING)}
        r = run(md)
        extra = dict(vocab=np.array(args.vocab), vocab_lengths=r["lengths"], vocab_ids=r["ids"],
                     vocab_sha256=np.array(hashlib.sha256(src.read_bytes()).hexdigest()))
    r = run(pretok_vocab(texts, args.pre))
    out = Path(args.out or REPO / "tests" / "data" / f"llama_tok_{args.pre}.npz")
    np.savez_compressed(out, pre=np.array(args.pre), texts=np.array(texts), **r, **extra,
                        **_provenance())
    print(out, len(texts), "texts")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="run against the peer built for this CPU profile")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("model")
    p.add_argument("--out")
    p.add_argument("--topk", type=int, default=128)
    p = sub.add_parser("actquant")
    p.add_argument("--out")
    p = sub.add_parser("synthetic")
    p.add_argument("--out")
    p = sub.add_parser("typed")
    p.add_argument("--out")
    p = sub.add_parser("pretok")
    p.add_argument("--pre", default="gpt-4o", help="the pre-tokenizer name to test")
    p.add_argument("--corpus", choices=["gpt-4o", "wide"], default="gpt-4o",
                   help="PRETOK_TEXTS, or pretok_corpus() (needs the sdist's vocab tests)")
    p.add_argument("--vocab", help="also tokenize with this sdist vocabulary's tokens and merges "
                                   "(e.g. deepseek-llm) under --pre")
    p.add_argument("--out")
    p = sub.add_parser("moe")
    p.add_argument("--arch", help="comma-separated architectures (default: every tiny MoE model)")
    p.add_argument("--flash-attn", action="store_true",
                   help="flash attention on: llama_ref_moe_fa_<arch>.npz (with a long run)")
    p.add_argument("--cache-type", default="f16", choices=list(_GGML_TYPE_ID),
                   help="with --flash-attn: K and V cache type (not f16: llama_ref_moe_fa_<type>_<arch>.npz)")
    p.add_argument("--real-yarn", action="store_true",
                   help="deepseek2-v3: DeepSeek V3's own YaRN keys (factor 40, 4096 original positions, "
                        "log multiplier 0.1): llama_ref_moe[_fa]_deepseek2-v3-yarn40.npz")
    p.add_argument("--kv-lora-rank", type=int, default=None,
                   help="with --flash-attn, deepseek2: the compressed KV's rank (file <arch>-r<R>)")
    p.add_argument("--out")
    p = sub.add_parser("moekv")
    p.add_argument("--arch", help="comma-separated tiny models (default: gemma4,gemma4-moe)")
    p.add_argument("--configs", help="comma-separated names of KV_CONFIGS (default: MOEKV_CONFIGS)")
    p.add_argument("--out")
    p = sub.add_parser("kvcache")
    p.add_argument("model")
    p.add_argument("--configs", help="comma-separated names of KV_CONFIGS (default: the model's set)")
    p.add_argument("--out")
    p.add_argument("--topk", type=int, default=32)
    if argv is None:
        from peer_env import ensure_profile
        ensure_profile(__file__)
    args = ap.parse_args(argv)
    {"logits": cmd_logits, "actquant": cmd_actquant, "synthetic": cmd_synthetic,
     "typed": cmd_typed, "moe": cmd_moe, "pretok": cmd_pretok, "kvcache": cmd_kvcache,
     "moekv": cmd_moekv}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

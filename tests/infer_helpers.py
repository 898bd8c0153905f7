"""Shared fixtures of the test_infer_* modules: models from the registry and
the vocab-only GGUF files of llama-cpp-python's source distribution.

Everything is fetched into the user cache (`strata_ref.models.cache_dir()`)
and a test skips cleanly when it cannot be fetched (offline).
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from strata_ref import cpu as _cpu

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
DATA = Path(__file__).parent / "data"
#: the CPU profiles whose llama.cpp reference data lives in DATA/<profile>/:
#: every declared profile of llama-cpp-python 0.3.36's llama.cpp
#: (`strata_ref.cpu.PROFILES`; the v0.4.0 ones: tests/test_cpu_prebuilt.py)
PROFILES = tuple(n for n, p in _cpu.PROFILES.items() if p.version == _cpu.profiles.LLAMA_CPP)


def row_hashes(rows) -> "np.ndarray":
    """uint64 (n,): the blake2b hash (8-byte digest, little-endian) of each
    row's float32 bytes; tools/llama_ref.py stores llama.cpp's this way, so
    a test checks every logit of a row without storing it."""
    import hashlib

    import numpy as np
    rows = np.ascontiguousarray(rows, np.float32)
    return np.array([int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little")
                     for r in rows], np.uint64)


def f32_bits(a):
    """The uint32 bit patterns of `a` as float32 (contiguous): for comparing
    results bit for bit (NaN payloads, -0.0) with np.array_equal."""
    import numpy as np
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def profile_files(name: str) -> list:
    """pytest params (profile, path) of every stored DATA/<profile>/<name>."""
    return [pytest.param(p, DATA / p / name, id=p) for p in PROFILES if (DATA / p / name).is_file()]


#: the arm64 profiles (docs/arm64.md), whose data tools/arm_ref.py made under qemu
ARM_PROFILES = _cpu.profiles.ARM64_PROFILES
#: CPU_REPACK layouts of the ARM builds whose gemv / gemm are not emulated yet
ARM_MISSING_LAYOUTS = ("q1_0_4x4", "q1_0_4x8")


def all_profile_files(name: str) -> list:
    """`profile_files(name)` and then `arm_profile_files(name)`."""
    return profile_files(name) + arm_profile_files(name)


def arm_profile_files(name: str) -> list:
    """pytest params (profile, path) of every stored DATA/<arm profile>/<name>;
    a strict xfail (NotImplementedError) where the file's `repack` key names
    a layout of `ARM_MISSING_LAYOUTS`."""
    import numpy as np
    out = []
    for p in ARM_PROFILES:
        path = DATA / p / name
        if not path.is_file():
            continue
        repack = str(np.load(path)["repack"])
        missing = [lay for lay in ARM_MISSING_LAYOUTS if lay in repack]
        marks = () if not missing else (pytest.mark.xfail(
            strict=True, raises=NotImplementedError,
            reason=f"{p} repacks {', '.join(missing)}: not emulated yet"),)
        out.append(pytest.param(p, path, id=p, marks=marks))
    return out


@functools.lru_cache(maxsize=None)
def model_path(name: str) -> Path:
    """GGUF path of a registry model, fetched when missing; skip if offline."""
    from strata_ref import models
    try:
        return models.resolve(name)
    except Exception as e:  # ModelError, OSError: no network or no pip
        pytest.skip(f"model {name} unavailable: {e}")


def kv_opts(ref, name: str) -> dict:
    """The KV-cache options of configuration `name` of a llama_kv file
    (tools/llama_ref.py `kvcache`, tools/arm_ref.py `kv`), as `new_cache`
    takes them."""
    fa = bool(ref[f"{name}:flash_attn"])
    # llama.cpp's thread count sets flash attention's split only (and
    # new_cache refuses it without flash attention)
    return dict(type_k=str(ref[f"{name}:type_k"]), type_v=str(ref[f"{name}:type_v"]), flash_attn=fa,
                rotate=not bool(ref[f"{name}:rot_disable"]), **({"fa_threads": int(ref["n_threads"])} if fa else {}))


def check_kv_config(m, ref, name: str, label: str = "") -> None:
    """Model m run on configuration `name` of a llama_kv file as llama.cpp
    ran it (a fresh cache per pass: the batched pass over prompt + greedy
    ids, the incremental one, the prompt then one id per call), asserting
    every row's hash (every logit), the stored top logits' bits and the
    greedy ids (the argmax of the incremental rows)."""
    import numpy as np
    opts, n_ctx = kv_opts(ref, name), int(ref["n_ctx"])
    ids = ref[f"{name}:prompt_ids"].tolist()
    gen = ref[f"{name}:greedy_ids"].tolist()
    cache = m.new_cache(n_ctx, **opts)
    ours = {"batched": m.forward(ids + gen, m.new_cache(n_ctx, **opts), all_logits=True),
            "incr": np.concatenate([m.forward(ids, cache, all_logits=True)]
                                   + [m.forward([t], cache)[None] for t in gen])}
    for kind, rows in ours.items():
        bad = np.flatnonzero(row_hashes(rows) != ref[f"{name}:{kind}_hash"])
        got = np.take_along_axis(rows, ref[f"{name}:{kind}_ids"], axis=1)
        want = ref[f"{name}:{kind}_logits"]
        assert bad.size == 0, (f"{label}{name} {kind}: rows {bad[:8].tolist()} of {len(rows)} differ "
                               f"(top logits max |diff| {np.abs(got - want).max():.3g})")
        assert np.array_equal(np.ascontiguousarray(got, np.float32).view(np.uint32),
                              np.ascontiguousarray(want, np.float32).view(np.uint32))
    assert np.argmax(ours["incr"][len(ids) - 1:-1], axis=1).tolist() == gen


@functools.lru_cache(maxsize=4)     # bounded: loaded models are large
def load_model(name: str, profile: str = "avx512"):
    """A registry model loaded to run in CPU profile `profile`."""
    from strata_ref.infer.loader import load
    return load(model_path(name), profile=profile)


def _find_sdist(cache: Path) -> Path | None:
    for p in (cache / "sdist" / SDIST_FILE, cache / "ggml" / "sdist" / SDIST_FILE):
        if p.is_file():
            return p
    return None


@functools.lru_cache(maxsize=None)
def vocab_dir() -> Path:
    """Folder holding ggml-vocab-*.gguf(.inp/.out) from the 0.3.36 sdist."""
    from strata_ref.models import cache_dir
    cache = cache_dir()
    out = cache / "ggml-vocab-0.3.36"
    if (out / "ggml-vocab-qwen2.gguf.out").is_file():
        return out
    sd = _find_sdist(cache)
    if sd is None:
        dest = cache / "sdist"
        dest.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest, prefix=".fetch-") as tmp:   # one per process
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                                ":all:", "-d", tmp, SDIST], capture_output=True, text=True)
            if (Path(tmp) / SDIST_FILE).is_file():
                os.replace(Path(tmp) / SDIST_FILE, dest / SDIST_FILE)
        sd = _find_sdist(cache)
        if r.returncode or sd is None:
            pytest.skip(f"cannot fetch {SDIST} (offline?): {r.stderr.strip()[-200:]}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sd) as tf:
        for m in tf.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-") and m.isfile():
                with tf.extractfile(m) as src:
                    part = out / f"{name}.{os.getpid()}.part"   # one per process: pytest-xdist workers
                    part.write_bytes(src.read())
                    part.replace(out / name)
    return out


# ---------------------------------------------------------------- tiny models
TINY_IDS = [257, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]   # 12 tokens


def tiny_model(arch: str, path, seed: int = 0) -> None:
    """Write a small random GGUF of architecture `arch` (qwen3 or gemma3) to
    `path`: 6 layers, n_embd 64, 4 heads of 16 over 2 KV heads, n_ff 128, a
    259-token byte-level vocabulary, Q8_0 matrices and embedding, F32 norms;
    gemma3 with a sliding window of 4 (layers 0-4 local, 5 global). The same
    (arch, seed) always gives the same bytes, so the llama.cpp logits stored
    by tools/llama_ref.py (`synthetic`) can be checked without the file."""
    import numpy as np
    from strata_ref import GGMLType
    from strata_ref.gguf import GGUFValueType as V
    from strata_ref.quantize import quantize
    from tiny_gguf import N_VOCAB as nv, metadata, norm, write

    rng = np.random.default_rng(seed)
    L, E, H, KV, D, F = 6, 64, 4, 2, 16, 128
    md = metadata(arch, layers=L, embd=E, ff=F, heads=H, kv_heads=KV, head_dim=D)
    if arch == "gemma3":
        md[f"{arch}.attention.sliding_window"] = (V.UINT32, 4)
        md[f"{arch}.rope.freq_base_swa"] = (V.FLOAT32, 1e4)
    elif arch != "qwen3":
        raise ValueError(f"no tiny model for {arch!r}")

    def q8(rows, cols, scale):
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return (GGMLType.Q8_0, (cols, rows), quantize(w, GGMLType.Q8_0).reshape(-1))

    # gemma3 scales the embeddings by sqrt(n_embd) and ties the output to
    # them: small embeddings keep the layers' share of the residual large,
    # a large output norm keeps the logits spread.
    emb_scale, out_gain = (0.1, 30.0) if arch == "gemma3" else (1.0, 1.0)
    ts = [("token_embd.weight",) + q8(nv, E, emb_scale),
          ("output_norm.weight",) + norm(rng, E, out_gain)]
    if arch == "qwen3":
        ts.append(("output.weight",) + q8(nv, E, 0.2))
    for i in range(L):
        p = f"blk.{i}."
        ts += [(p + "attn_norm.weight",) + norm(rng, E), (p + "attn_q.weight",) + q8(H * D, E, 0.2),
               (p + "attn_k.weight",) + q8(KV * D, E, 0.2), (p + "attn_v.weight",) + q8(KV * D, E, 0.2),
               (p + "attn_output.weight",) + q8(E, H * D, 0.2),
               (p + "attn_q_norm.weight",) + norm(rng, D), (p + "attn_k_norm.weight",) + norm(rng, D),
               (p + "ffn_norm.weight",) + norm(rng, E), (p + "ffn_gate.weight",) + q8(F, E, 0.2),
               (p + "ffn_up.weight",) + q8(F, E, 0.2), (p + "ffn_down.weight",) + q8(E, F, 0.2)]
        if arch == "gemma3":
            ts += [(p + "post_attention_norm.weight",) + norm(rng, E),
                   (p + "post_ffw_norm.weight",) + norm(rng, E)]
    write(path, md, ts)


# ------------------------------------------------------ tiny MoE / hybrid models
#: the tiny MoE models' prompt (`TINY_IDS`) and the greedy tokens llama.cpp
#: adds to it in tools/llama_ref.py `moe`
MOE_N_GREEDY = 20
#: the long run of the flash-attention MoE data (`tools/llama_ref.py moe
#: --flash-attn`): 270 prompt ids (TINY_IDS repeated), then FA_LONG_N_GREEDY
#: greedy tokens: the batched pass takes flash attention's tiled path (64+
#: query tokens), the decode steps past 256 cells its split-KV path
FA_LONG_IDS = tuple((TINY_IDS * 23)[:270])
FA_LONG_N_GREEDY = 8
#: architecture -> per-layer tensor types of `tiny_moe_model`: (attention or
#: linear-attention matrices, expert gate / up, expert down) for each layer
MOE_LAYERS = {
    # Q4_K gate/up (repacked q4_K_8x8 on AVX2 builds: the gemv per routed row),
    # Q6_K down (the tiled kernel for experts with 8+ rows, else vec_dot),
    # Q8_0 / Q4_0 (repacked), IQ3_S (tiled from 8 rows) / Q4_K (repacked),
    # Q2_K (repacked on AVX-512) / Q3_K
    "qwen3moe": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "IQ3_S", "Q4_K"),
                 ("Q5_0", "Q2_K", "Q3_K")],
    # layers 0-2 Gated DeltaNet, 3 gated full attention; expert FFN 128 wide
    # (down rows of 128 values: 32-value block types)
    "qwen3next": [("Q8_0", "Q4_K", "Q8_0"), ("Q4_K", "Q6_K", "Q4_0"), ("Q6_K", "Q8_0", "Q5_0"),
                  ("Q5_K", "Q5_K", "Q4_1")],
    # qwen3next's layout, two value heads per key head broadcast the other
    # way; IQ4_NL experts (repacked iq4_nl_8x8 on AVX2 builds; a mul_mat of
    # them would take tinyBLAS, MUL_MAT_ID takes vec_dot / the gemv)
    "qwen35moe": [("Q6_K", "Q8_0", "Q4_0"), ("Q8_0", "Q4_K", "IQ4_NL"), ("Q4_K", "Q5_K", "Q8_0"),
                  ("Q8_0", "Q6_K", "IQ4_NL")],
    # qwen35moe's layers with a dense SwiGLU FFN of 512 (gate / up, down)
    # in place of the experts
    "qwen35": [("Q8_0", "Q4_K", "Q6_K"), ("Q6_K", "Q8_0", "Q4_0"), ("Q4_K", "Q5_K", "Q8_0"),
               ("Q8_0", "Q6_K", "IQ4_NL")],
    # layer 0 dense (gate / up, down: the FFN types), layers 1-3 experts,
    # then one MTP layer (llama.cpp loads and skips it; Q8_0)
    "glm4moe": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                ("Q5_0", "Q6_K", "Q5_1")],
    # MLA attention (attn_q_b in Q8_0 where the layer's type has 256-value
    # blocks: its rows are q_lora_rank 128 long; attn_k_b / attn_v_b F16 as
    # the converter writes them, which llama-quantize keeps); layer 0 dense
    # (gate / up, down: the FFN types), layers 1-3 experts
    "deepseek2": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                  ("Q5_0", "Q6_K", "Q5_1")],
    # DeepSeek-V2-Lite's layout (llama.cpp's lite variants have 26 or 27
    # layers): q by attn_q (no LoRA), softmax routing without exp_probs_b,
    # unnormalized weights; 27 layers, layer 0 dense, the types in turn
    "deepseek2-lite": [("Q8_0", "Q4_K", "Q6_K")] + [("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                                                  ("Q5_0", "Q6_K", "Q5_1"), ("Q8_0", "Q4_K", "Q4_1")] * 6
    + [("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0")],
    # deepseek2's layout with DeepSeek V3's group-limited routing (16
    # experts in 4 groups of 4, 2 groups used, 4 experts used) and YaRN RoPE
    # (factor 4 over 16 original positions, yarn_log_multiplier 0.1)
    "deepseek2-v3": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                     ("Q5_0", "Q6_K", "Q5_1")],
    # deepseek2's layout as older converters wrote it: one attn_kv_b per
    # layer (in Q8_0 / Q5_0 like attn_q_b: its rows are kv_lora_rank 128
    # long) in place of attn_k_b / attn_v_b, no MLA head lengths
    "deepseek2-kvb": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                      ("Q5_0", "Q6_K", "Q5_1")],
    # dense: attention (fused attn_qkv in layers 0-2, separate q / k / v in
    # layer 3), fused ffn_up (gate | up), ffn_down
    "phi3": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q5_0"), ("Q6_K", "Q5_K", "Q8_0"),
             ("Q5_0", "Q6_K", "Q4_0")],
    # gemma4 as the E2B / E4B files have it (`tiny_gemma4`): 6 layers,
    # 0-2 and 4 sliding-window, 3 and 5 full; layers 4-5 share the KV of
    # layers 2-3; per-layer embeddings; dense GeGLU FFN (double width in
    # the shared layers). Types: attention, FFN gate / up, FFN down
    "gemma4": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
               ("Q5_0", "Q6_K", "Q5_1"), ("Q8_0", "Q4_0", "Q4_K"), ("Q4_K", "Q8_0", "Q6_K")],
    # gemma4's MoE layout (26B-A4B, `tiny_gemma4`): 4 layers, 0-2
    # sliding-window, 3 full without attn_v (V is the K product); every
    # layer the dense GeGLU FFN plus 8 GeGLU experts with 2 used (fused
    # gate_up in layers 0-1, separate gate / up in 2-3). Types: attention
    # and dense FFN, expert gate / up, expert down
    "gemma4-moe": [("Q8_0", "Q4_K", "Q6_K"), ("Q4_K", "Q8_0", "Q4_0"), ("Q6_K", "Q5_K", "Q8_0"),
                   ("Q5_0", "Q6_K", "Q5_1")],
    # even layers sliding-window (8), odd ones full; YaRN RoPE; MXFP4
    # experts as gpt-oss ships them (repacked mxfp4_8x8 on AVX2 builds),
    # F16 attention in the last layer
    "gpt-oss": [("Q8_0", "MXFP4", "MXFP4"), ("Q4_K", "MXFP4", "MXFP4"), ("Q6_K", "MXFP4", "Q8_0"),
                ("F16", "MXFP4", "MXFP4")],
}
#: the router's type per architecture: F32, as llama.cpp's quantizer leaves
#: routers (and qwen3next's shared-expert gate)
MOE_ROUTER = {"qwen3moe": "F32", "qwen3next": "F32", "qwen35moe": "F32", "gpt-oss": "F32", "glm4moe": "F32",
              "deepseek2": "F32", "deepseek2-lite": "F32", "deepseek2-v3": "F32", "deepseek2-kvb": "F32",
              "gemma4-moe": "F32"}
#: a tiny model's architecture where its name (a key of `MOE_LAYERS`) is a
#: variant of one
MOE_ARCH = {"deepseek2-lite": "deepseek2", "deepseek2-v3": "deepseek2", "deepseek2-kvb": "deepseek2",
            "gemma4-moe": "gemma4"}
#: the dense FFN width of the tiny models without experts
DENSE_FF = 512
#: the seed of each tiny model whose seed was chosen (default 0): the one of
#: a seed search whose greedy steps are no near-ties in llama.cpp: each
#: step's gap between the two largest logits is more than twice the largest
#: difference between the profiles' logits (tests/test_infer_moe.py
#: `test_greedy_steps_are_no_near_ties`). The older models keep seed 0.
MOE_SEEDS = {"qwen35": 13, "phi3": 1, "glm4moe": 23, "deepseek2": 4, "deepseek2-lite": 5, "gemma4": 19,
             "gemma4-moe": 0, "deepseek2-v3": 0, "deepseek2-kvb": 0}


#: the profiles whose llama.cpp data a tiny model does not have yet, with
#: the reason in a comment (a file that appears while its entry is still
#: here fails the tests). (The avx512 files of gemma4 were made on another
#: machine than the rest, as this one had no AVX-512; so were
#: deepseek2-v3's and deepseek2-kvb's: `python tools/llama_ref.py --profile
#: avx512 moe --arch deepseek2-v3` (then `deepseek2-kvb`) on the GPU
#: machine's Sapphire Rapids CPU.)
MOE_PENDING: dict = {}


#: the other contexts llama.cpp's logits are stored for (besides 512):
#: phi3 takes LongRoPE's short factors at n_ctx 256 (not above
#: `original_context_length` 256), the long ones at 512
MOE_CTX = {"phi3": (256,)}


def moe_seed(arch: str) -> int:
    """The seed of `arch`'s tiny model (`MOE_SEEDS`, else 0)."""
    return MOE_SEEDS.get(arch, 0)


def tiny_moe_model(arch: str, path, seed: int = 0, kv_lora_rank: int = 128, real_yarn: bool = False) -> None:
    """Write a small seeded random GGUF of architecture `arch` (a key of
    `MOE_LAYERS`) to `path`: n_embd 256, 4 heads of 64 over 2 KV heads, the
    259-token byte-level vocabulary of `tiny_model`, weights of std 0.02
    like a trained model's, norms about 1, one layer per entry of
    `MOE_LAYERS[arch]` with its tensor types (2-D and 3-D quantized tensors
    in several types).

    qwen3moe: 8 experts with 2 used, expert FFN 256. gpt-oss: the same
    sizes, q / k / v / output biases, attention sinks, sliding window 8 on
    even layers, YaRN RoPE (factor 32 over 4096 positions), router and
    expert biases. qwen3next: layers
    0-2 Gated DeltaNet (2 key heads, 4 value heads of 64, convolution 4),
    layer 3 gated attention with RoPE over 32 of the 64 values, 20 experts
    with 4 used (more than 16: ggml's argsort partitions before its
    insertion sort), expert FFN 128, a shared expert of 256. qwen35moe: the
    same, with separate beta / alpha matrices and interleaved M-RoPE
    sections (8, 2, 2, 0), some pairs of which keep angle 0 for text.
    qwen35: qwen35moe's layers with a dense SwiGLU FFN of `DENSE_FF` (no
    router, no experts). phi3: dense, 4 layers, fused `attn_qkv` in layers
    0-2 (separate q / k / v in layer 3), fused gate | up `ffn_up` of
    2 `DENSE_FF` rows, LongRoPE factors and attn_factor, a sliding window
    of 8 (switched off by llama.cpp).
    deepseek2: DeepSeek V3's layout (MLA): q LoRA of rank 128, compressed
    KV of rank 128 plus 32 rotated values (one cached head of 160), heads
    of 64 unrotated + 32 rotated query / key values and 64 value values,
    `attn_k_b` / `attn_v_b` per head in F16; layer 0 dense (`DENSE_FF`),
    then 16 experts with 4 used (sigmoid, `exp_probs_b`, normalized
    weights times 2.5) and one shared expert of 128. deepseek2-lite (a file
    of architecture deepseek2, `MOE_ARCH`): DeepSeek-V2-Lite's layout, 27
    layers (llama.cpp's lite rule: q by `attn_q`, no q LoRA), 8 experts
    with 2 used, softmax routing without `exp_probs_b`, unnormalized
    weights, two shared experts. deepseek2-v3 (architecture deepseek2):
    deepseek2's layout with DeepSeek V3's group-limited routing (the 16
    experts in 4 groups, 2 groups used) and YaRN RoPE (factor 4, 16
    original positions, `yarn_log_multiplier` 0.1). kv_lora_rank (the
    deepseek2 files but deepseek2-kvb; default 128): the compressed KV's
    rank, so the cached head is kv_lora_rank + 32 (128: 160; 160: 192, a
    multiple of 64 like DeepSeek V3's 576, tests/test_mla_head64.py).
    real_yarn (deepseek2-v3 only): DeepSeek V3 / R1's own YaRN keys in
    place of the scaled-down ones: factor 40 over 4096 original positions,
    `yarn_log_multiplier` 0.1 (tests/test_deepseek2_yarn.py); the rest of
    the file is the same.
    deepseek2-kvb
    (architecture deepseek2): deepseek2's layout as older converters wrote
    it: one `attn_kv_b` per layer in place of `attn_k_b` / `attn_v_b`, no
    `key_length_mla` / `value_length_mla`, `key_length` 96 and
    `value_length` 64 (the per-head sizes), 4 KV heads.

    Layer 1's router has equal rows (experts 2 and 5; qwen3next also 11 and
    17): their probabilities tie on every token, so the selection exercises
    ggml's tie order. The same (arch, seed) always gives the same bytes
    (the sha256 is stored with the llama.cpp logits)."""
    import math

    import numpy as np
    from strata_ref import GGMLType
    from strata_ref.gguf import GGUFValueType as V
    from strata_ref.quantize import quantize
    from tiny_gguf import N_VOCAB as nv, metadata, norm, write

    if arch not in MOE_LAYERS:
        raise ValueError(f"no tiny MoE model for {arch!r}")
    if MOE_ARCH.get(arch, arch) == "gemma4":
        return tiny_gemma4(arch, path, seed)
    rng = np.random.default_rng(seed)
    layers = MOE_LAYERS[arch]
    lite = arch == "deepseek2-lite"
    v3 = arch == "deepseek2-v3"
    kvb = arch == "deepseek2-kvb"
    arch = MOE_ARCH.get(arch, arch)
    nxt = arch in ("qwen3next", "qwen35moe", "qwen35")
    q35 = arch in ("qwen35moe", "qwen35")
    gpt = arch == "gpt-oss"
    glm = arch == "glm4moe"
    dense = arch in ("qwen35", "phi3")
    phi3 = arch == "phi3"
    ds2 = arch == "deepseek2"
    L, E, H, KV, D = len(layers), 256, 4, 2, 64
    NX, NU, F = (20, 4, 128) if nxt else (8, 2, 128) if lite else (16, 4, 128) if glm or ds2 else (8, 2, 256)
    QR, KR, DN, DR, DV = 128, int(kv_lora_rank), 64, 32, 64    # deepseek2's q / kv LoRA ranks, head parts
    if KR != 128 and (MOE_ARCH.get(arch, arch) != "deepseek2" or arch == "deepseek2-kvb"):
        raise ValueError(f"kv_lora_rank {KR} is for the absorbed deepseek2 files only, not {arch!r}")
    if real_yarn and not v3:
        raise ValueError(f"real_yarn is for deepseek2-v3 only, not {arch!r}")
    experts = {} if dense else {f"{arch}.expert_feed_forward_length": (V.UINT32, F),
                                f"{arch}.expert_count": (V.UINT32, NX),
                                f"{arch}.expert_used_count": (V.UINT32, NU)}
    md = metadata(arch, layers=L, embd=E, ff=DENSE_FF if dense else 4 * F, heads=H, kv_heads=KV,
                  head_dim=D, ctx=4096, after_ff=experts)
    S, NK, NV, DC = 64, 2, 4, 4                  # qwen3next's Gated DeltaNet sizes
    if gpt:
        md.update({f"{arch}.context_length": (V.UINT32, 131072),
                   f"{arch}.rope.freq_base": (V.FLOAT32, 150000.0),
                   f"{arch}.rope.scaling.type": "yarn", f"{arch}.rope.scaling.factor": (V.FLOAT32, 32.0),
                   f"{arch}.rope.scaling.original_context_length": (V.UINT32, 4096),
                   f"{arch}.attention.sliding_window": (V.UINT32, 8),
                   f"{arch}.attention.layer_norm_rms_epsilon": (V.FLOAT32, 1e-5)})
    if nxt:
        md.update({f"{arch}.rope.dimension_count": (V.UINT32, 32),
                   **({} if dense else {f"{arch}.expert_shared_feed_forward_length": (V.UINT32, 256)}),
                   f"{arch}.ssm.conv_kernel": (V.UINT32, DC), f"{arch}.ssm.state_size": (V.UINT32, S),
                   f"{arch}.ssm.group_count": (V.UINT32, NK), f"{arch}.ssm.time_step_rank": (V.UINT32, NV),
                   f"{arch}.ssm.inner_size": (V.UINT32, S * NV),
                   f"{arch}.full_attention_interval": (V.UINT32, 4)})
        if q35:
            md[f"{arch}.rope.dimension_sections"] = (V.ARRAY, [8, 2, 2, 0], V.INT32)
    if glm:
        # GLM-4.5's layout: one MTP layer after the 4 (block_count 5), layer
        # 0 dense, sigmoid routing with normalized weights times 2.5, one
        # shared expert, partial RoPE over 32 of the 64 values
        md.update({f"{arch}.block_count": (V.UINT32, L + 1), f"{arch}.feed_forward_length": (V.UINT32, DENSE_FF),
                   f"{arch}.nextn_predict_layers": (V.UINT32, 1),
                   f"{arch}.leading_dense_block_count": (V.UINT32, 1),
                   f"{arch}.expert_shared_count": (V.UINT32, 1),
                   f"{arch}.expert_weights_norm": True,
                   f"{arch}.expert_weights_scale": (V.FLOAT32, 2.5),
                   f"{arch}.expert_gating_func": (V.UINT32, 2),
                   f"{arch}.rope.dimension_count": (V.UINT32, 32)})
    if ds2:
        # DeepSeek V3's layout as the converter writes it: MQA of one KV
        # head of kv_lora_rank + rope values, the MLA head sizes, q LoRA,
        # layer 0 dense, sigmoid routing with exp_probs_b, normalized
        # weights times 2.5, one shared expert, RoPE base 10000, no scaling
        md = metadata(arch, layers=L, embd=E, ff=DENSE_FF, heads=H, kv_heads=H if kvb else 1, ctx=4096,
                      rope_base=10000.0, after_ff={})
        md.update({f"{arch}.attention.key_length": (V.UINT32, DN + DR if kvb else KR + DR),
                   f"{arch}.attention.value_length": (V.UINT32, DV if kvb else KR),
                   f"{arch}.leading_dense_block_count": (V.UINT32, 1),
                   f"{arch}.vocab_size": (V.UINT32, nv),
                   **({} if lite else {f"{arch}.attention.q_lora_rank": (V.UINT32, QR)}),
                   f"{arch}.attention.kv_lora_rank": (V.UINT32, KR),
                   **({} if kvb else {f"{arch}.attention.key_length_mla": (V.UINT32, DN + DR),
                                      f"{arch}.attention.value_length_mla": (V.UINT32, DV)}),
                   f"{arch}.expert_feed_forward_length": (V.UINT32, F),
                   f"{arch}.expert_count": (V.UINT32, NX), f"{arch}.expert_used_count": (V.UINT32, NU),
                   f"{arch}.expert_shared_count": (V.UINT32, 2 if lite else 1),
                   f"{arch}.expert_weights_scale": (V.FLOAT32, 1.0 if lite else 2.5),
                   **({} if lite else {f"{arch}.expert_weights_norm": True,
                                       f"{arch}.expert_gating_func": (V.UINT32, 2)}),
                   f"{arch}.rope.dimension_count": (V.UINT32, DR)})
        if v3:
            # DeepSeek V3's routing and RoPE keys as the converter writes them,
            # scaled down: 4 groups of 4 experts, 2 used; YaRN factor 4 over
            # 16 original positions (the prompt runs past them), context 512
            # (the n_ctx of the tests: strata-ref refuses more than the file's),
            # yarn_log_multiplier 0.1 (mscale_all_dim 1 times 0.1)
            md.update({f"{arch}.context_length": (V.UINT32, 512),
                       f"{arch}.expert_group_count": (V.UINT32, 4),
                       f"{arch}.expert_group_used_count": (V.UINT32, 2),
                       f"{arch}.rope.scaling.type": "yarn",
                       f"{arch}.rope.scaling.factor": (V.FLOAT32, 40.0 if real_yarn else 4.0),
                       f"{arch}.rope.scaling.original_context_length": (V.UINT32, 4096 if real_yarn else 16),
                       f"{arch}.rope.scaling.yarn_log_multiplier": (V.FLOAT32, 0.1)})
    if phi3:
        # LongRoPE as Phi-3-128k's converter writes it: the factors as
        # tensors, attn_factor sqrt(1 + ln(s) / ln(n_orig)) for the scale
        # s = 4096 / 256 (llama.cpp's n_ctx 512 > 256 takes the long
        # factors), and a sliding window llama.cpp switches off
        md.update({f"{arch}.rope.scaling.attn_factor": (V.FLOAT32, math.sqrt(1 + math.log(16) / math.log(256))),
                   f"{arch}.rope.scaling.original_context_length": (V.UINT32, 256),
                   f"{arch}.attention.sliding_window": (V.UINT32, 8)})

    def q(t, *shape, scale=0.02):
        # shape in NumPy order (experts, rows, cols); ggml's is reversed
        w = (rng.standard_normal(shape) * scale).astype(np.float32)
        return raw(t, w)

    def raw(t, w):
        t = GGMLType[t]
        data = w.reshape(-1) if t == GGMLType.F32 else quantize(w.reshape(-1, w.shape[-1]), t).reshape(-1)
        return (t, tuple(reversed(w.shape)), data)

    def f32(w):
        return (GGMLType.F32, tuple(reversed(w.shape)), np.ascontiguousarray(w, np.float32).reshape(-1))

    ts = [("token_embd.weight",) + q("Q8_0", nv, E), ("output_norm.weight",) + norm(rng, E),
          ("output.weight",) + q("Q6_K", nv, E)]
    if phi3:
        ts += [("rope_factors_long.weight",) + f32(rng.uniform(1.0, 24.0, D // 2)),
               ("rope_factors_short.weight",) + f32(rng.uniform(1.0, 2.0, D // 2))]
    router = MOE_ROUTER.get(arch, "F32")
    for i, (ta, tgu, td) in enumerate(layers):
        p = f"blk.{i}."
        ts.append((p + "attn_norm.weight",) + norm(rng, E))
        if nxt and i % 4 != 3:
            kd, vd = S * NK, S * NV
            ts += [(p + "attn_qkv.weight",) + q(ta, 2 * kd + vd, E),
                   (p + "attn_gate.weight",) + q(ta, vd, E),
                   *([(p + "ssm_beta.weight",) + q("Q8_0", NV, E, scale=0.05),
                      (p + "ssm_alpha.weight",) + q("Q8_0", NV, E, scale=0.05)] if q35 else
                     [(p + "ssm_ba.weight",) + q("Q8_0", 2 * NV, E, scale=0.05)]),
                   (p + "ssm_conv1d.weight",) + f32(rng.standard_normal((2 * kd + vd, DC)) * 0.3),
                   (p + "ssm_dt.bias",) + f32(rng.uniform(-4.0, -1.0, NV)),
                   (p + "ssm_a",) + f32(-rng.uniform(1.0, 16.0, NV)),
                   (p + "ssm_norm.weight",) + norm(rng, S),
                   (p + "ssm_out.weight",) + q(ta, E, vd)]
        elif ds2:
            tqb = ta if GGMLType[ta] in (GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_0) else "Q8_0"
            ts += ([(p + "attn_q.weight",) + q(ta, H * (DN + DR), E)] if lite else
                   [(p + "attn_q_a.weight",) + q(ta, QR, E), (p + "attn_q_a_norm.weight",) + norm(rng, QR),
                    (p + "attn_q_b.weight",) + q(tqb, H * (DN + DR), QR)])
            ts += [(p + "attn_kv_a_mqa.weight",) + q(ta, KR + DR, E),
                   (p + "attn_kv_a_norm.weight",) + norm(rng, KR)]
            ts += ([(p + "attn_kv_b.weight",) + q(tqb, H * (DN + DV), KR, scale=0.1)] if kvb else
                   [(p + "attn_k_b.weight",) + q("F16", H, KR, DN, scale=0.1),
                    (p + "attn_v_b.weight",) + q("F16", H, DV, KR, scale=0.1)])
            ts += [(p + "attn_output.weight",) + q(ta, E, H * DV), (p + "ffn_norm.weight",) + norm(rng, E)]
            if i == 0:
                ts += [(p + "ffn_gate.weight",) + q(tgu, DENSE_FF, E), (p + "ffn_up.weight",) + q(tgu, DENSE_FF, E),
                       (p + "ffn_down.weight",) + q(td, E, DENSE_FF)]
                continue
        elif phi3 and i < 3:
            ts += [(p + "attn_qkv.weight",) + q(ta, (H + 2 * KV) * D, E),
                   (p + "attn_output.weight",) + q(ta, E, H * D)]
        elif phi3:
            ts += [(p + "attn_q.weight",) + q(ta, H * D, E), (p + "attn_k.weight",) + q(ta, KV * D, E),
                   (p + "attn_v.weight",) + q(ta, KV * D, E), (p + "attn_output.weight",) + q(ta, E, H * D)]
        else:
            qrows = 2 * H * D if nxt else H * D
            ts += [(p + "attn_q.weight",) + q(ta, qrows, E),
                   (p + "attn_k.weight",) + q(ta, KV * D, E), (p + "attn_v.weight",) + q(ta, KV * D, E),
                   (p + "attn_output.weight",) + q(ta, E, H * D)]
            if glm:
                ts += [(p + "attn_q.bias",) + f32(rng.standard_normal(H * D) * 0.1),
                       (p + "attn_k.bias",) + f32(rng.standard_normal(KV * D) * 0.1),
                       (p + "attn_v.bias",) + f32(rng.standard_normal(KV * D) * 0.1)]
            elif gpt:
                ts += [(p + "attn_q.bias",) + f32(rng.standard_normal(H * D) * 0.02),
                       (p + "attn_k.bias",) + f32(rng.standard_normal(KV * D) * 0.02),
                       (p + "attn_v.bias",) + f32(rng.standard_normal(KV * D) * 0.02),
                       (p + "attn_output.bias",) + f32(rng.standard_normal(E) * 0.02),
                       (p + "attn_sinks.weight",) + f32(rng.standard_normal(H) + 0.5)]
            else:
                ts += [(p + "attn_q_norm.weight",) + norm(rng, D), (p + "attn_k_norm.weight",) + norm(rng, D)]
        if glm and i == 0:
            ts += [(p + "post_attention_norm.weight",) + norm(rng, E),
                   (p + "ffn_gate.weight",) + q(tgu, DENSE_FF, E), (p + "ffn_up.weight",) + q(tgu, DENSE_FF, E),
                   (p + "ffn_down.weight",) + q(td, E, DENSE_FF)]
            continue
        if phi3:
            ts += [(p + "ffn_norm.weight",) + norm(rng, E), (p + "ffn_up.weight",) + q(tgu, 2 * DENSE_FF, E),
                   (p + "ffn_down.weight",) + q(td, E, DENSE_FF)]
            continue
        if dense:
            ts += [(p + "post_attention_norm.weight",) + norm(rng, E),
                   (p + "ffn_gate.weight",) + q(tgu, DENSE_FF, E), (p + "ffn_up.weight",) + q(tgu, DENSE_FF, E),
                   (p + "ffn_down.weight",) + q(td, E, DENSE_FF)]
            continue
        r = (rng.standard_normal((NX, E)) * 0.02).astype(np.float32)
        if i == 1:
            r[5] = r[2]
            if nxt:
                r[17] = r[11]
        if ds2:
            b = (rng.standard_normal(NX) * 0.01).astype(np.float32)
            if i == 1:
                b[5] = b[2]
            FS = 2 * F if lite else F
            ts += [(p + "ffn_gate_inp.weight",) + raw(router, r)] + ([] if lite else [(p + "exp_probs_b.bias",) + f32(b)])
            ts += [(p + "ffn_gate_exps.weight",) + q(tgu, NX, F, E), (p + "ffn_up_exps.weight",) + q(tgu, NX, F, E),
                   (p + "ffn_down_exps.weight",) + q(td, NX, E, F),
                   (p + "ffn_gate_shexp.weight",) + q(tgu, FS, E), (p + "ffn_up_shexp.weight",) + q(tgu, FS, E),
                   (p + "ffn_down_shexp.weight",) + q(td, E, FS)]
            continue
        if glm:
            b = (rng.standard_normal(NX) * 0.01).astype(np.float32)
            if i == 1:
                b[5] = b[2]
            ts.append((p + "exp_probs_b.bias",) + f32(b))
            ts += [(p + "ffn_gate_shexp.weight",) + q(tgu, F, E), (p + "ffn_up_shexp.weight",) + q(tgu, F, E),
                   (p + "ffn_down_shexp.weight",) + q(td, E, F)]
        ts += [(p + ("ffn_norm.weight" if arch == "qwen3moe" else "post_attention_norm.weight"),) + norm(rng, E),
               (p + "ffn_gate_inp.weight",) + raw(router, r),
               (p + "ffn_gate_exps.weight",) + q(tgu, NX, F, E),
               (p + "ffn_up_exps.weight",) + q(tgu, NX, F, E),
               (p + "ffn_down_exps.weight",) + q(td, NX, E, F)]
        if gpt:
            ts += [(p + "ffn_gate_inp.bias",) + f32(rng.standard_normal(NX) * 0.02),
                   (p + "ffn_gate_exps.bias",) + f32(rng.standard_normal((NX, F)) * 0.02),
                   (p + "ffn_up_exps.bias",) + f32(rng.standard_normal((NX, F)) * 0.02),
                   (p + "ffn_down_exps.bias",) + f32(rng.standard_normal((NX, E)) * 0.02)]
        if nxt:
            ts += [(p + "ffn_gate_shexp.weight",) + q(ta, 256, E), (p + "ffn_up_shexp.weight",) + q(ta, 256, E),
                   (p + "ffn_down_shexp.weight",) + q(ta, E, 256),
                   (p + "ffn_gate_inp_shexp.weight",) + raw(router, (rng.standard_normal(E) * 0.02)
                                                            .astype(np.float32))]
    if glm:
        # the MTP layer (blk.4) as GLM-4.5's converter writes it: a full
        # attention + MoE block and the NextN tensors, all Q8_0 / F32
        p = f"blk.{L}."
        ts += [(p + "attn_norm.weight",) + norm(rng, E), (p + "attn_q.weight",) + q("Q8_0", H * D, E),
               (p + "attn_k.weight",) + q("Q8_0", KV * D, E), (p + "attn_v.weight",) + q("Q8_0", KV * D, E),
               (p + "attn_q.bias",) + f32(np.zeros(H * D)), (p + "attn_k.bias",) + f32(np.zeros(KV * D)),
               (p + "attn_v.bias",) + f32(np.zeros(KV * D)),
               (p + "attn_output.weight",) + q("Q8_0", E, H * D),
               (p + "post_attention_norm.weight",) + norm(rng, E),
               (p + "ffn_gate_inp.weight",) + f32(rng.standard_normal((NX, E)) * 0.02),
               (p + "exp_probs_b.bias",) + f32(np.zeros(NX)),
               (p + "ffn_gate_exps.weight",) + q("Q8_0", NX, F, E), (p + "ffn_up_exps.weight",) + q("Q8_0", NX, F, E),
               (p + "ffn_down_exps.weight",) + q("Q8_0", NX, E, F),
               (p + "ffn_gate_shexp.weight",) + q("Q8_0", F, E), (p + "ffn_up_shexp.weight",) + q("Q8_0", F, E),
               (p + "ffn_down_shexp.weight",) + q("Q8_0", E, F),
               (p + "nextn.eh_proj.weight",) + q("Q8_0", E, 2 * E), (p + "nextn.enorm.weight",) + norm(rng, E),
               (p + "nextn.hnorm.weight",) + norm(rng, E), (p + "nextn.shared_head_norm.weight",) + norm(rng, E)]
    write(path, md, ts)


def tiny_gemma4(name: str, path, seed: int = 0) -> None:
    """Write the tiny gemma4 model `name` ("gemma4" or "gemma4-moe", keys
    of `MOE_LAYERS`) to `path`, with the tensors and keys the converter
    (`conversion/gemma.py` `Gemma4Model`) writes for the Gemma 4 files:
    n_embd 256, 4 query heads; sliding-window layers with heads of 64 over
    2 KV heads, RoPE over all 64 values (base 10000) and a window of 8;
    full layers with heads of 128 over 1 KV head (`head_count_kv` an
    array), the "proportional" RoPE of base 1e6 (`rope_freqs`: factor 1
    for the first 16 pairs, 1e30 for the other 48), the sliding-window
    pattern as an array of BOOL, final soft-capping 30, a
    `layer_output_scale` per layer, the output tied to the embeddings,
    Gemma 4's tokenizer type (`tokenizer.ggml.model` gemma4) over 259 ids:
    the 256 byte tokens, the space, BOS, EOS.

    gemma4 (E2B's layout): 6 layers (full: 3 and 5), the last 2 sharing
    the KV cells of layers 2 and 3 (their unused attn_k / attn_v /
    attn_k_norm written, as the converter does), a dense FFN of
    `DENSE_FF` (twice that in the shared layers: `feed_forward_length` an
    array), per-layer embeddings of 32 per layer (`per_layer_token_embd`
    Q8_0, `per_layer_model_proj` F16). gemma4-moe (26B-A4B's layout): 4
    layers (full: 3, without attn_v), each with the dense FFN and 8 experts
    of 256 with 2 used, the router's input scale `ffn_gate_inp.scale` and
    the per-expert down scale `ffn_down_exps.scale`; layer 1's router has
    equal rows (experts 2 and 5) for ggml's tie order."""
    import numpy as np
    from strata_ref import GGMLType
    from strata_ref.gguf import GGUFValueType as V
    from strata_ref.quantize import quantize
    from tiny_gguf import N_VOCAB as nv, metadata, norm, write

    arch = "gemma4"
    moe = name == "gemma4-moe"
    layers = MOE_LAYERS[name]
    rng = np.random.default_rng(seed)
    L, E, H, P = len(layers), 256, 4, 32
    DS, KS, DF, KF = 64, 2, 128, 1              # head size and KV heads: sliding-window, full
    NX, NU, F = 8, 2, 256                       # experts
    # gemma4 attends with scale 1 to RMS-normed q and k: q / k norm weights
    # of 0.3 keep the scores' spread about 1 (1 would make them about
    # sqrt(head size), the softmax one-hot and the model chaotic)
    QK_GAIN = 0.3
    swa = [True, True, True, False, True, False] if not moe else [True, True, True, False]
    shared = 0 if moe else 2
    n_ff = [DENSE_FF if moe or il < L - shared else 2 * DENSE_FF for il in range(L)]
    experts = ({f"{arch}.expert_feed_forward_length": (V.UINT32, F), f"{arch}.expert_count": (V.UINT32, NX),
                f"{arch}.expert_used_count": (V.UINT32, NU)} if moe else {})
    md = metadata(arch, layers=L, embd=E, ff=DENSE_FF, heads=H, kv_heads=KS, ctx=4096, after_ff=experts)
    # Gemma 4's tokenizer type with the tests' 259 ids: byte b is token b
    # (`<0xXX>`, the byte fallback), 256 the space (U+2581), 257 / 258
    # BOS / EOS, so `TINY_IDS` reads "<bos>Hello world" here too
    md.pop("tokenizer.ggml.pre")
    md.update({"tokenizer.ggml.model": "gemma4",
               "tokenizer.ggml.tokens": (V.ARRAY, [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "<bos>", "<eos>"],
                                         V.STRING),
               "tokenizer.ggml.token_type": (V.ARRAY, [6] * 256 + [1, 3, 3], V.INT32),
               "tokenizer.ggml.merges": (V.ARRAY, ["\u2581 \u2581"], V.STRING),
               "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False})
    md.update({f"{arch}.feed_forward_length": (V.ARRAY, n_ff, V.UINT32),
               f"{arch}.attention.head_count_kv": (V.ARRAY, [KS if s else KF for s in swa], V.UINT32),
               f"{arch}.attention.key_length": (V.UINT32, DF), f"{arch}.attention.value_length": (V.UINT32, DF),
               f"{arch}.attention.key_length_swa": (V.UINT32, DS),
               f"{arch}.attention.value_length_swa": (V.UINT32, DS),
               f"{arch}.rope.dimension_count": (V.UINT32, DF),
               f"{arch}.rope.dimension_count_swa": (V.UINT32, DS),
               f"{arch}.rope.freq_base_swa": (V.FLOAT32, 10000.0),
               f"{arch}.attention.sliding_window": (V.UINT32, 8),
               f"{arch}.attention.sliding_window_pattern": (V.ARRAY, swa, V.BOOL),
               f"{arch}.attention.shared_kv_layers": (V.UINT32, shared),
               f"{arch}.embedding_length_per_layer_input": (V.UINT32, 0 if moe else P),
               f"{arch}.final_logit_softcapping": (V.FLOAT32, 30.0)})

    def q(t, *shape, scale=0.02):
        w = (rng.standard_normal(shape) * scale).astype(np.float32)
        t = GGMLType[t]
        data = (w.reshape(-1) if t == GGMLType.F32 else
                quantize(w.reshape(-1, w.shape[-1]), t).reshape(-1))
        return (t, tuple(reversed(w.shape)), data)

    def f32(w):
        return (GGMLType.F32, tuple(reversed(w.shape)), np.ascontiguousarray(w, np.float32).reshape(-1))

    # small embeddings (scaled by sqrt(n_embd) = 16) and a large output
    # norm, as `tiny_model`'s gemma3: the layers' share of the residual
    # stays large and the tied output's logits spread
    ts = [("token_embd.weight",) + q("Q8_0", nv, E, scale=0.1), ("output_norm.weight",) + norm(rng, E, 3.0),
          ("rope_freqs.weight",) + f32(np.array([1.0] * (DF // 8) + [1e30] * (DF // 2 - DF // 8)))]
    if not moe:
        ts += [("per_layer_token_embd.weight",) + q("Q8_0", nv, L * P, scale=0.5),
               ("per_layer_model_proj.weight",) + q("F16", L * P, E, scale=0.05),
               ("per_layer_proj_norm.weight",) + norm(rng, P)]
    for i, (ta, tgu, td) in enumerate(layers):
        p = f"blk.{i}."
        hd, kv = (DS, KS) if swa[i] else (DF, KF)
        ts += [(p + "attn_norm.weight",) + norm(rng, E), (p + "attn_q.weight",) + q(ta, H * hd, E),
               (p + "attn_k.weight",) + q(ta, kv * hd, E)]
        if swa[i] or not moe:
            ts.append((p + "attn_v.weight",) + q(ta, kv * hd, E))
        ts += [(p + "attn_output.weight",) + q(ta, E, H * hd),
               (p + "attn_q_norm.weight",) + norm(rng, hd, QK_GAIN),
               (p + "attn_k_norm.weight",) + norm(rng, hd, QK_GAIN),
               (p + "post_attention_norm.weight",) + norm(rng, E),
               (p + "layer_output_scale.weight",) + f32(rng.uniform(0.5, 1.0, 1)),
               (p + "ffn_norm.weight",) + norm(rng, E),
               (p + "ffn_gate.weight",) + q(ta if moe else tgu, n_ff[i], E),
               (p + "ffn_up.weight",) + q(ta if moe else tgu, n_ff[i], E),
               (p + "ffn_down.weight",) + q(ta if moe else td, E, n_ff[i]),
               (p + "post_ffw_norm.weight",) + norm(rng, E)]
        if moe:
            r = (rng.standard_normal((NX, E)) * 0.02).astype(np.float32)
            if i == 1:
                r[5] = r[2]
            ts += [(p + "ffn_gate_inp.weight",) + f32(r),
                   (p + "ffn_gate_inp.scale",) + f32(rng.uniform(0.5, 1.5, E)),
                   (p + "pre_ffw_norm_2.weight",) + norm(rng, E),
                   (p + "post_ffw_norm_1.weight",) + norm(rng, E),
                   (p + "post_ffw_norm_2.weight",) + norm(rng, E)]
            if i < 2:
                ts.append((p + "ffn_gate_up_exps.weight",) + q(tgu, NX, 2 * F, E))
            else:
                ts += [(p + "ffn_gate_exps.weight",) + q(tgu, NX, F, E),
                       (p + "ffn_up_exps.weight",) + q(tgu, NX, F, E)]
            ts += [(p + "ffn_down_exps.weight",) + q(td, NX, E, F),
                   (p + "ffn_down_exps.scale",) + f32(rng.uniform(0.5, 1.5, NX))]
        else:
            ts += [(p + "inp_gate.weight",) + q("Q8_0", P, E, scale=0.05),
                   (p + "proj.weight",) + q("Q8_0", E, P, scale=0.05),
                   (p + "post_norm.weight",) + norm(rng, E)]
    write(path, md, ts)


# ------------------------------------------------------ pre-tokenizer probe vocabularies
def pretok_vocab(texts, pre: str, max_len: int = 12) -> dict:
    """GGUF metadata of a byte-level BPE vocabulary that shows a
    pre-tokenizer's pieces: besides the 256 byte characters, every substring
    (2 .. max_len characters of the byte-level text) of `texts` is a token,
    and every split of it into two tokens is a merge (shorter results
    first), so BPE turns each pre-tokenized piece of up to max_len
    characters into one token whatever its merge order: the token ids of a
    text are its pieces. Used by tools/llama_ref.py `pretok` (through
    llama.cpp) and tests/test_infer_tokenizer.py (through ours)."""
    from strata_ref.gguf import GGUFValueType as V
    from strata_ref.infer.tokenizer import _BYTE_TO_CHAR
    tokens = [_BYTE_TO_CHAR[b] for b in range(256)]
    subs = set()
    for t in texts:
        s = "".join(_BYTE_TO_CHAR[b] for b in t.encode("utf-8"))
        for i in range(len(s)):
            for n in range(2, max_len + 1):
                if i + n <= len(s):
                    subs.add(s[i:i + n])
    subs = sorted(subs, key=lambda x: (len(x), x))
    merges = [f"{w[:k]} {w[k:]}" for w in subs for k in range(1, len(w))]
    tokens += subs + ["<|endoftext|>"]
    return {"general.architecture": "gpt2", "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": (V.ARRAY, tokens, V.STRING),
            "tokenizer.ggml.token_type": (V.ARRAY, [1] * (len(tokens) - 1) + [3], V.INT32),
            "tokenizer.ggml.merges": (V.ARRAY, merges, V.STRING),
            "tokenizer.ggml.eos_token_id": (V.UINT32, len(tokens) - 1),
            "tokenizer.ggml.bos_token_id": (V.UINT32, len(tokens) - 1)}


#: texts whose gpt-4o pieces differ from other pre-tokenizers': letter case
#: runs, attached contractions, digit groups, punctuation with / and newlines,
#: non-ASCII letters (upper and lower case at once for llama.cpp) and marks
PRETOK_TEXTS = ["HelloWorld", "CamelCase x", "iPhone IPHONE", "I'M don't", "DON'T it's",
                "ÉCOLE école", "ΑΒΓ αβγ Αβγ", "Ünïcödé", "1234567 89", "a\n\nb\r\n c",
                "x /\n/ y", "日本語です", "naïve", "  two  spaces", "tab\tsep", "🦙🦙 ok",
                "MIXEDcase", "mixedCASE", "'s 'S 'd", "e\u0301 combined", "3.14/2", "(ok)\n",
                "ABCdef GHi", "a1b2C3", "__init__", "$100,000"]

#: more texts for the pre-tokenizers with their own CJK / digit / punctuation
#: rules (deepseek-v3, kimi-k2): Han, kana and hangul next to other scripts,
#: digit runs of 1-7 and non-ASCII digits, punctuation runs (ASCII and
#: full-width), contractions, accents and combining marks, emoji, CR LF,
#: runs of spaces and non-ASCII whitespace. `pretok_corpus()` adds these and
#: PRETOK_TEXTS to the .inp texts of llama.cpp's vocabulary tests.
PRETOK_EXTRA = [
    "中文字符测试", "漢字かな交じり文", "日本語のテキスト、カタカナ・ひらがな。", "한국어 텍스트입니다",
    "中文123abc", "你好，世界！", "㐀㐁 𠀀𠀁 豈", "〇〆々ー", "ひらがな カタカナ ｶﾀｶﾅ", "Hello世界 世界Hello",
    "abc日本def", "東京タワー Tokyo", "1", "12", "123", "1234", "12345", "123456", "1234567",
    "a1234567b", "٣٤٥ ١٢", "１２３４５", "Ⅻ ½ ²³", "x1 y22 z333", "!!!???...", "a...b", "--->",
    "«quoted» „x“", "(foo)[bar]{baz}", "#$%&*+,-./:;<=>?@^_`|~", "。、！？", "　全角スペース",
    " , ", "''", "don't I'm you're we've they'll she'd IT'S", "it's we'RE they'Ve I'LL 'D x's",
    "Привет мир", "Ελληνικά", "mixedРусскийText", "العربية نص", "עברית", "हिन्दी", "ไทย",
    "café naïve résumé", "e\u0301 a\u0300\u0301", "\u0301start", "A\u030a \u00c5", "ǅungla",
    "ﬁ ligature", "🦙🦙", "👨\u200d👩\u200d👧", "🇫🇷", "✓ ☃ ⚡", "line1\r\nline2\r\n\r\n",
    "\n\n\n", "\r", " \n ", "a \n\n b", "a    b", "     ", "    x", "x     ", "\t\t  \tx",
    "a\u3000b", "a\u00a0b", "a\u2003\u2003b", "x\u0085y", "a \u3000b", "$100,000.50",
    "3.14159", "C++ & C#", "user@example.com", "http://x.y/z?q=1", "snake_case_name",
    "camelCaseName ALLCAPS", "\x1c\x1d x", "\u200bzero\u200bwidth", "中文 English 123 !!!\n",
    "'s'll 're", "Ａｂｃ ｘｙｚ", "가나다ABC", "ㄱㄴㄷ", "ㄅㄆㄇ"]


def pretok_corpus() -> list:
    """The .inp texts of the sdist's vocabulary tests (deepseek-llm's,
    qwen35's), PRETOK_TEXTS and PRETOK_EXTRA, each once, in that order."""
    texts = []
    for name in ("deepseek-llm", "qwen35"):
        f = vocab_dir() / f"ggml-vocab-{name}.gguf.inp"
        texts += f.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    return list(dict.fromkeys(texts + PRETOK_TEXTS + PRETOK_EXTRA))


# ---------------------------------------------------------- tiny-model runs
_LOADED: dict = {}


def cached_model(path, profile):
    """The model of `path` loaded on CPU `profile`, once per test session
    (the tiny models' tests share it)."""
    from strata_ref.infer.loader import load
    key = (str(path), profile)
    if key not in _LOADED:
        _LOADED[key] = load(path, profile=profile)
    return _LOADED[key]


def tiny_moe_files(tmp_path_factory, archs, label: str) -> dict:
    """{arch: path} of the tiny seeded models of `archs` (`tiny_moe_model`
    at `moe_seed`), written into a fresh temporary folder named `label`."""
    d = tmp_path_factory.mktemp(label)
    out = {}
    for arch in archs:
        out[arch] = d / f"tiny_{arch}.gguf"
        tiny_moe_model(arch, out[arch], seed=moe_seed(arch))
    return out


def cache_passes(m, prompt, ids, n_ctx: int = 512, **cache):
    """(batched rows, incremental rows, the incremental pass's cache) of
    token ids `ids` over a cache made by `m.new_cache(n_ctx, **cache)`: the
    batched pass takes all ids in one call, the incremental one the prompt
    in one call and each further id in its own, as llama.cpp's reference
    runs (tools/llama_ref.py) do."""
    import numpy as np
    batched = m.forward(ids, m.new_cache(n_ctx, **cache), all_logits=True)
    c = m.new_cache(n_ctx, **cache)
    rows = [m.forward(prompt, c, all_logits=True)] + [m.forward([t], c)[None] for t in ids[len(prompt):]]
    return batched, np.concatenate(rows), c


def check_stored_fa_run(m, ref, label: str, **cache) -> None:
    """Assert that `m` reproduces a stored llama.cpp run of
    `tools/llama_ref.py moe --flash-attn`: the short run's every logit bit
    for bit (batched and incremental), the long run's row hashes, and both
    runs' greedy ids."""
    import numpy as np
    for p_key, g_key, exact in (("prompt_ids", "greedy_ids", True), ("long_prompt_ids", "long_greedy_ids", False)):
        prompt, gen = ref[p_key].tolist(), ref[g_key].tolist()
        batched, incr, _ = cache_passes(m, prompt, prompt + gen, **cache)
        run = "" if exact else "long "
        for kind, got in (("batched", batched), ("incr", incr)):
            if exact:
                bad = np.flatnonzero((f32_bits(got) != f32_bits(ref[kind])).any(axis=1))
            else:
                bad = np.flatnonzero(row_hashes(got) != ref[f"long_{kind}_hash"])
            assert bad.size == 0, f"{label} {run}{kind}: rows {bad.tolist()} differ"
        assert np.argmax(incr[len(prompt) - 1:-1], axis=1).tolist() == gen, f"{label} {run}greedy ids"

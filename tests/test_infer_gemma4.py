"""gemma4's pieces that the llama.cpp logits (tests/test_infer_moe.py, which
checks the tiny gemma4 models bit for bit in every profile) do not show
one by one: the hyperparameters as llama.cpp reads them, the KV layout of
the shared-KV layers, ggml's unary GELU, and what the graph refuses by
name.
"""
from __future__ import annotations

import numpy as np
import pytest

from infer_helpers import f32_bits, tiny_gemma4

ARCH = "gemma4"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    out = {}
    for name in ("gemma4", "gemma4-moe"):
        out[name] = d / f"{name}.gguf"
        tiny_gemma4(name, out[name])
    return out


def _patched(path, name="gemma4", md_fn=None, tensor_fn=None, extra=()):
    import strata_ref.gguf as sgguf
    real = sgguf.write_gguf

    def patched(p, meta, ts, **kw):
        if md_fn is not None:
            meta = dict(meta)
            md_fn(meta)
        if tensor_fn is not None:
            ts = [x for x in (tensor_fn(*t) for t in ts) if x is not None]
        real(p, meta, list(ts) + list(extra), **kw)
    sgguf.write_gguf = patched
    try:
        tiny_gemma4(name, path)
    finally:
        sgguf.write_gguf = real
    return path


def _refused(path, pattern, **patch):
    from strata_ref.infer.loader import load
    from strata_ref.infer.model import ModelLoadError
    with pytest.raises(ModelLoadError, match=pattern):
        load(_patched(path, **patch), profile="avx2")


def test_hparams_as_llama_cpp_reads_them(files):
    from strata_ref.infer.loader import load
    m = load(files["gemma4"], profile="avx2")
    hp = m.hp
    assert hp.swa_layers == (True, True, True, False, True, False)
    assert (hp.head_dim, hp.head_dim_swa, hp.n_rot, hp.n_rot_swa) == (128, 64, 128, 64)
    assert hp.n_head_kv_layers == (2, 2, 2, 1, 2, 1)
    assert hp.n_ff_layers == (512, 512, 512, 512, 1024, 1024)
    assert (hp.n_layer_kv, hp.n_swa, hp.n_embd_per_layer, hp.n_expert) == (4, 8, 32, 0)
    assert (hp.rope_base, hp.rope_base_swa, hp.rope_freq_scale_swa) == (1e6, 1e4, 1.0)
    # gemma4.cpp: f_attention_scale 1 (no scaling of q), the softmax scale 1
    assert hp.kq_scale == 1.0 and hp.final_softcap == 30.0
    assert np.float32(hp.embd_scale) == np.sqrt(np.float32(256))
    # llama.cpp's reuse: layer 4 (sliding-window) takes layer 2's cells,
    # layer 5 (full) layer 3's
    assert [hp.kv_owner(il) for il in range(6)] == [0, 1, 2, 3, 2, 3]
    # the full layers' RoPE factors: 16 rotated pairs, 48 left in place
    assert m.rope_freqs.shape == (64,) and (m.rope_freqs[:16] == 1).all() and (m.rope_freqs[16:] == 1e30).all()
    m = load(files["gemma4-moe"], profile="avx2")
    hp = m.hp
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.gating, hp.norm_w) == (8, 2, 256, "softmax", True)
    assert hp.n_layer_kv == 4 and hp.n_embd_per_layer == 0
    # the full layer without attn_v (V is the K product)
    assert m.layers[3].attn.wv is None and m.layers[0].attn.wv is not None
    assert m.layers[0].moe.gate_up is not None and m.layers[0].moe.down_scale.shape == (8,)


def test_shared_layers_store_nothing(files):
    from strata_ref.infer.loader import load
    m = load(files["gemma4"], profile="avx2")
    c = m.new_cache(64)
    assert c.base.k.shape[:2] == (1, 1) and c.swa.k.shape[:2] == (3, 2)      # 1 full, 3 sliding slots
    assert c.base.head_dim == 128 and c.swa.head_dim == 64
    assert [c.of(il)[1:] for il in range(6)] == [(0, False), (1, False), (2, False), (0, False), (2, True),
                                                  (0, True)]
    m.forward([257, 72, 101], c)
    assert c.n == c.base.n == c.swa.n == 3
    # a shared layer's k / v tensors are loaded (llama.cpp loads them) but not run
    assert m.layers[4].attn.wk is not None and m.layers[4].attn.matrices() == [m.layers[4].attn.wq,
                                                                              m.layers[4].attn.wo]
    c.truncate(1)
    assert c.base.n == c.swa.n == 1


def test_gelu_is_ggmls_table():
    from strata_ref import cpu
    from strata_ref.cpu import ops
    prof = cpu.select("avx2")
    x = np.array([-12.0, -10.0, -9.99, -1.0, 0.0, 0.5, 3.0, 9.99, 10.0, 11.5], np.float32)
    got = ops.gelu(x, prof)
    tab = ops.gelu_table(prof)
    want = [0.0, 0.0] + [tab[int(v)] for v in x[2:8].astype(np.float16).view(np.uint16)] + [10.0, 11.5]
    assert np.array_equal(f32_bits(got), f32_bits(np.array(want, np.float32)))
    assert np.array_equal(f32_bits(ops.gelu(x.reshape(2, 5), prof)), f32_bits(got.reshape(2, 5)))


def test_cache_not_checked_is_refused(files):
    # the caches checked against llama.cpp run (tests/test_infer_gemma4_kv.py);
    # the others are refused by name
    from strata_ref.infer.loader import load
    m = load(files["gemma4"], profile="avx2")
    for opts in ({"type_k": "q8_0", "flash_attn": True}, {"type_v": "q8_0", "flash_attn": True}):
        with pytest.raises(NotImplementedError, match="is not checked against llama.cpp"):
            m.new_cache(64, **opts)


@pytest.mark.parametrize("key, value, pattern", [
    ("attention.sliding_window_pattern", 5, r"`gemma4.attention.sliding_window_pattern` must be an array"),
    ("attention.sliding_window_pattern", None, r"no `gemma4.attention.sliding_window_pattern` array"),
    ("attention.sliding_window", None, r"no `gemma4.attention.sliding_window`"),
    ("attention.key_length_swa", None, r"no `gemma4.attention.key_length_swa`"),
    ("attention.value_length_swa", 32, r"`gemma4.attention.value_length_swa` differs"),
    ("embedding_length_per_layer_input", None, r"no `gemma4.embedding_length_per_layer_input`"),
    ("attention.shared_kv_layers", 5, r"= 5 leaves 1 layer with a KV cache of its own \(llama.cpp asserts"),
    ("attention.shared_kv_layers", 6, r"= 6 leaves 0 layers with a KV cache of their own \(llama.cpp asserts"),
    # the full layers' 128 is its default, too large for the heads of 64:
    # once "`gemma4.rope.dimension_count_swa` = 128 is out of range"
    ("rope.dimension_count_swa", None, r"^GGUF metadata has no `gemma4.rope.dimension_count_swa`, and its "
                                       r"default, the full layers' `gemma4.rope.dimension_count` = 128, does "
                                       r"not fit the sliding-window heads \(`gemma4.attention.key_length_swa` "
                                       r"= 64\)$"),
    ("rope.dimension_count_swa", 66, r"^`gemma4.rope.dimension_count_swa` = 66 is out of range"),
    ("attention.shared_kv_layers", 3, r"layer 3 would reuse the KV cells of layer 2, a layer of the other kind"),
    ("attention.head_count_kv", [2, 1, 2, 1, 2, 1], r"the sliding-window layers have different KV head counts"),
    ("feed_forward_length", [512] * 5, r"`gemma4.feed_forward_length` has 5 values for 6 layers"),
    ("feed_forward_length", [512], r"`gemma4.feed_forward_length` has 1 value for 6 layers"),
    ("attention.sliding_window_pattern", [1], r"`gemma4.attention.sliding_window_pattern` has 1 value for 6 layers"),
    ("rope.scaling.attn_factor", 2.0, r"`gemma4.rope.scaling.attn_factor` is not supported"),
])
def test_hparam_errors_name_the_key(tmp_path, key, value, pattern):
    from strata_ref.gguf import GGUFValueType as V

    def md_fn(md):
        k = f"{ARCH}.{key}"
        if value is None:
            md.pop(k)
        elif isinstance(value, list):
            md[k] = (V.ARRAY, value, V.UINT32)
        elif isinstance(value, float):
            md[k] = (V.FLOAT32, value)
        else:
            md[k] = (V.UINT32, value)
    _refused(tmp_path / "m.gguf", pattern, md_fn=md_fn)


def test_tensor_errors_name_the_tensor(tmp_path):
    from strata_ref import GGMLType
    z = np.zeros(256, np.float32)
    _refused(tmp_path / "a.gguf", r"gemma4: missing tensor `rope_freqs.weight`",
             tensor_fn=lambda n, t, s, d: None if n == "rope_freqs.weight" else (n, t, s, d))
    _refused(tmp_path / "b.gguf", r"gemma4: tensor `blk.0.attn_q.scale` \(a per-tensor weight scale",
             extra=[("blk.0.attn_q.scale", GGMLType.F32, (1,), z[:1])])
    _refused(tmp_path / "c.gguf", r"gemma4: fused `blk.1.attn_qkv.weight` is not supported",
             extra=[("blk.1.attn_qkv.weight", GGMLType.F32, (256, 1), z)])
    _refused(tmp_path / "d.gguf", r"gemma4: missing tensor `blk.2.inp_gate.weight`",
             tensor_fn=lambda n, t, s, d: None if n == "blk.2.inp_gate.weight" else (n, t, s, d))
    _refused(tmp_path / "e.gguf", r"gemma4: missing tensor `blk.1.ffn_gate_inp.scale`", name="gemma4-moe",
             tensor_fn=lambda n, t, s, d: None if n == "blk.1.ffn_gate_inp.scale" else (n, t, s, d))
    # a layer without its fused gate / up experts: named as the file names
    # them (once "missing tensor `blk.0.ffn_gate_exps.weight`" only)
    _refused(tmp_path / "e2.gguf", r"^gemma4: missing tensor `blk\.0\.ffn_gate_up_exps\.weight` \(the fused gate "
             r"and up experts\), or `blk\.0\.ffn_gate_exps\.weight` and `blk\.0\.ffn_up_exps\.weight`$",
             name="gemma4-moe", tensor_fn=lambda n, t, s, d: None if n == "blk.0.ffn_gate_up_exps.weight"
             else (n, t, s, d))
    # a layer of its own KV needs attn_k; a shared layer does not
    _refused(tmp_path / "f.gguf", r"gemma4: missing tensor `blk.3.attn_k.weight`",
             tensor_fn=lambda n, t, s, d: None if n == "blk.3.attn_k.weight" else (n, t, s, d))
    from strata_ref.infer.loader import load
    f = _patched(tmp_path / "g.gguf", tensor_fn=lambda n, t, s, d: None if n.startswith("blk.5.attn_k")
                 or n == "blk.5.attn_v.weight" else (n, t, s, d))
    assert load(f, profile="avx2").layers[5].attn.wk is None


def test_the_speed_line_names_the_cache_on_a_v0_4_0_profile(files):
    # a v0.4.0 profile names its cache in the speed line (flash attention
    # being its default); the gemma4 cache (IswaCache) once lacked what
    # that note reads, so every such generate ended in an AttributeError
    from strata_ref.cli.inference import cache_note
    from strata_ref.infer.loader import load
    m = load(files["gemma4"], profile="v0.4.0-haswell", flash_attn=False)
    assert cache_note(m) == " | kv: k f16, v f16, flash attention off"

"""tools/make_bench_model.py: the Q4_K_M type mix of llama.cpp's
`llama_tensor_get_type` on the 1.5B and 7B shapes (the files themselves are
made and run by tools/bench_infer.py, not here: about 1 and 5 GB)."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import make_bench_model as mb  # noqa: E402
from strata_ref.types import GGMLType as T  # noqa: E402


def test_use_more_bits_layers_of_28_and_32():
    # llama-quant.cpp: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2, by hand
    assert [i for i in range(28) if mb.use_more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23,
                                                                   24, 25, 26, 27]
    assert [i for i in range(32) if mb.use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21,
                                                                   24, 27, 28, 29, 30, 31]


def test_q4_k_m_mix_and_sizes():
    spec = {n: (t, s) for n, t, s in mb.tensors(mb.SHAPES["1.5b"], 151936)}
    assert spec["token_embd.weight"] == (T.Q6_K, (1536, 151936))     # tied: the output's type
    assert "output.weight" not in spec
    assert spec["blk.5.ffn_down.weight"][0] == T.Q6_K and spec["blk.6.ffn_down.weight"][0] == T.Q4_K
    assert spec["blk.5.attn_v.weight"] == (T.Q6_K, (1536, 256))
    assert spec["blk.0.attn_k.bias"] == (T.F32, (256,))
    q4, q6 = 144 / 256, 210 / 256                    # bytes per value of Q4_K, Q6_K
    big = 14                                         # layers with Q6_K attn_v / ffn_down
    layer = (2 * 1536 * 1536 + 1536 * 256 + 2 * 1536 * 8960) * q4 + 2 * 1536 * 4 + (1536 + 512) * 4
    total = (1536 * 151936 * q6 + 28 * layer + big * (1536 * 256 + 8960 * 1536) * q6
             + (28 - big) * (1536 * 256 + 8960 * 1536) * q4 + 1536 * 4)
    assert sum(mb.n_bytes(t, s) for t, s in spec.values()) == int(total)
    seven = {n: (t, s) for n, t, s in mb.tensors(mb.SHAPES["7b"], 151936)}
    assert seven["token_embd.weight"][0] == T.Q4_K and seven["output.weight"][0] == T.Q6_K
    assert seven["blk.3.ffn_down.weight"] == (T.Q6_K, (14336, 4096))
    assert "blk.0.attn_q.bias" not in seven


def test_bench_infer_finds_the_models_in_the_projects_cache(tmp_path, monkeypatch):
    # bench_infer.py --models bench-1.5b looks in <cache>/bench/, where
    # <cache> follows $STRATA_REF_CACHE as every other cached file does
    import bench_infer
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    want = tmp_path / "bench" / "bench-1.5b-q4_k_m.gguf"
    want.parent.mkdir()
    want.write_bytes(b"")
    assert bench_infer.bench_model("bench-1.5b") == want


def test_bench_matvec_float_weights_are_finite():
    # random bytes of F32 / BF16 hold NaN, infinities and values near the
    # largest finite: the benchmark compared NaN products; its float
    # weights are N(0, 1) values now, its quantized ones unchanged
    import bench_matvec
    from strata_ref import dequantize
    from strata_ref.routes.mmvq_inputs import sane_blocks
    for t in (T.F32, T.F16, T.BF16):
        raw = bench_matvec.weight_bytes(t, 64, 256, np.random.default_rng(0))
        w = np.asarray(dequantize(raw, t), np.float32).reshape(-1)
        assert w.size == 64 * 256 and np.isfinite(w).all() and 0.5 < w.std() < 2.0
        assert np.abs(w - np.random.default_rng(0).standard_normal(w.size).astype(np.float32)).max() < 0.01
    raw = bench_matvec.weight_bytes(T.Q4_K, 64, 256, np.random.default_rng(0))
    assert raw.tobytes() == sane_blocks(T.Q4_K, 64, np.random.default_rng(0)).tobytes()


def test_make_bench_model_refuses_a_bad_tokenizer_source_or_output(tmp_path, capsys):
    # these were tracebacks (GGUF magic, StopIteration) or, for a GGUF
    # without tokenizer keys, a 69-byte "tokenizer" written as if done
    import gguf
    import pytest
    text = tmp_path / "notes.txt"
    text.write_text("not a gguf\n")
    bare = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(bare), "qwen2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    out = tmp_path / "tok.gguf"
    cases = [(["tokenizer", str(out), "--tokenizer", str(text)], f"--tokenizer: {text}: not a GGUF file"),
             (["tokenizer", str(out), "--tokenizer", str(bare)], f"--tokenizer: {bare}: has no "
                                                                  f"tokenizer.ggml.tokens key"),
             (["1.5b", str(out), "--tokenizer", str(bare)], f"--tokenizer: {bare}: has no tokenizer.ggml.tokens"),
             (["tokenizer", str(out), "--tokenizer", str(tmp_path)], f"--tokenizer: not a file: {tmp_path}"),
             (["tokenizer", str(tmp_path)], f"{tmp_path}: is a directory"),
             (["tokenizer", str(tmp_path / "no" / "t.gguf")], f"{tmp_path / 'no' / 't.gguf'}: its folder "
                                                              f"does not exist")]
    for argv, msg in cases:
        with pytest.raises(SystemExit) as e:
            mb.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
    assert not out.exists()


def test_bench_matvec_refuses_a_type_without_a_mat_mul(capsys):
    import pytest
    import bench_matvec
    with pytest.raises(SystemExit) as e:
        bench_matvec.main(["--types", "Q4_K,I8"])
    assert e.value.code == 2
    assert "--types: ggml-cpu has no mat-mul for I8 weights" in capsys.readouterr().err


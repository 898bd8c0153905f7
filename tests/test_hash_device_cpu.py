"""`strata-ref hash --device cuda` on the CPU, against the stand-in library of
test_native_parity_cpu.py (its `strata_dequant` is the NumPy oracle behind
api.cu's checks), extended with events, the asynchronous copy and the
device queries. What this shows: chunking, the per-dtype hashing threads,
the chained hashes, the kernel chosen per tensor, the oracle fallback for
types without a kernel, the stdout identity with the oracle's `hash`, the
timing arithmetic and the comparison's first difference (a planted fault).
That the real kernels give the oracle's hashes is tests/gpu's business."""
import json
import sys

import numpy as np
import pytest

from strata_ref.cli import main
from strata_ref.gguf import read, write_gguf
from strata_ref.hashing import chain_hashes, hash_tensor
from strata_ref.native.dequant import wrapper as nd
from strata_ref.native import hash_device as hd
from strata_ref.native import loader
from strata_ref.native.dequant.parity import make_blocks
from strata_ref.types import GGMLType as T
from strata_ref.types import block_format

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_native_parity_cpu import FakeFFI, FakeLib, _Ptr  # noqa: E402

# simulated kernel times per launch, ms: the generic kernel three times the wide one
_MS = {0: 0.003, 1: 0.001, "copy": 0.5}


class TimingFFI(FakeFFI):
    def new(self, decl, n=None):
        return _Ptr([0] * (n or 1))

    def string(self, s):
        return s[0] if isinstance(s, _Ptr) else s


class TimingLib(FakeLib):
    """FakeLib plus events that report a fixed time per kernel kind."""

    def __init__(self, fault=None):
        super().__init__(fault)
        self.mem = np.zeros(1 << 27, np.uint8)
        self.pending = []
        self.events = {}

    def strata_dequant(self, t, b, row0, rows, cols, ld, code, o, kernel, stream):
        st = super().strata_dequant(t, b, row0, rows, cols, ld, code, o, kernel, stream)
        if st == 0:
            self.pending.append(_MS[kernel])
        return st

    def strata_dequant_timed(self, t, b, row0, rows, cols, ld, code, o, kernel, flush, nflush,
                             reps, ms, stream):
        if not 1 <= reps <= 64:
            return 7
        for i in range(reps):
            st = super().strata_dequant(t, b, row0, rows, cols, ld, code, o, kernel, stream)
            if st:
                return st
            ms[i] = _MS[kernel]
        return 0

    def strata_event_create(self, p):
        p[0] = len(self.events) + 1
        self.events[p[0]] = 0.0
        return 0

    def strata_event_destroy(self, e):
        return 0

    def strata_event_record(self, e, stream):
        self.events[e] = sum(self.pending)
        return 0

    def strata_event_elapsed_ms(self, ms, a, b):
        ms[0] = self.events[b] - self.events[a]
        self.pending.clear()
        return 0

    def strata_memcpy_dtod_async(self, dst, src, n, stream):
        self.mem[dst:dst + n] = self.mem[src:src + n]
        self.pending.append(_MS["copy"])
        return 0

    def strata_memset_async(self, p, v, n, stream):
        self.mem[p:p + n] = v
        return 0

    def strata_mem_get_info(self, f, t):
        f[0] = self.mem.size - self.top
        t[0] = self.mem.size
        return 0

    def strata_device_name(self, dev, buf, n):
        buf[0] = b"Fake GPU"
        return 0

    def strata_l2_cache_bytes(self, dev, p):
        p[0] = 1 << 20
        return 0


@pytest.fixture
def fake(monkeypatch):
    def install(fault=None):
        nat = loader.Native(TimingFFI(), TimingLib(fault), 90, "<fake>")
        monkeypatch.setattr(loader, "load", lambda device=None: nat)
        monkeypatch.setattr(nd, "load", lambda device=None: nat)
        monkeypatch.setattr("strata_ref.native.unavailable_reason", lambda: None)
        monkeypatch.delenv("STRATA_DEQUANT_WIDE", raising=False)
        return nat
    return install


def _blocks(t, rows, cols, seed):
    fmt = block_format(t)
    return make_blocks(t, rows * cols // fmt.block_values, "sane",
                       np.random.default_rng(seed)).reshape(-1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A small GGUF: wide-capable types (Q8_0, Q4_K, Q6_K), generic-only
    types (Q4_1, F32), a plain I32 no kernel serves, raw random blocks with
    NaN scales (Q4_K), and tensors long enough to be cut into chunks."""
    rng = np.random.default_rng(3)
    tensors = [
        ("emb", T.Q8_0, (256, 40), _blocks(T.Q8_0, 40, 256, 1)),
        ("norm", T.F32, (96,), rng.standard_normal(96).astype(np.float32)),
        ("ffn", T.Q4_K, (512, 12), _blocks(T.Q4_K, 12, 512, 2)),
        ("pos", T.I32, (16,), rng.integers(-9, 9, 16).astype(np.int32)),
        ("down", T.Q6_K, (256, 9), _blocks(T.Q6_K, 9, 256, 4)),
        ("q41", T.Q4_1, (64, 7), _blocks(T.Q4_1, 7, 64, 5)),
        ("raw", T.Q4_K, (256, 5), np.random.default_rng(6).integers(
            0, 256, 5 * 144, dtype=np.uint8)),
    ]
    path = tmp_path_factory.mktemp("hd") / "small.gguf"
    write_gguf(path, {"general.name": "hash-device test"}, tensors)
    return path


def _oracle(path, outs):
    f = read(path)
    per = [hash_tensor(t.type, t.data, t.rows, t.cols, outs) for t in f.tensors]
    return per, {d: chain_hashes(h[d] for h in per) for d in outs}


@pytest.mark.parametrize("kernel", ["auto", "generic", "wide"])
@pytest.mark.parametrize("chunk", [1 << 25, 700])
def test_device_hashes_equal_the_oracle(fake, model, kernel, chunk):
    fake()
    outs = ("f32", "f16", "bf16")
    per, chain = _oracle(model, outs)
    done = []
    run = hd.hash_tensors_device(read(model).tensors, outs, kernel=kernel, reps=2,
                                 chunk_values=chunk, progress=done.append)
    assert [t.hashes for t in run.tensors] == per
    assert run.chained == chain
    assert sum(done) == sum(t.n_bytes for t in read(model).tensors)
    assert run.device_name == "Fake GPU" and run.cc == 90


def test_kernel_per_tensor(fake, model, monkeypatch):
    fake()
    f = read(model)

    def kernels(**kw):
        run = hd.hash_tensors_device(f.tensors, ("f16",), reps=1, **kw)
        return {t.name: (t.kernel, t.peer) for t in run.tensors}
    assert kernels(kernel="wide") == {
        "emb": ("wide", "generic"), "norm": ("generic", None), "ffn": ("wide", "generic"),
        "pos": ("oracle", None), "down": ("wide", "generic"), "q41": ("generic", None),
        "raw": ("wide", "generic")}
    assert kernels(kernel="generic") == {
        "emb": ("generic", "wide"), "norm": ("generic", None), "ffn": ("generic", "wide"),
        "pos": ("oracle", None), "down": ("generic", "wide"), "q41": ("generic", None),
        "raw": ("generic", "wide")}
    # auto on compute capability 9.0: Q8_0 wide, the K-quants generic
    auto = kernels(kernel="auto")
    assert auto["emb"] == ("wide", "generic") and auto["ffn"] == ("generic", "wide")
    assert kernels(kernel="auto", env={"STRATA_DEQUANT_WIDE": "1"})["ffn"] == ("wide", "generic")
    run = hd.hash_tensors_device(f.tensors, ("f32",), kernel="wide", reps=1)
    why = {t.name: t.reason for t in run.tensors}
    assert why["q41"] == "Q4_1 has no wide kernel"
    assert why["pos"] == "no native kernel for I32 (hashed by the NumPy oracle)"


def test_timing_sums_and_ratio(fake, model):
    fake()
    f = read(model)
    run = hd.hash_tensors_device(f.tensors, ("f32", "bf16"), kernel="wide", reps=3,
                                 chunk_values=1000)
    emb = run.tensors[0]
    chunks = -(-40 // (1000 // 256))           # 3 rows per chunk
    assert emb.time_s["f32"] == pytest.approx(chunks * _MS[1] / 1e3)
    assert emb.peer_time_s["f32"] == pytest.approx(chunks * _MS[0] / 1e3)
    s = run.timing("bf16")
    served = [t for t in f.tensors if t.type != T.I32]
    assert s["tensors"] == len(served)
    assert s["bytes"] == sum(t.n_bytes + 2 * t.n_elements for t in served)
    assert s["both"]["tensors"] == 4
    assert s["both"]["wide_over_generic"] == pytest.approx(3.0)
    assert s["of_copy"] == pytest.approx(s["bytes_per_s"] / run.copy_bytes_per_s)
    assert run.copy_bytes_per_s == pytest.approx(2 * run.copy_bytes / (_MS["copy"] / 1e3))
    lines = hd.summary_lines(run)
    assert lines[0].startswith("device: Fake GPU, compute capability 9.0, --kernel wide; ")
    assert "wide/generic 3.0x on the 4 tensors with both kernels" in lines[2]
    assert lines[-1] == ("not served natively, hashed by the NumPy oracle: 1 tensor: "
                         "pos (I32)")


def test_cli_stdout_is_the_oracles(fake, model, capsys):
    fake()
    assert main(["hash", str(model), "--no-progress"]) == 0
    cpu = capsys.readouterr().out
    for k in ("wide", "generic"):
        assert main(["hash", str(model), "--no-progress", "--device", "cuda", "--kernel", k]) == 0
        cap = capsys.readouterr()
        assert cap.out == cpu
        assert "kernel time per output dtype" in cap.err
    assert main(["hash", str(model), "--no-progress", "--json"]) == 0
    cpu_doc = json.loads(capsys.readouterr().out)
    assert main(["hash", str(model), "--no-progress", "--json", "--device", "cuda",
                 "--kernel", "wide", "--out", "f32,f16,bf16"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chained"] == cpu_doc["chained"]
    assert [{k: r[k] for k in ("name", "type", "shape", "hash")} for r in doc["tensors"]] \
        == cpu_doc["tensors"]
    assert [r["kernel"] for r in doc["tensors"]] == [
        "wide", "generic", "wide", "oracle", "wide", "generic", "wide"]
    assert doc["device"]["timing"]["f16"]["wide_over_generic"]["ratio"] == pytest.approx(3.0)


def test_compare_equal_and_planted_fault(fake, model, capsys):
    fake()
    assert main(["hash", str(model), "--no-progress", "--device", "cuda", "--compare"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("compare: all 18 tensor outputs (6 tensors x f32, f16, bf16) "
                              "equal the oracle bit for bit; 1 tensor without a native kernel")
    assert out[-1].startswith("chained (7 tensors, file order, device): f32=")
    fake("value")          # every launch flips bit 0 of its first output element
    assert main(["hash", str(model), "--no-progress", "--device", "cuda", "--compare",
                 "--out", "f16", "--types", "Q8_0"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["emb", "Q8_0", "256x40", "wide", "DIFFERENT"]
    ref = read(model).tensor("emb")
    from strata_ref.dequant import dequant_f16
    first = int(dequant_f16(T.Q8_0, ref.data, 1, 256).view(np.uint16)[0, 0])
    assert out[2] == (f"  emb f16: 1 of 10240 values differ; first at row 0, col 0: "
                      f"device 0x{first ^ 1:04x}, oracle 0x{first:04x}")
    assert out[3] == "compare: 1 of 1 tensor outputs DIFFER from the oracle (1 tensor)"


def test_compare_counts_across_chunks(fake, model):
    fake("value")
    f = read(model)
    run = hd.hash_tensors_device([f.tensor("emb")], ("f32",), kernel="wide", reps=1,
                                 compare=True, chunk_values=256 * 8)
    df = run.tensors[0].diffs["f32"]
    assert (df.count, df.index, df.row, df.col) == (5, 0, 0, 0)   # 40 rows / 8 per chunk
    assert not run.all_equal


@pytest.mark.parametrize("argv, line", [
    (["--kernel", "wide"], "strata-ref: error: --kernel and --compare need --device cuda"),
    (["--compare"], "strata-ref: error: --kernel and --compare need --device cuda"),
])
def test_device_options_need_cuda(model, capsys, argv, line):
    assert main(["hash", str(model), *argv]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [line]


def test_no_gpu_is_one_line(model, capsys, monkeypatch):
    def unavailable(device=None):
        raise loader.NativeUnavailable("no CUDA driver (test)")
    monkeypatch.setattr(loader, "load", unavailable)
    assert main(["hash", str(model), "--device", "cuda"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.splitlines() == [
        "strata-ref: error: hash --device cuda: native path unavailable: no CUDA driver (test)"]


@pytest.mark.parametrize("kw, msg", [
    ({"kernel": "fast"}, "kernel must be one of auto, generic, wide"),
    ({"out_dtypes": ("f64",)}, "out dtypes must be among f32, f16, bf16"),
    ({"reps": 0}, "reps must be in 1..64"),
    ({"reps": 65}, "reps must be in 1..64"),
    ({"chunk_values": 0}, "chunk_values must be >= 1"),
])
def test_bad_arguments(model, kw, msg):
    with pytest.raises(ValueError, match=msg):
        hd.hash_tensors_device(read(model).tensors, **kw)


def test_hasher_error_reaches_the_caller(fake, model, monkeypatch):
    fake()
    import strata_ref.hashing as hashing

    def broken(*a, **k):
        raise RuntimeError("planted hashing failure")
    monkeypatch.setattr(hashing, "fnv1a64", broken)
    with pytest.raises(RuntimeError, match="planted hashing failure"):
        hd.hash_tensors_device(read(model).tensors, ("f32", "f16"), chunk_values=512)

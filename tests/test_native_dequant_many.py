"""`dequant_device_many` (one wide launch for several tensors) on the CPU.

* The argument checks raise before the library is loaded (no GPU needed).
* The wrapper's marshalling is run against a stand-in for the library: real
  cffi structs from the header's cdef, "device memory" in one NumPy byte
  array (pointers are offsets into it), and `strata_dequant_many` /
  `strata_dequant` served by the NumPy oracle behind the checks of
  native/api.cu. The kernels themselves are checked bitwise on a GPU by
  tests/gpu/test_native_gpu.py."""
import numpy as np
import pytest

from strata_ref import dequant as oracle
from strata_ref.native import loader
from strata_ref.native.dequant import policy as dispatch
from strata_ref.native.dequant import wrapper as nd
from strata_ref.native.gemm import wrapper as ng
from strata_ref.native.dequant.parity import make_blocks
from strata_ref.types import GGMLType as T
from strata_ref.types import UnsupportedTypeError, block_format

cffi = pytest.importorskip("cffi")


class Dev:
    """A device array stand-in: pointer, element count, typestr."""

    def __init__(self, ptr, size, typestr, readonly=False):
        self.ptr, self.size, self.typestr, self.readonly = ptr, size, typestr, readonly

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.size,), "typestr": self.typestr, "data": (self.ptr, self.readonly),
                "version": 3, "strides": None}


@pytest.fixture
def no_load(monkeypatch):
    def fail(device=None):
        pytest.fail("the library was loaded before the arguments were checked")
    monkeypatch.setattr(nd, "load", fail)


def _item(t="Q8_0", rows=2, cols=64, ld=None, row0=0, out_ts="<f2", out_size=None,
          blocks_bytes=None, blocks_ts="|u1"):
    fmt = block_format(t)
    nb = (row0 + rows) * cols // fmt.block_values * fmt.block_bytes
    ld_ = cols if ld is None else ld
    return nd.DequantItem(t, Dev(256, nb if blocks_bytes is None else blocks_bytes, blocks_ts),
                          rows, cols, Dev(4096, out_size or rows * ld_, out_ts), row0=row0, ld=ld)


BAD_CALLS = [
    ("not a list", lambda: iter([_item()]), TypeError, "list or tuple"),
    ("empty", lambda: [], ValueError, "empty"),
    ("17 items", lambda: [_item() for _ in range(17)], ValueError, "at most 16"),
    ("not an item", lambda: [_item(), (T.Q8_0, None, 1, 32, None)], TypeError,
     r"items\[1\] must be a DequantItem"),
    ("unknown type", lambda: [_item(), nd.DequantItem("Q9_9", None, 1, 32, None)],
     UnsupportedTypeError, r"items\[1\].*Q9_9"),
    ("removed type", lambda: [nd.DequantItem(4, None, 1, 32, None)], UnsupportedTypeError,
     r"items\[0\]"),
    ("mixed types", lambda: [_item(), _item(), _item("Q4_K", cols=256)], ValueError,
     r"mixed types: items\[0\] is Q8_0, items\[2\] is Q4_K"),
    ("ld < cols", lambda: [_item(), _item("Q8_0", cols=64, ld=32)], ValueError,
     r"items\[1\]: ld=32 < cols=64"),
    ("cols % QK", lambda: [_item("Q4_K", cols=128)], ValueError, "not a multiple of Q4_K's QK=256"),
    ("rows 0", lambda: [_item(rows=0)], ValueError, "must be positive"),
    ("row0 < 0", lambda: [_item(row0=-1)], ValueError, "row0=-1"),
    ("rows not int", lambda: [_item(rows=2.0)], TypeError, r"items\[0\].rows must be an integer"),
    ("blocks short", lambda: [_item(), _item(rows=3, blocks_bytes=34 * 5)], ValueError,
     r"items\[1\].blocks holds 170 bytes"),
    ("blocks dtype", lambda: [_item(blocks_ts="<f4")], TypeError, r"items\[0\].blocks must be a uint8"),
    ("out short", lambda: [_item(rows=4, cols=64, out_size=64 * 3)], ValueError,
     r"items\[0\].out holds 192 values"),
    ("out dtypes differ", lambda: [_item(), _item(out_ts="<f4")], ValueError,
     r"items\[1\].out: out_dtype='f16' does not match"),
    ("out kind", lambda: [_item(out_ts="<i8")], TypeError, r"items\[0\].out: out must hold"),
]


@pytest.mark.parametrize("what,make,exc,match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_before_loading(no_load, what, make, exc, match):
    with pytest.raises(exc, match=match):
        nd.dequant_device_many(make())


def test_bad_kernel_and_dtype_arguments(no_load):
    with pytest.raises(ValueError, match="'auto' or 'wide'"):
        nd.dequant_device_many([_item()], kernel="generic")
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        nd.dequant_device_many([_item()], out_dtype="f64")
    with pytest.raises(ValueError, match="does not match"):
        nd.dequant_device_many([_item()], out_dtype="f32")     # out holds float16
    with pytest.raises(ValueError, match="read-only"):
        it = _item()
        nd.dequant_device_many([nd.DequantItem(it.t, it.blocks, 2, 64, Dev(4096, 128, "<f2", True))])


def test_header_declares_the_entry_and_its_limit():
    text = loader.cdef_text()
    assert "strata_dequant_many" in text and "strata_dequant_item" in text
    ffi = cffi.FFI()
    ffi.cdef(text)
    lib = ffi.dlopen(None)
    assert lib.STRATA_DEQUANT_MANY_MAX == nd.MANY_MAX == 16
    assert lib.STRATA_E_COUNT == 7
    item = ffi.new("strata_dequant_item *")
    item.row0, item.rows, item.cols, item.ld = 1, 2, 256, 264   # fields as the wrapper fills them
    assert (item.row0, item.rows, item.cols, item.ld) == (1, 2, 256, 264)


def test_split_by_type_keeps_order_and_the_limit():
    q8 = [_item() for _ in range(17)]
    q6 = [_item("Q6_K", cols=256) for _ in range(2)]
    groups = nd.split_by_type([q8[0], q6[0]] + q8[1:] + [q6[1]])
    assert [len(g) for g in groups] == [16, 1, 2]
    assert groups[0][0] is q8[0] and groups[1][0] is q8[16] and groups[2] == q6
    with pytest.raises(TypeError, match=r"items\[1\]"):
        nd.split_by_type([q8[0], "Q8_0"])


# ---- the wrapper against a stand-in library ---------------------------------------

class ManyLib:
    """strata_dequant_many / strata_dequant with api.cu's checks, the oracle
    behind them; every call is recorded."""

    def __init__(self, ffi):
        self.ffi = ffi
        self.mem = np.zeros(1 << 22, np.uint8)
        self.top = 256
        self.calls = []

    def alloc(self, nbytes, typestr, offset=0):
        p = self.top + offset
        self.top += (offset + nbytes + 255) // 256 * 256
        return Dev(p, nbytes // int(typestr[2:]), typestr)

    def _ptr(self, p):
        return int(self.ffi.cast("uintptr_t", p))

    def _check(self, t, b, o, row0, rows, cols, ld, wide):
        if b == 0 or o == 0:
            return 3
        fmt = block_format(t)
        if rows <= 0 or cols <= 0 or row0 < 0 or ld < cols or cols % fmt.block_values:
            return 2
        if wide and (cols % 8 or ld % 8 or o % 16 or b % dispatch.WIDE_BLOCKS_ALIGN[t]
                     or (t == T.Q8_0 and ld != cols)):
            return 4
        return 0

    def _run(self, t, b, o, row0, rows, cols, ld, code):
        fmt = block_format(t)
        dt = ("f32", "f16", "bf16")[code]
        u = np.uint32 if dt == "f32" else np.uint16
        row_bytes = cols // fmt.block_values * fmt.block_bytes
        ref = oracle.dequant(t, self.mem[b:b + (row0 + rows) * row_bytes], rows, cols, row0,
                             out_dtype=dt)
        dst = self.mem[o:o + ((rows - 1) * ld + cols) * u().itemsize].view(u)
        for r in range(rows):
            dst[r * ld:r * ld + cols] = ref[r].view(u)

    def strata_dequant_many(self, t, items, count, code, bad, stream):
        bad[0] = -1
        if not 1 <= count <= 16:
            return 7
        t = T(t)
        if t not in dispatch.WIDE_BLOCKS_ALIGN:
            return 1
        args = [(self._ptr(items[i].blocks), self._ptr(items[i].out), items[i].row0,
                 items[i].rows, items[i].cols, items[i].ld) for i in range(count)]
        for i, a in enumerate(args):
            st = self._check(t, *a, wide=True)
            if st:
                bad[0] = i
                return st
        self.calls.append(("many", t, len(args)))
        for a in args:
            self._run(t, *a, code)
        return 0

    def strata_dequant(self, t, b, row0, rows, cols, ld, code, o, kernel, stream):
        t, b, o = T(t), self._ptr(b), self._ptr(o)
        if kernel == 1 and t not in dispatch.WIDE_BLOCKS_ALIGN:
            return 1
        st = self._check(t, b, o, row0, rows, cols, ld, kernel == 1)
        if st:
            return st
        self.calls.append(("single", t, ("generic", "wide")[kernel]))
        self._run(t, b, o, row0, rows, cols, ld, code)
        return 0


@pytest.fixture
def fake(monkeypatch):
    ffi = cffi.FFI()
    ffi.cdef(loader.cdef_text())
    lib = ManyLib(ffi)
    nat = loader.Native(ffi, lib, 90, "<fake>")
    monkeypatch.setattr(nd, "load", lambda device=None: nat)
    monkeypatch.delenv(dispatch.ENV_WIDE, raising=False)
    return lib


def _tensor(lib, t, rows, cols, seed, offset=0):
    fmt = block_format(t)
    raw = make_blocks(t, rows * cols // fmt.block_values, "raw", np.random.default_rng(seed))
    raw = raw.reshape(-1)
    d = lib.alloc(raw.size, "|u1", offset)
    lib.mem[d.ptr:d.ptr + raw.size] = raw
    return raw, d


# (type, rows, cols, row0, ld) per item; Q8_0's wide kernel needs ld == cols
SHAPES = {T.Q8_0: [(3, 64, 0, 64), (2, 96, 1, 96), (1, 32, 4, 32)],
          T.Q4_K: [(3, 256, 0, 264), (2, 512, 2, 512), (1, 256, 5, 272)]}


def _items(lib, t, out_ts="<f2", misalign=None):
    """Items over fresh tensors and one output buffer pre-filled with 0x5A
    (guard bytes between and inside the rows); item `misalign` gets a
    blocks pointer one byte off its kernel's alignment."""
    size = int(out_ts[2:])
    items, raws, total = [], [], 0
    for i, (rows, cols, row0, ld) in enumerate(SHAPES[t]):
        raw, blocks = _tensor(lib, t, row0 + rows, cols, seed=10 + i, offset=1 if i == misalign else 0)
        raws.append(raw)
        items.append((blocks, rows, cols, row0, ld, total))
        total += -(-((rows - 1) * ld + cols + 8) // 8) * 8          # 8 guard elements, 16-byte steps
    out = lib.alloc(total * size, out_ts)
    lib.mem[out.ptr:out.ptr + total * size] = 0x5A
    made = [nd.DequantItem(t.name, b, rows, cols, Dev(out.ptr + off * size, (rows - 1) * ld + cols,
                                                      out_ts), row0=row0, ld=ld)
            for b, rows, cols, row0, ld, off in items]
    return made, raws, out


def _check_outputs(lib, t, items, raws, out, dt):
    u = np.uint32 if dt == "f32" else np.uint16
    whole = lib.mem[out.ptr:out.ptr + out.size * out_itemsize(out)].view(u)
    written = np.zeros(whole.size, bool)
    for it, raw in zip(items, raws):
        ref = oracle.dequant(t, raw, it.rows, it.cols, it.row0, out_dtype=dt).view(u)
        base = (it.out.ptr - out.ptr) // u().itemsize
        for r in range(it.rows):
            got = whole[base + r * it.ld:base + r * it.ld + it.cols]
            assert np.array_equal(got, ref[r]), (t, r)
            written[base + r * it.ld:base + r * it.ld + it.cols] = True
    guard = np.full(1, 0x5A5A5A5A, np.uint32).view(u)[0]
    assert np.all(whole[~written] == guard)


def out_itemsize(d):
    return int(d.typestr[2:])


@pytest.mark.parametrize("dt,ts", [("f16", "<f2"), ("bf16", "<u2"), ("f32", "<f4")])
def test_one_call_serves_every_item(fake, monkeypatch, dt, ts):
    monkeypatch.setenv(dispatch.ENV_WIDE, "1")
    for t in SHAPES:
        items, raws, out = _items(fake, t, ts)
        fake.calls.clear()
        run = nd.dequant_device_many(items, dt)
        assert run.one_launch and run.grouped == (0, 1, 2)
        assert [s.kernel for s in run.selections] == ["wide"] * 3
        assert fake.calls == [("many", t, 3)]
        _check_outputs(fake, t, items, raws, out, dt)


def test_auto_launches_a_failed_guard_alone(fake):
    # Q8_0 is wide by default: item 1's misaligned blocks fail its guard, so
    # it takes the generic kernel in a launch of its own.
    items, raws, out = _items(fake, T.Q8_0, misalign=1)
    run = nd.dequant_device_many(items, "f16")
    assert run.grouped == (0, 2) and not run.one_launch
    assert [s.kernel for s in run.selections] == ["wide", "generic", "wide"]
    assert "items[1]" in run.reason and "2-byte aligned" in run.reason
    assert fake.calls == [("many", T.Q8_0, 2), ("single", T.Q8_0, "generic")]
    _check_outputs(fake, T.Q8_0, items, raws, out, "f16")


def test_auto_follows_the_policy_per_item(fake):
    # On compute capability 9.0 wide Q4_K is off by default: per-tensor generic launches.
    items, raws, out = _items(fake, T.Q4_K)
    run = nd.dequant_device_many(items, "f16")
    assert run.grouped == () and [s.kernel for s in run.selections] == ["generic"] * 3
    assert fake.calls == [("single", T.Q4_K, "generic")] * 3
    _check_outputs(fake, T.Q4_K, items, raws, out, "f16")


def test_forced_wide_refuses_and_launches_nothing(fake):
    items, raws, out = _items(fake, T.Q4_K, misalign=2)
    before = fake.mem.copy()
    run = nd.dequant_device_many(items, "f16", kernel="wide")
    assert run.grouped == () and all(s.kernel is None for s in run.selections)
    assert "items[2]" in run.reason and "8-byte aligned" in run.reason
    assert fake.calls == [] and np.array_equal(fake.mem, before)
    # a type without a wide kernel
    raw, blocks = _tensor(fake, T.Q4_0, 2, 64, seed=3)
    o = fake.alloc(2 * 64 * 2, "<f2")
    run = nd.dequant_device_many([nd.DequantItem("Q4_0", blocks, 2, 64, o)], kernel="wide")
    assert run.selections[0].kernel is None and "no wide kernel" in run.reason
    assert fake.calls == []


def test_a_library_refusal_is_an_error_naming_the_item(fake, monkeypatch):
    monkeypatch.setenv(dispatch.ENV_WIDE, "1")
    items, _, _ = _items(fake, T.Q4_K)

    def refuse(t, arr, count, code, bad, stream):
        bad[0] = 1
        return 4
    monkeypatch.setattr(fake, "strata_dequant_many", refuse)
    with pytest.raises(nd.NativeError, match=r"refused items\[1\]: wide kernel guard failed"):
        nd.dequant_device_many(items)


def test_dequant_weights_f16_places_each_weight_on_16_bytes(fake):
    shapes = [(T.Q8_0, 5, 64), (T.Q6_K, 3, 256), (T.Q8_0, 7, 32), (T.Q8_0, 2, 96)]
    weights, raws = [], []
    for i, (t, n, k) in enumerate(shapes):
        raw, blocks = _tensor(fake, t, n, k, seed=20 + i)
        weights.append((t.name, blocks, n, k))
        raws.append(raw)
    total = sum(-(-n * k // 8) * 8 for _, n, k in shapes)
    scratch = fake.alloc(2 * total, "<f2")
    res = ng.dequant_weights_f16(weights, scratch, kernel="auto")
    offs = [v.ptr - scratch.ptr for v in res.views]
    assert offs == [0, 2 * 320, 2 * (320 + 768), 2 * (320 + 768 + 224)]
    assert [len(r.grouped) for r in res.runs] == [3, 0]     # Q8_0 together; Q6_K generic at cc 9.0
    assert fake.calls[0] == ("many", T.Q8_0, 3)
    for v, raw, (t, n, k) in zip(res.views, raws, shapes):
        assert v.size == n * k
        got = fake.mem[v.ptr:v.ptr + 2 * n * k].view(np.uint16)
        assert np.array_equal(got, oracle.dequant_f16(t, raw, n, k).view(np.uint16).reshape(-1))
    with pytest.raises(ValueError, match="scratch holds"):
        ng.dequant_weights_f16(weights, Dev(scratch.ptr, total - 1, "<f2"))
    # forced wide on a scratch 2 bytes off 16: every output fails the guard
    odd = fake.alloc(2 * total + 16, "<f2", offset=0)
    fake.calls.clear()
    with pytest.raises(ValueError, match=r"weights\[0\] \(Q8_0\).*16-byte aligned"):
        ng.dequant_weights_f16(weights, Dev(odd.ptr + 2, total, "<f2"), kernel="wide")
    assert fake.calls == []


# ---- the C checks of strata_dequant_many, without a GPU --------------------------

def test_c_entry_refuses_before_any_cuda_call(tmp_path, monkeypatch):
    """Builds the real library (nvcc, 10-60 s on 2 cores) and calls its
    refusal paths: they return before any CUDA call, so no GPU is needed
    (the CUDA runtime is linked statically and starts lazily). Pointers are
    made-up addresses, never dereferenced."""
    import re
    import subprocess
    from strata_ref.native import build
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    archs = re.findall(r"compute_(\d+)", subprocess.run([nvcc, "--list-gpu-arch"],
                                                        capture_output=True, text=True).stdout)
    monkeypatch.setenv("STRATA_REF_CACHE", str(tmp_path))
    path = build.build(build.DEQUANT, min(int(a) for a in archs))
    ffi = cffi.FFI()
    ffi.cdef(loader.cdef_text())
    lib = ffi.dlopen(str(path))
    items = ffi.new("strata_dequant_item[]", 17)

    def fill(cols=256, ld=256):
        for i in range(17):
            items[i].blocks = ffi.cast("void *", 0x100000 * (i + 1))
            items[i].out = ffi.cast("void *", 0x8000000 + 0x100000 * i)
            items[i].row0, items[i].rows, items[i].cols, items[i].ld = 0, 2, cols, ld
    bad = ffi.new("int *")

    def call(t, n, dtype=1, arr=items):
        bad[0] = 99
        return lib.strata_dequant_many(int(t), arr, n, dtype, bad, ffi.NULL), bad[0]

    fill()
    assert call(T.Q4_K, 17) == (7, -1) and call(T.Q4_K, 0) == (7, -1)   # STRATA_E_COUNT
    assert call(T.Q4_K, 2, dtype=3) == (5, -1)                         # STRATA_E_ARG
    assert call(T.Q4_0, 2) == (1, -1)                                  # no wide kernel
    assert call(T.Q4_K, 2, arr=ffi.NULL) == (3, -1)
    items[3].ld = 260
    assert call(T.Q4_K, 5) == (4, 3)                                   # ld % 8
    items[3].ld = 248
    assert call(T.Q4_K, 5) == (2, 3)                                   # ld < cols
    fill()
    items[2].cols = 300
    assert call(T.Q4_K, 5) == (2, 2)                                   # cols % QK
    fill()
    items[4].blocks = ffi.cast("void *", 0x500004)
    assert call(T.Q4_K, 5) == (4, 4)                                   # blocks 8-byte alignment
    items[1].out = ffi.NULL
    assert call(T.Q4_K, 5) == (3, 1)                                   # first failing item wins
    items[1].out = ffi.cast("void *", 0x8100008)
    assert call(T.Q4_K, 2) == (4, 1)                                   # out 16-byte alignment
    fill(cols=64, ld=64)
    items[6].ld = 72
    assert call(T.Q8_0, 7) == (4, 6)                                   # Q8_0 needs ld == cols
    # the single call agrees
    assert lib.strata_dequant(int(T.Q8_0), items[6].blocks, 0, 2, 64, 72, 1, items[6].out, 1,
                              ffi.NULL) == 4
    # strata_dequant_timed checks everything before it launches or times anything
    ms = ffi.new("float[]", 64)
    blk, out = ffi.cast("void *", 0x100000), ffi.cast("void *", 0x8000000)
    flush = ffi.cast("void *", 0x9000000)

    def timed(t=T.Q4_K, cols=256, ld=256, kernel=1, reps=3, fl=flush, nflush=1 << 20, msp=ms):
        return lib.strata_dequant_timed(int(t), blk, 0, 2, cols, ld, 1, out, kernel, fl, nflush,
                                        reps, msp, ffi.NULL)
    assert timed(T.Q4_0) == 1                                          # no wide Q4_0
    assert timed(kernel=2) == 5                                        # unknown kernel kind
    assert timed(cols=300) == 2 and timed(ld=260) == 4
    assert timed(msp=ffi.NULL) == 3
    assert timed(reps=0) == 7 and timed(reps=65) == 7                  # STRATA_E_COUNT
    assert timed(fl=ffi.cast("void *", 0x9000008)) == 5                # flush not 16-aligned
    assert timed(fl=ffi.NULL) == 5 and timed(nflush=-1) == 5

"""The CPU kernels read no byte outside the arrays they are given.

The stored-block kernels read weights and activations through raw vector
loads (`cpu.simd`, `cpu.lanes`), which numba's bounds checking does not
see. Here every weight tensor and every activation handed to a mat-mul is
copied to the end (or the start) of a page whose neighbour is made
inaccessible (mprotect PROT_NONE): a read of one byte past the tensor, or
before it, is a segmentation fault in the test's child process instead of
a silent read of whatever lies there. The MoE expert check of issue 29
(`strata-ref experts` on a tiny qwen3moe, activations of 1, 2, 3 and 11
rows, expert 0 among the routed ones) and a tiny dense model's prompt and
decode run this way on every profile.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from infer_helpers import PROFILES

_CHILD = textwrap.dedent('''
    import ctypes, mmap, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    from infer_helpers import tiny_model, tiny_moe_model
    libc = ctypes.CDLL(None)
    PAGE = mmap.PAGESIZE
    keep = []

    def guarded(a, tail):
        a = np.ascontiguousarray(a)
        pages = max(1, -(-a.nbytes // PAGE))
        m = mmap.mmap(-1, (pages + 2) * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        for off in (0, (pages + 1) * PAGE):
            assert libc.mprotect(ctypes.c_void_p(base + off), PAGE, 0) == 0
        start = PAGE + (pages * PAGE - a.nbytes if tail else 0)
        out = np.frombuffer(m, np.uint8, count=a.nbytes, offset=start).view(a.dtype).reshape(a.shape)
        out[...] = a
        keep.append(m)
        return out

    import strata_ref.cpu.matmul as mm
    TAIL = {tail!r}
    init, matmul = mm.QMatrix.__init__, mm.QMatrix.matmul

    def g_init(self, t, raw, rows, cols, name="", profile=None):
        init(self, t, raw, rows, cols, name, profile)
        self.raw = guarded(self.raw, TAIL)

    def g_matmul(self, x, mmid=False):
        return matmul(self, guarded(np.ascontiguousarray(x, np.float32), TAIL), mmid)

    mm.QMatrix.__init__, mm.QMatrix.matmul = g_init, g_matmul
    from strata_ref.infer import load
    from strata_ref.infer.expert_check import check_experts
    d = sys.argv[1]
    tiny_moe_model("qwen3moe", d + "/moe.gguf")
    m = load(d + "/moe.gguf", cpu={profile!r})
    rng = np.random.default_rng(0)
    for rows, scale in ((1, 1.0), (2, 1.0), (3, 1.0), (3, 0.02), (11, 1.0)):
        x = (np.random.default_rng(0).standard_normal((rows, 256)) * scale).astype(np.float32)
        for layer in range(m.hp.n_layer):
            c = check_experts(m, layer, x=x)
            assert np.isfinite(c.cpu).all()
    tiny_model("qwen3", d + "/dense.gguf")
    m = load(d + "/dense.gguf", cpu={profile!r})
    cache = m.new_cache(16)
    ids = [int(i) for i in rng.integers(0, m.n_vocab, 9)]
    m.forward(ids[:6], cache, all_logits=True)
    for i in ids[6:]:
        m.forward([i], cache)
    print("ok")
''')


@pytest.mark.slow
@pytest.mark.parametrize("tail", [True, False], ids=["after", "before"])
@pytest.mark.parametrize("profile", PROFILES)
def test_kernels_read_inside_their_arrays(profile, tail, tmp_path):
    from pathlib import Path
    code = _CHILD.format(tests=str(Path(__file__).parent), tail=tail, profile=profile)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0 and r.stdout.split()[-1:] == ["ok"], (r.returncode, r.stderr[-2000:])

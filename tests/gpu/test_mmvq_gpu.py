"""Native q8_1 mat-vec and expert kernels on a real GPU (skipped without
one, or without nvcc and cffi): the quick parity suites and refusals."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nat():
    from strata_ref.native.loader import NativeUnavailable
    from strata_ref.native.mmvq import load_mmvq
    try:
        return load_mmvq()
    except (NativeUnavailable, ImportError) as e:
        pytest.skip(f"native mat-vec unavailable: {e}")


def test_quick_mmvq_parity_is_bitwise(nat):
    from strata_ref.native.mmvq_parity import run_parity_mmvq
    lines = []
    assert run_parity_mmvq(quick=True, out=lines.append) == 0, "\n".join(lines)
    assert lines[-1].startswith("mmvq parity: OK")


def test_quick_experts_parity_is_bitwise(nat):
    from strata_ref.native.mmvq_parity import run_parity_experts
    lines = []
    assert run_parity_experts(quick=True, out=lines.append) == 0, "\n".join(lines)


def test_refusals_launch_nothing(nat):
    from strata_ref.types import GGMLType
    f, lib = nat.ffi, nat.lib
    y = nat.alloc(64)
    w = nat.alloc(144)
    q = nat.alloc(36 * 8)
    yp = f.cast("float *", y.ptr)
    assert lib.smv_mmvq(int(GGMLType.TQ2_0), w.ptr, 1, 256, q.ptr, 1, yp, 0, f.NULL) == 1
    assert lib.smv_mmvq(int(GGMLType.Q4_K), w.ptr, 1, 224, q.ptr, 1, yp, 0, f.NULL) == 2
    assert lib.smv_mmvq(int(GGMLType.Q4_K), w.ptr, 1, 256, q.ptr, 9, yp, 0, f.NULL) == 5
    assert lib.smv_mmvq(int(GGMLType.Q4_K), w.ptr, 1, 256, q.ptr, 1, yp, 3, f.NULL) == 5
    assert lib.smv_mmvq(int(GGMLType.Q4_K), f.NULL, 1, 256, q.ptr, 1, yp, 0, f.NULL) == 3
    assert lib.smv_quantize_q8_1(yp, q.ptr, 33, f.NULL) == 2
    assert lib.smv_set_plain_kernel(4) == 5 and lib.smv_set_plain_kernel(-1) == 5
    assert lib.smv_set_plain_kernel(0) == 0

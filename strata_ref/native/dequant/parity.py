"""`strata-ref parity dequant`: the native kernels against the NumPy oracle, bitwise.

For every type the oracle dequantizes (plus the plain F32/F16/BF16), each
output dtype (f32, f16, bf16), each kernel forced in turn (generic; wide
where the type has one), and two block sets (sane: random bytes with finite
scales; raw: uniform random bytes, so NaN/Inf scales, every E8M0/UE4M3
byte), it runs these cases against `strata_ref.dequant` of the same bytes:

* full      row0 = 0, all rows, ld = cols
* padded    row0 = 0, all rows, ld = cols + 64
* slice     row0 = R/3, R/2 rows, ld = cols
* tail      the last row alone, ld = cols + 64
* misalign  the blocks copied to an odd address: the generic kernel must
            still match; a wide kernel must refuse (status, nothing written)

A wide Q8_0 call with ld != cols must likewise refuse. Every output sits in a
buffer of guard bytes (64 elements before and after, and the [cols, ld)
padding of each row); any changed guard byte fails the case. Comparisons are
of the raw bits (uint32/uint16 views); NaNs are canonical on both sides by
contract (../shared/DESIGN.md), so no NaN is excused.

Then the elementwise f32 -> bf16 / f32 -> f16 conversions on 4,096 bit
patterns (specials first, then random) against strata_ref.numerics, and a
hand-made 2-block Q8_0 case (a NaN scale 0x7E00 and d = 1.0) to bf16.

Prints one line per case (values compared, mismatches, guard failures) and a
total; returns 0 only if every case matched (the exit status of the command).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ... import synth
from ...types import GGMLType, block_format

__all__ = ["run_parity_dequant", "make_blocks", "ELEMENTWISE_SPECIALS"]

T = GGMLType
GUARD = 64                 # guard elements before and after each output
GUARD_BYTE = 0xA5
PAD = 64                   # extra ld of the padded cases
_UINT = {"f32": np.uint32, "f16": np.uint16, "bf16": np.uint16}
_HOST = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def make_blocks(t: GGMLType, n_blocks: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """(n_blocks, B) uint8 blocks of type t (`strata_ref.synth.blocks`).
    kind "raw": uniform random bytes. kind "sane": random bytes, then every
    scale from synth's "valid" range: fp16 scales finite (half with exponent
    field 5-9, Strata's 'sane' scales, half over the whole finite range), f32
    / bf16 finite, MXFP4's E8M0 byte != 0xFF (e = 0 and 1 included, so f32
    subnormals appear), NVFP4 scale bytes 0..0x7E, and the IQ1_M fp16 scale
    that its four scale words carry in their top nibbles finite."""
    return synth.blocks(t, n_blocks, rng, None if kind == "raw" else "valid")


# f32 bit patterns tried first by the elementwise conversions: zeros,
# subnormals, f16 and bf16 rounding boundaries and ties, overflow, infinities
# and NaNs with payloads and signs.
ELEMENTWISE_SPECIALS = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000, 0xBF800000,
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FFFFFFF, 0x7FC00000, 0xFFC00000,
    0x7F800001, 0xFF812345, 0x7FBFFFFF,
    0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000,     # 65504, below/at 65520
    0x33000000, 0x33000001, 0xB3000000, 0x33800000,     # 2^-25 (tie to 0), just above, 2^-24
    0x38800000, 0x387FE000, 0x387FF000,                 # f16 normal/subnormal border
    0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,     # bf16 ties (even, odd), around
    0x7F7F8000, 0x7F7F7FFF, 0x3DCCCCCD, 0x40490FDB,     # bf16 carry into Inf, 0.1, pi
], dtype=np.uint32)


@dataclass
class _Tally:
    compared: int = 0
    mismatches: int = 0
    guard: int = 0
    refusals: int = 0
    failed_cases: list = field(default_factory=list)

    def add(self, line: str, compared: int, mism: int, guard: int, out) -> None:
        self.compared += compared
        self.mismatches += mism
        self.guard += guard
        ok = mism == 0 and guard == 0
        if not ok:
            self.failed_cases.append(line)
        out(f"{line}: {compared} values, {mism} mismatches, {guard} guard"
            + ("" if ok else "   <-- FAIL"))


class _Runner:
    def __init__(self, out):
        from . import wrapper as nd
        from ..loader import load
        self.nd = nd
        self.nat = load()
        self.out = out
        self.tally = _Tally()

    def _buffer(self, dtype: str, rows: int, ld: int):
        n = GUARD + rows * ld + GUARD
        buf = self.nd.DeviceBuffer(n, _UINT[dtype])
        buf.fill_bytes(GUARD_BYTE)
        return buf

    def _written_mask(self, rows: int, cols: int, ld: int) -> np.ndarray:
        m = np.zeros(GUARD + rows * ld + GUARD, bool)
        body = m[GUARD:GUARD + rows * ld].reshape(rows, ld)
        body[:, :cols] = True
        return m

    def case(self, label: str, t, blocks_dev, expect: np.ndarray | None, row0: int,
             rows: int, cols: int, ld: int, dtype: str, kernel: str) -> None:
        """Run one call; expect None means the kernel must refuse."""
        buf = self._buffer(dtype, rows, ld)
        u = _UINT[dtype]
        view = buf.view(GUARD * np.dtype(u).itemsize, rows * ld, u)
        sel = self.nd.dequant_device(t, blocks_dev, rows, cols, view, row0=row0, ld=ld,
                                     out_dtype=dtype, kernel=kernel)
        self.nat.lib.strata_synchronize()
        got = buf.download()
        guard_word = np.full(1, GUARD_BYTE, np.uint8).repeat(np.dtype(u).itemsize).view(u)[0]
        mask = self._written_mask(rows, cols, ld)
        line = f"{label:<34} {kernel:<7} row0={row0:<4} rows={rows:<4} ld={ld:<5}"
        if expect is None:
            refused = sel.kernel is None
            bad = int(np.count_nonzero(got != guard_word))
            self.tally.refusals += 1
            self.tally.add(line + (" refused" if refused else " NOT refused"), 0,
                           0 if refused else 1, bad, self.out)
            return
        if sel.kernel is None:
            self.tally.add(line + f" not run ({sel.reason})", 0, rows * cols, 0, self.out)
            return
        vals = got[mask].reshape(rows, cols)
        mism = int(np.count_nonzero(vals != expect.view(u)))
        bad = int(np.count_nonzero(got[~mask] != guard_word))
        self.tally.add(line, rows * cols, mism, bad, self.out)


def _oracle(t, blocks: np.ndarray, rows: int, cols: int, dtype: str) -> np.ndarray:
    from ... import dequant as oracle
    res = oracle.dequant(t, blocks.reshape(-1), rows, cols, out_dtype=dtype)
    return np.ascontiguousarray(res).view(_UINT[dtype])


def _type_cases(run: _Runner, t: GGMLType, R: int, C: int, rng, wide_types) -> None:
    fmt = block_format(t)
    nd = run.nd
    n_blocks = R * C // fmt.block_values
    kernels = ["generic"] + (["wide"] if t in wide_types else [])
    for kind in ("sane", "raw"):
        blocks = make_blocks(t, n_blocks, kind, rng).reshape(-1)
        dev = nd.DeviceBuffer(blocks.size, np.uint8)
        dev.upload(blocks)
        odd = nd.DeviceBuffer(blocks.size + 16, np.uint8)
        odd.upload(blocks, offset_bytes=1)
        odd_view = odd.view(1, blocks.size, np.uint8)
        for dtype in ("f32", "f16", "bf16"):
            ref = _oracle(t, blocks, R, C, dtype)
            r0, rn = R // 3, max(R // 2, 1)
            for kernel in kernels:
                lab = f"{fmt.name:<8} {kind:<4} {dtype:<4}"
                dense_only = kernel == "wide" and t == T.Q8_0
                run.case(lab + " full", t, dev, ref, 0, R, C, C, dtype, kernel)
                run.case(lab + " padded", t, dev, None if dense_only else ref, 0, R, C,
                         C + PAD, dtype, kernel)
                run.case(lab + " slice", t, dev, ref[r0:r0 + rn], r0, rn, C, C, dtype, kernel)
                run.case(lab + " tail", t, dev, None if dense_only else ref[R - 1:], R - 1, 1,
                         C, C + PAD, dtype, kernel)
                run.case(lab + " misalign", t, odd_view, None if kernel == "wide" else ref,
                         0, R, C, C, dtype, kernel)


def _plain_cases(run: _Runner, t: GGMLType, rng, quick: bool) -> None:
    """F32/F16/BF16: one-value types, including cols that are not a multiple
    of 32 (the generic kernel's partial last group)."""
    for R, C in ((8, 1000), (3, 37)) if quick else ((256, 4096), (64, 1000), (5, 37)):
        _type_cases(run, t, R, C, rng, wide_types=())


def _elementwise(run: _Runner, rng, quick: bool) -> None:
    from ... import numerics
    n_random = 4096 - ELEMENTWISE_SPECIALS.size
    sets = [("elementwise 4096 patterns", np.concatenate(
        [ELEMENTWISE_SPECIALS, rng.integers(0, 2**32, n_random, dtype=np.uint32)]))]
    if not quick:
        sets.append(("elementwise random 2^22", rng.integers(0, 2**32, 1 << 22, dtype=np.uint32)))
    nd = run.nd
    for name, bits in sets:
        src = nd.DeviceBuffer(bits.size, np.float32)
        src.upload(bits)
        x = bits.view(np.float32)
        for conv, fn, ref in (("f32->bf16", nd.f32_to_bf16_device, numerics.f32_to_bf16_bits(x)),
                              ("f32->f16", nd.f32_to_f16_device, numerics.f32_to_f16_bits(x))):
            dst = nd.DeviceBuffer(bits.size + 2 * GUARD, np.uint16)
            dst.fill_bytes(GUARD_BYTE)
            fn(src, dst.view(2 * GUARD, bits.size, np.uint16))
            run.nat.lib.strata_synchronize()
            got = dst.download()
            mism = int(np.count_nonzero(got[GUARD:GUARD + bits.size] != ref.astype(np.uint16)))
            g = np.concatenate([got[:GUARD], got[GUARD + bits.size:]])
            bad = int(np.count_nonzero(g != np.uint16(GUARD_BYTE * 0x101)))
            run.tally.add(f"{name:<28} {conv}", bits.size, mism, bad, run.out)


def _q8_0_nan_case(run: _Runner) -> None:
    """Two Q8_0 blocks, qs = -16..15: d = 0x7E00 (NaN) must give the bf16
    canonical NaN 0x7FFF everywhere; d = 1.0 must give each integer's bf16,
    which is its f32 bit pattern's top half (all are exact in bf16)."""
    qs = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    blk = np.zeros((2, 34), np.uint8)
    blk[0, :2] = (0x00, 0x7E)
    blk[1, :2] = (0x00, 0x3C)
    blk[:, 2:] = qs
    expect = np.empty((2, 32), np.uint16)
    expect[0] = 0x7FFF
    expect[1] = (np.arange(-16, 16, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    dev = run.nd.DeviceBuffer(blk.size, np.uint8)
    dev.upload(blk.reshape(-1))
    for kernel in ("generic", "wide"):
        run.case("Q8_0 NaN-scale / d=1 bf16", T.Q8_0, dev, expect, 0, 2, 32, 32, "bf16", kernel)


def run_parity_dequant(quick: bool = False, *, seed: int = 20261130, types=None,
                       out=print) -> int:
    """Run the dequant parity suite on the local GPU; return the exit status
    (0: every value and guard matched; 1: a mismatch, guard failure or
    missing kernel; 2: no native path here). quick: small tensors, for
    tests/gpu. types: restrict to these GGMLTypes (default: every type the
    oracle dequantizes, plus F32, F16 and BF16)."""
    from ...formats import dequant_types
    from ..loader import NativeUnavailable, unavailable_line
    from .policy import GENERIC_TYPES, WIDE_BLOCKS_ALIGN
    try:
        run = _Runner(out)
    except NativeUnavailable as e:
        print(unavailable_line("parity dequant", e), file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    out(f"parity dequant: library {run.nat.path} (compute capability {run.nat.cc}), "
        f"{'quick' if quick else 'full'} run, seed {seed}")
    R, C = (16, 512) if quick else (384, 2560)
    todo = list(types) if types is not None else [T.F32, T.F16, T.BF16, *dequant_types()]
    missing = [t for t in todo if t not in GENERIC_TYPES]
    for t in missing:
        run.tally.add(f"{t.name}: no generic kernel", 0, 1, 0, out)
    _elementwise(run, rng, quick)
    _q8_0_nan_case(run)
    for t in todo:
        if t in missing:
            continue
        if not block_format(t).quantized:
            _plain_cases(run, t, rng, quick)
        else:
            _type_cases(run, t, R, C, rng, WIDE_BLOCKS_ALIGN)
    tl = run.tally
    ok = tl.mismatches == 0 and tl.guard == 0 and not tl.failed_cases
    out(f"parity dequant: {tl.compared} values compared, {tl.mismatches} mismatches, "
        f"{tl.guard} guard failures, {tl.refusals} refusals checked, "
        f"{len(tl.failed_cases)} failed cases, {time.perf_counter() - t0:.1f} s")
    out("parity dequant: OK" if ok else "parity dequant: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":   # python -m strata_ref.native.dequant.parity [--quick]
    sys.exit(run_parity_dequant(quick="--quick" in sys.argv[1:]))

// Shared device helpers: byte readers, scalar conversions, output stores.
//
// Conversion rules: ../shared/DESIGN.md "The arithmetic contract" and
// spec/formats.md §4. Everything is plain CUDA (no sm_90-only feature), so a
// CUDA 12 toolkit can build it for compute capability 6.1 and 7.0 too; it is
// compiled without --use_fast_math (ftz=false, IEEE division): MXFP4 produces
// f32 subnormals that flush-to-zero would destroy.
//
// The per-value code (readers, f16 widening, the Fmt<T>/Wide* formulas) also
// compiles as plain C++ without CUDA: host_check.cpp builds it with a host
// compiler so that CI, which has no GPU, checks the kernels' formulas against
// the NumPy oracle bit for bit.
#pragma once

#include <stdint.h>

#include "strata_blocks.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include <math.h>
#include <string.h>
#define __device__
#define __host__
#define __forceinline__ inline
struct uint2 { unsigned x, y; };
#endif

namespace strata {

// The ggml type ids (enum GgmlType, T_Q4_K = 12, ...), the block structs and
// Block<T> (QK, B, field offsets o_<name>) come from strata_blocks.h,
// generated from strata_ref/types.py by tools/gen_block_header.py.

enum OutDtype { OUT_F32 = 0, OUT_F16 = 1, OUT_BF16 = 2 };

// ---- little-endian readers; byte loads, so any alignment is legal --------
__device__ __forceinline__ uint32_t rd_u8(const uint8_t *p) { return p[0]; }
__device__ __forceinline__ int32_t rd_i8(const uint8_t *p) { return (int32_t)(int8_t)p[0]; }
__device__ __forceinline__ uint32_t rd_u16(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}
__device__ __forceinline__ uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

// Bit casts and the correctly rounded f32 operations. On the device the
// explicit __f*_rn intrinsics keep nvcc from contracting; the host check is
// built with -ffp-contract=off.
#ifdef __CUDACC__
__device__ __forceinline__ float as_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t as_u32(float v) { return __float_as_uint(v); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
inline float as_f32(uint32_t u) { float v; memcpy(&v, &u, 4); return v; }
inline uint32_t as_u32(float v) { uint32_t u; memcpy(&u, &v, 4); return u; }
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float fma_rn(float a, float b, float c) { return fmaf(a, b, c); }
#endif

// Byte permute (CUDA __byte_perm with selector nibbles < 8): byte k of the
// result is byte (s >> 4k) & 7 of the 8-byte value y:x.
#ifdef __CUDACC__
__device__ __forceinline__ uint32_t perm(uint32_t x, uint32_t y, uint32_t s) {
    return __byte_perm(x, y, s);
}
#else
inline uint32_t perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) r |= (uint32_t)((v >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k);
    return r;
}
#endif

// Bits [shift, shift + 32) of the 64-bit value hi:lo, shift < 32.
__device__ __forceinline__ uint32_t funnel_r(uint32_t lo, uint32_t hi, uint32_t shift) {
#ifdef __CUDA_ARCH__
    return __funnelshift_r(lo, hi, shift);
#else
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (shift & 31));
#endif
}

// 8 bytes at a 2-byte aligned address p, as two little-endian u32 words,
// from three aligned u32 loads (p rounded down to 4; the caller guarantees
// that the 12 bytes from there are inside the buffer).
__device__ __forceinline__ uint2 load8_align2(const uint8_t *p) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(reinterpret_cast<uintptr_t>(p) & ~(uintptr_t)3);
    const uint32_t shift = (uint32_t)(reinterpret_cast<uintptr_t>(p) & 2) * 8;
    const uint32_t a = w[0], b = w[1], c = w[2];
    uint2 r;
    r.x = funnel_r(a, b, shift);
    r.y = funnel_r(b, c, shift);
    return r;
}

// The small integer (byte k of w) − bias as f32, without an int-to-float
// conversion instruction: the bits 0x4B000000 | u are the float 2^23 + u, and
// subtracting 2^23 + bias is exact for u < 2^23 (so (float)0 stays +0).
// Same value as (float)(u − bias); the wide kernels use it because I2F runs
// at a quarter of the FP32 rate.
__device__ __forceinline__ float byte_minus(uint32_t w, int k, float two23_plus_bias) {
    return sub(as_f32(perm(w, 0x4B000000u, 0x7540u | (uint32_t)k)), two23_plus_bias);
}

// Division of 32-bit n by an invariant divisor d >= 2 with a multiply-high
// (Granlund & Montgomery 1994, "round-up" method): with l = ceil(log2 d) and
// m = floor(2^32·(2^l − d)/d) + 1, n / d = (t + ((n − t) >> 1)) >> (l − 1)
// for t = mulhi(m, n), exact for every 32-bit n. host_check's "divcheck"
// mode compares it with '/'.
struct FastDiv {
    uint32_t d, m, s;   // divisor, magic, l − 1
};
inline FastDiv make_fast_div(uint32_t d) {
    uint32_t l = 0;
    while ((1ull << l) < d) ++l;
    const uint64_t m = ((1ull << 32) * ((1ull << l) - d)) / d + 1;
    return FastDiv{d, (uint32_t)m, l - 1};
}
__device__ __forceinline__ uint32_t mulhi32(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}
__device__ __forceinline__ uint32_t fast_div(uint32_t n, FastDiv f) {
    const uint32_t t = mulhi32(f.m, n);
    return (t + ((n - t) >> 1)) >> f.s;
}

// fp16 bits -> f32. Exact for every non-NaN half (formats.md §4); a NaN
// scale only ever yields NaN outputs, which the stores canonicalise.
#ifdef __CUDACC__
__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    return __half2float(__ushort_as_half((unsigned short)h));
}
#else
inline float f16_to_f32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return as_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e != 0) return as_f32(sign | ((e + 112) << 23) | (m << 13));
    const float v = (float)m * as_f32(0x33800000u);   // m · 2^-24, exact
    return sign ? -v : v;
}
#endif
__device__ __forceinline__ float rd_f16(const uint8_t *p) { return f16_to_f32(rd_u16(p)); }

// ---- output conversions ----------------------------------------------------
// Every NaN output is the canonical NaN (f32 0x7FFFFFFF, f16/bf16 0x7FFF).
// The H200's arithmetic already returns 0x7FFFFFFF, but the rule is applied
// here explicitly so that no architecture or toolkit detail can change it.
__device__ __forceinline__ uint32_t out_f32_bits(float v) {
    return v != v ? 0x7FFFFFFFu : as_u32(v);
}
#ifdef __CUDACC__
__device__ __forceinline__ uint16_t out_f16_bits(float v) {
    return v != v ? (uint16_t)0x7FFF : __half_as_ushort(__float2half_rn(v));
}
// ggml_compute_fp32_to_bf16 (ggml-impl.h), in software: NaN keeps its top
// payload with the quiet bit forced; anything else rounds to nearest-even on
// bit 16, carrying into ±Inf.
__device__ __forceinline__ uint16_t bf16_bits_ggml(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ uint16_t out_bf16_bits(float v) {
    return bf16_bits_ggml(out_f32_bits(v));
}

// Eight outputs whose NaNs are already canonical (the wide kernels check
// their scales once per chunk and canonicalise only when a scale is not
// finite). A canonical f32 NaN narrows to 0x7FFF both under payload
// truncation and under hardware NaN canonicalisation, and under ggml's bf16
// rule, so the pair conversions need no NaN test of their own.
// STREAM selects evict-first stores (st.global.cs): the output is not read
// again by this kernel.
template <bool STREAM>
__device__ __forceinline__ void store16(void *p, uint4 v) {
    if (STREAM)
        __stcs(reinterpret_cast<uint4 *>(p), v);
    else
        *reinterpret_cast<uint4 *>(p) = v;
}

template <int OUT, bool STREAM = false>
__device__ __forceinline__ void store8_canonical(void *out, long long idx, const float *y) {
    if constexpr (OUT == OUT_F32) {
        float *p = static_cast<float *>(out) + idx;
        store16<STREAM>(p, make_uint4(as_u32(y[0]), as_u32(y[1]), as_u32(y[2]), as_u32(y[3])));
        store16<STREAM>(p + 4, make_uint4(as_u32(y[4]), as_u32(y[5]), as_u32(y[6]), as_u32(y[7])));
    } else {
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if constexpr (OUT == OUT_F16) {
                const __half2 v = __floats2half2_rn(y[2 * k], y[2 * k + 1]);   // RNE, as __float2half_rn
                h[k] = *reinterpret_cast<const uint32_t *>(&v);
            } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
                // Hardware RNE (cvt.rn.bf16x2.f32): ggml's rule for every non-NaN value,
                // subnormals kept and overflow to ±Inf included.
                const __nv_bfloat162 v = __floats2bfloat162_rn(y[2 * k], y[2 * k + 1]);
                h[k] = *reinterpret_cast<const uint32_t *>(&v);
#else
                h[k] = (uint32_t)bf16_bits_ggml(as_u32(y[2 * k])) |
                       ((uint32_t)bf16_bits_ggml(as_u32(y[2 * k + 1])) << 16);
#endif
            }
        }
        store16<STREAM>(static_cast<uint16_t *>(out) + idx, make_uint4(h[0], h[1], h[2], h[3]));
    }
}

// One scalar store of output element idx, dtype chosen at run time.
__device__ __forceinline__ void store1(void *out, int out_dtype, long long idx, float v) {
    if (out_dtype == OUT_F32)
        static_cast<uint32_t *>(out)[idx] = out_f32_bits(v);
    else if (out_dtype == OUT_F16)
        static_cast<uint16_t *>(out)[idx] = out_f16_bits(v);
    else
        static_cast<uint16_t *>(out)[idx] = out_bf16_bits(v);
}

#endif  // __CUDACC__

// Q4_K / Q5_K packed 6-bit scale and min of group j (ggml get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(const uint8_t *q, int j, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

}  // namespace strata

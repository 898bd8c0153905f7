// Wide kernels' per-chunk formulas: values 8c … 8c+7 of the block at b, one
// struct per type (spec/kernels.md §4). Each value keeps its formats.md §5
// expression; only the thread partition and the instruction choice differ
// from strata_formats.cuh:
// * small integers become floats through byte_minus (exactly the same value
//   as the int-to-float conversion, without the quarter-rate I2F);
// * Q4_K/Q5_K use one fused d1·q − m1 (__fmaf_rn): d1·q is exact
//   (formats.md §6), so the fused and the separate operations round once, at
//   the same place, also for signed zeros;
// * chunk() returns whether the chunk's scales are finite. With finite
//   scales no output can be NaN (|q·scale| stays far below FLT_MAX), so
//   the kernel canonicalises NaNs only when a scale is not finite.
// Plain C++ as well, for host_check.cpp.
#pragma once

#include "strata_common.cuh"

namespace strata {

__device__ __forceinline__ bool finite_f32(float v) {
    return (as_u32(v) & 0x7F800000u) != 0x7F800000u;
}

// Q8_0 (34 bytes, 4 chunks): d at byte 0, the chunk's 8 quants as four u16
// loads at 2 + 8c (legal: blocks are 2-byte aligned). y = (float)q * d.
struct WideQ8_0 {
    static constexpr bool KV = false;
    static constexpr int CPT = 2;   // chunks per thread, f16/bf16 outputs (measured, docs/native.md)
    static constexpr int QK = 32, B = 34;
    static __device__ __forceinline__ bool chunk(const uint8_t *b, int c, const float *, float *y) {
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d = f16_to_f32(h[0]);
        // q + 128 = byte ^ 0x80, so (float)q = byte_minus(.., 2^23 + 128)
        const uint32_t w0 = ((uint32_t)h[1 + 4 * c] | ((uint32_t)h[2 + 4 * c] << 16)) ^ 0x80808080u;
        const uint32_t w1 = ((uint32_t)h[3 + 4 * c] | ((uint32_t)h[4 + 4 * c] << 16)) ^ 0x80808080u;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y[k] = mul(byte_minus(w0, k, 8388736.0f), d);
            y[4 + k] = mul(byte_minus(w1, k, 8388736.0f), d);
        }
        return finite_f32(d);
    }
};

// Q4_K (144 bytes, 32 chunks): group g = c/4, part p = c%4, l = 8p + j.
// One 8-byte load of qs at 16 + 32(g/2) + 8p (blocks 8-byte aligned).
struct WideQ4_K {
    static constexpr bool KV = false;
    static constexpr int CPT = 1;   // chunks per thread, f16/bf16 outputs (measured, docs/native.md)
    static constexpr int QK = 256, B = 144;
    static __device__ __forceinline__ bool chunk(const uint8_t *b, int c, const float *, float *y) {
        const int g = c >> 2, p = c & 3;
        int sc, m;
        scale_min_k4(b + 4, g, sc, m);
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d1 = mul(f16_to_f32(h[0]), (float)sc);
        const float m1 = mul(f16_to_f32(h[1]), (float)m);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 32 * (g >> 1) + 8 * p);
        const int shift = 4 * (g & 1);
        const uint32_t x0 = (q.x >> shift) & 0x0F0F0F0Fu, x1 = (q.y >> shift) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y[k] = fma_rn(d1, byte_minus(x0, k, 8388608.0f), -m1);
            y[4 + k] = fma_rn(d1, byte_minus(x1, k, 8388608.0f), -m1);
        }
        return finite_f32(d1) && finite_f32(m1);
    }
};

// Q5_K (176 bytes): as Q4_K, qs at 48 + 32(g/2) + 8p, the 5th bit from the
// 8 qh bytes at 16 + 8p, bit g.
struct WideQ5_K {
    static constexpr bool KV = false;
    static constexpr int CPT = 1;   // chunks per thread, f16/bf16 outputs (measured, docs/native.md)
    static constexpr int QK = 256, B = 176;
    static __device__ __forceinline__ bool chunk(const uint8_t *b, int c, const float *, float *y) {
        const int g = c >> 2, p = c & 3;
        int sc, m;
        scale_min_k4(b + 4, g, sc, m);
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d1 = mul(f16_to_f32(h[0]), (float)sc);
        const float m1 = mul(f16_to_f32(h[1]), (float)m);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 48 + 32 * (g >> 1) + 8 * p);
        const uint2 qh = *reinterpret_cast<const uint2 *>(b + 16 + 8 * p);
        const int shift = 4 * (g & 1);
        const uint32_t x0 = ((q.x >> shift) & 0x0F0F0F0Fu) | (((qh.x >> g) & 0x01010101u) << 4);
        const uint32_t x1 = ((q.y >> shift) & 0x0F0F0F0Fu) | (((qh.y >> g) & 0x01010101u) << 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y[k] = fma_rn(d1, byte_minus(x0, k, 8388608.0f), -m1);
            y[4 + k] = fma_rn(d1, byte_minus(x1, k, 8388608.0f), -m1);
        }
        return finite_f32(d1) && finite_f32(m1);
    }
};

// Q6_K (210 bytes, only 2-byte aligned): value 128h + 32t + l with h = c/16,
// t = (c/4)%4, l = 8(c%4) + j. The 8 ql and 8 qh bytes are read with
// load8_align2 (three aligned u32 loads each); the 12 bytes read from the
// rounded-down address end at most at byte 196 of the block.
struct WideQ6_K {
    static constexpr bool KV = false;
    static constexpr int CPT = 1;   // chunks per thread, f16/bf16 outputs (measured, docs/native.md)
    static constexpr int QK = 256, B = 210;
    static __device__ __forceinline__ bool chunk(const uint8_t *b, int c, const float *, float *y) {
        const int h = c >> 4, t = (c >> 2) & 3, p = c & 3;
        const float d = f16_to_f32(reinterpret_cast<const uint16_t *>(b)[104]);
        const float dl = mul(d, (float)(int8_t)b[192 + 8 * h + (p >> 1) + 2 * t]);
        const uint2 ql = load8_align2(b + 64 * h + 32 * (t & 1) + 8 * p);
        const uint2 qh = load8_align2(b + 128 + 32 * h + 8 * p);
        const int lshift = 4 * (t >> 1);
        // q + 32 = low nibble | 2 high bits << 4, in 0..63
        const uint32_t x0 = ((ql.x >> lshift) & 0x0F0F0F0Fu) | (((qh.x >> (2 * t)) & 0x03030303u) << 4);
        const uint32_t x1 = ((ql.y >> lshift) & 0x0F0F0F0Fu) | (((qh.y >> (2 * t)) & 0x03030303u) << 4);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y[k] = mul(dl, byte_minus(x0, k, 8388640.0f));
            y[4 + k] = mul(dl, byte_minus(x1, k, 8388640.0f));
        }
        return finite_f32(dl);
    }
};

// IQ4_XS (136 bytes, 32 chunks): ib = c/4, p = c%4; one 8-byte load of qs at
// 8 + 16ib + 8(p&1), low nibbles for p < 2, high for p >= 2; kv from a
// 16-entry table in shared memory, held as floats ((float)kv is exact).
struct WideIQ4_XS {
    static constexpr bool KV = true;   // reads the shared kv table
    static constexpr int CPT = 2;   // chunks per thread, f16/bf16 outputs (measured, docs/native.md)
    static constexpr int QK = 256, B = 136;
    static __device__ __forceinline__ bool chunk(const uint8_t *b, int c, const float *kv, float *y) {
        const int ib = c >> 2, p = c & 3;
        const uint32_t scales_h = reinterpret_cast<const uint16_t *>(b)[1];
        const int ls = (int)(((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) |
                             (((scales_h >> (2 * ib)) & 3) << 4));
        const float dl = mul(f16_to_f32(reinterpret_cast<const uint16_t *>(b)[0]), (float)(ls - 32));
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 8 + 16 * ib + 8 * (p & 1));
        const int shift = 4 * (p >> 1);
        const uint32_t x0 = (q.x >> shift) & 0x0F0F0F0Fu, x1 = (q.y >> shift) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; ++k) {   // byte k, zero-extended: the table index
            y[k] = mul(dl, kv[perm(x0, 0, 0x4440u | (uint32_t)k)]);
            y[4 + k] = mul(dl, kv[perm(x1, 0, 0x4440u | (uint32_t)k)]);
        }
        return finite_f32(dl);
    }
};

}  // namespace strata

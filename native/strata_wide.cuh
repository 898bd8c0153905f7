// Wide kernels' per-chunk formulas: values 8c … 8c+7 of the block at b, one
// struct per type (spec/kernels.md §4). Each keeps the formats.md §5
// expression of every value; only the thread partition differs from
// strata_formats.cuh. Plain C++ as well, for host_check.cpp.
#pragma once

#include "strata_common.cuh"

namespace strata {

// Q8_0 (34 bytes, 4 chunks): d at byte 0, the chunk's 8 quants as four u16
// loads at 2 + 8c (legal: blocks are 2-byte aligned). y = (float)q * d.
struct WideQ8_0 {
    static constexpr bool KV = false;
    static constexpr int QK = 32, B = 34;
    static __device__ __forceinline__ void chunk(const uint8_t *b, int c, const int8_t *, float *y) {
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d = f16_to_f32(h[0]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t w = h[1 + 4 * c + k];
            y[2 * k] = mul((float)(int8_t)(w & 255), d);
            y[2 * k + 1] = mul((float)(int8_t)(w >> 8), d);
        }
    }
};

// Q4_K (144 bytes, 32 chunks): group g = c/4, part p = c%4, l = 8p + j.
// One 8-byte load of qs at 16 + 32(g/2) + 8p (blocks 8-byte aligned).
struct WideQ4_K {
    static constexpr bool KV = false;
    static constexpr int QK = 256, B = 144;
    static __device__ __forceinline__ void chunk(const uint8_t *b, int c, const int8_t *, float *y) {
        const int g = c >> 2, p = c & 3;
        int sc, m;
        scale_min_k4(b + 4, g, sc, m);
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d1 = mul(f16_to_f32(h[0]), (float)sc);
        const float m1 = mul(f16_to_f32(h[1]), (float)m);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 32 * (g >> 1) + 8 * p);
        const int shift = 4 * (g & 1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t w = j < 4 ? q.x : q.y;
            const uint32_t x = (w >> (8 * (j & 3) + shift)) & 15;
            y[j] = sub(mul(d1, (float)x), m1);
        }
    }
};

// Q5_K (176 bytes): as Q4_K, qs at 48 + 32(g/2) + 8p, the 5th bit from the
// 8 qh bytes at 16 + 8p, bit g.
struct WideQ5_K {
    static constexpr bool KV = false;
    static constexpr int QK = 256, B = 176;
    static __device__ __forceinline__ void chunk(const uint8_t *b, int c, const int8_t *, float *y) {
        const int g = c >> 2, p = c & 3;
        int sc, m;
        scale_min_k4(b + 4, g, sc, m);
        const uint16_t *h = reinterpret_cast<const uint16_t *>(b);
        const float d1 = mul(f16_to_f32(h[0]), (float)sc);
        const float m1 = mul(f16_to_f32(h[1]), (float)m);
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 48 + 32 * (g >> 1) + 8 * p);
        const uint2 qh = *reinterpret_cast<const uint2 *>(b + 16 + 8 * p);
        const int shift = 4 * (g & 1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t w = j < 4 ? q.x : q.y;
            const uint32_t wh = j < 4 ? qh.x : qh.y;
            const uint32_t x = ((w >> (8 * (j & 3) + shift)) & 15) |
                               (((wh >> (8 * (j & 3) + g)) & 1) << 4);
            y[j] = sub(mul(d1, (float)x), m1);
        }
    }
};

// Q6_K (210 bytes, only 2-byte aligned): value 128h + 32t + l with h = c/16,
// t = (c/4)%4, l = 8(c%4) + j; ql and qh read as four u16 each.
struct WideQ6_K {
    static constexpr bool KV = false;
    static constexpr int QK = 256, B = 210;
    static __device__ __forceinline__ void chunk(const uint8_t *b, int c, const int8_t *, float *y) {
        const int h = c >> 4, t = (c >> 2) & 3, p = c & 3;
        const uint16_t *hw = reinterpret_cast<const uint16_t *>(b);
        const float d = f16_to_f32(hw[104]);
        const float dl = mul(d, (float)(int8_t)b[192 + 8 * h + (p >> 1) + 2 * t]);
        const uint16_t *ql = hw + (64 * h + 32 * (t & 1) + 8 * p) / 2;
        const uint16_t *qh = hw + (128 + 32 * h + 8 * p) / 2;
        const int lshift = 4 * (t >> 1);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t L = ql[k], H = qh[k];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int q = (int)(((L >> (8 * e + lshift)) & 15) |
                                    (((H >> (8 * e + 2 * t)) & 3) << 4)) - 32;
                y[2 * k + e] = mul(dl, (float)q);
            }
        }
    }
};

// IQ4_XS (136 bytes, 32 chunks): ib = c/4, p = c%4; one 8-byte load of qs at
// 8 + 16ib + 8(p&1), low nibbles for p < 2, high for p >= 2; kv from a
// 16-entry shared table.
struct WideIQ4_XS {
    static constexpr bool KV = true;   // reads the shared kv table
    static constexpr int QK = 256, B = 136;
    static __device__ __forceinline__ void chunk(const uint8_t *b, int c, const int8_t *kv, float *y) {
        const int ib = c >> 2, p = c & 3;
        const uint32_t scales_h = reinterpret_cast<const uint16_t *>(b)[1];
        const int ls = (int)(((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) |
                             (((scales_h >> (2 * ib)) & 3) << 4));
        const float dl = mul(f16_to_f32(reinterpret_cast<const uint16_t *>(b)[0]),
                                   (float)(ls - 32));
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 8 + 16 * ib + 8 * (p & 1));
        const int shift = 4 * (p >> 1);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t w = j < 4 ? q.x : q.y;
            y[j] = mul(dl, (float)kv[(w >> (8 * (j & 3) + shift)) & 15]);
        }
    }
};

}  // namespace strata

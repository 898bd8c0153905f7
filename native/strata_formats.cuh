// Per-type dequantization of one 32-value group, for the generic kernel.
//
// Fmt<T>::group(b, grp, y) writes values 32·grp … 32·grp+31 of the block at b
// into y[0..31]; the one-value types F32/F16/BF16 have Fmt<T>::value(b, j)
// instead (element j after b). Every expression is the one of
// ../shared/spec/formats.md §5, in ggml's C operation order
// (ggml-org/ggml src/ggml-quants.c `dequantize_row_*`): f32 arithmetic only,
// literal formulas so that signed zeros match (Q4_0 is (q − 8)·d, never
// d·q − 8d), IQ signs applied as a negation. The single rounding operations
// (Q4_1/Q5_1 "+ m", K-quant "− m") use mul/add/sub (__fmul_rn etc. on the device) so that no
// contraction question arises; the products are exact anyway (formats.md §6).
//
// The codebooks come from strata_iq_tables.h, generated at build time from
// strata_ref.formats.iq_tables (strata_ref/native/build.py).
#pragma once

#include "strata_common.cuh"
#include "strata_iq_tables.h"

namespace strata {

template <int T> struct Fmt;  // undefined: no generic kernel for T

__device__ __forceinline__ float neg_if(float v, uint32_t bit) { return bit ? -v : v; }

// ---- one-value types --------------------------------------------------------
// value(b, j): element j after b, widened to f32.
template <> struct Fmt<T_F32> {
    static constexpr int QK = 1, B = 4;
    static __device__ float value(const uint8_t *b, int j) { return as_f32(rd_u32(b + 4 * j)); }
};
template <> struct Fmt<T_F16> {
    static constexpr int QK = 1, B = 2;
    static __device__ float value(const uint8_t *b, int j) { return rd_f16(b + 2 * j); }
};
template <> struct Fmt<T_BF16> {
    static constexpr int QK = 1, B = 2;
    static __device__ float value(const uint8_t *b, int j) { return as_f32(rd_u16(b + 2 * j) << 16); }
};

// ---- legacy 32-value types --------------------------------------------------
template <> struct Fmt<T_Q4_0> {  // d@0 qs[16]@2; y = (float)(nib − 8) * d
    static constexpr int QK = 32, B = 18;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[2 + j];
            y[j] = mul((float)((int)(q & 15) - 8), d);
            y[j + 16] = mul((float)((int)(q >> 4) - 8), d);
        }
    }
};
template <> struct Fmt<T_Q4_1> {  // d@0 m@2 qs[16]@4; y = (float)nib * d + m
    static constexpr int QK = 32, B = 20;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[4 + j];
            y[j] = add(mul((float)(q & 15), d), m);
            y[j + 16] = add(mul((float)(q >> 4), d), m);
        }
    }
};
template <> struct Fmt<T_Q5_0> {  // d@0 qh@2 qs[16]@6; y = (float)(x − 16) * d
    static constexpr int QK = 32, B = 22;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b);
        const uint32_t qh = rd_u32(b + 2);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[6 + j];
            const int x0 = (int)((q & 15) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = mul((float)x0, d);
            y[j + 16] = mul((float)x1, d);
        }
    }
};
template <> struct Fmt<T_Q5_1> {  // d@0 m@2 qh@4 qs[16]@8; y = (float)x * d + m
    static constexpr int QK = 32, B = 24;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint32_t qh = rd_u32(b + 4);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[8 + j];
            const uint32_t x0 = (q & 15) | (((qh >> j) & 1) << 4);
            const uint32_t x1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = add(mul((float)x0, d), m);
            y[j + 16] = add(mul((float)x1, d), m);
        }
    }
};
template <> struct Fmt<T_Q8_0> {  // d@0 qs:i8[32]@2; y = (float)qs * d
    static constexpr int QK = 32, B = 34;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul((float)rd_i8(b + 2 + j), d);
    }
};
template <> struct Fmt<T_Q8_1> {  // d@0 s@2 qs:i8[32]@4; y = (float)qs * d (s unused)
    static constexpr int QK = 32, B = 36;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul((float)rd_i8(b + 4 + j), d);
    }
};

// ---- K-quants (256-value super-blocks, group grp = 32 values) -------------
template <> struct Fmt<T_Q2_K> {  // scales[16]@0 qs[64]@16 d@80 dmin@82
    static constexpr int QK = 256, B = 84;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
        const int h = grp >> 2, j = grp & 3;   // value 128h + 32j + 16k + l
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint32_t s = b[8 * h + 2 * j + k];
            const float dl = mul(d, (float)(s & 15));
            const float ml = mul(dmin, (float)(s >> 4));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const uint32_t q = (b[16 + 32 * h + 16 * k + l] >> (2 * j)) & 3;
                y[16 * k + l] = sub(mul(dl, (float)q), ml);
            }
        }
    }
};
template <> struct Fmt<T_Q3_K> {  // hmask[32]@0 qs[64]@32 scales[12]@96 d@108
    static constexpr int QK = 256, B = 110;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + 108);
        const uint8_t *sc = b + 96;
        const int h = grp >> 2, j = grp & 3;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int s = 8 * h + 2 * j + k;
            const int low4 = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
            const int hi2 = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            const float dl = mul(d, (float)((low4 | (hi2 << 4)) - 32));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int q = (int)((b[32 + 32 * h + 16 * k + l] >> (2 * j)) & 3) -
                              ((b[16 * k + l] & (1u << (4 * h + j))) ? 0 : 4);
                y[16 * k + l] = mul(dl, (float)q);
            }
        }
    }
};
template <> struct Fmt<T_Q4_K> {  // d@0 dmin@2 scales[12]@4 qs[128]@16
    static constexpr int QK = 256, B = 144;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        int sc, m;
        scale_min_k4(b + 4, grp, sc, m);
        const float d1 = mul(rd_f16(b), (float)sc);
        const float m1 = mul(rd_f16(b + 2), (float)m);
        const uint8_t *q = b + 16 + 32 * (grp >> 1);
        const int shift = 4 * (grp & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l)
            y[l] = sub(mul(d1, (float)((q[l] >> shift) & 15)), m1);
    }
};
template <> struct Fmt<T_Q5_K> {  // d@0 dmin@2 scales[12]@4 qh[32]@16 qs[128]@48
    static constexpr int QK = 256, B = 176;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        int sc, m;
        scale_min_k4(b + 4, grp, sc, m);
        const float d1 = mul(rd_f16(b), (float)sc);
        const float m1 = mul(rd_f16(b + 2), (float)m);
        const uint8_t *q = b + 48 + 32 * (grp >> 1);
        const int shift = 4 * (grp & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const uint32_t x = ((q[l] >> shift) & 15) | (((b[16 + l] >> grp) & 1) << 4);
            y[l] = sub(mul(d1, (float)x), m1);
        }
    }
};
template <> struct Fmt<T_Q6_K> {  // ql[128]@0 qh[64]@128 scales:i8[16]@192 d@208
    static constexpr int QK = 256, B = 210;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + 208);
        const int h = grp >> 2, t = grp & 3;   // value 128h + 32t + l
        const uint8_t *ql = b + 64 * h + 32 * (t & 1);
        const uint8_t *qh = b + 128 + 32 * h;
        const int lshift = 4 * (t >> 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = (int)(((ql[l] >> lshift) & 15) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
            const float dl = mul(d, (float)rd_i8(b + 192 + 8 * h + (l >> 4) + 2 * t));
            y[l] = mul(dl, (float)q);
        }
    }
};
template <> struct Fmt<T_Q8_K> {  // d:f32@0 qs:i8[256]@4 bsums@260; y = d * (float)q
    static constexpr int QK = 256, B = 292;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = as_f32(rd_u32(b));
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul(d, (float)rd_i8(b + 4 + 32 * grp + j));
    }
};

// ---- I-quants (group grp = sub-block ib; y[8l + j]) -----------------------
template <> struct Fmt<T_IQ2_XXS> {  // d@0 qs:u16[32]@2
    static constexpr int QK = 256, B = 66;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t a0 = rd_u32(b + 2 + 8 * ib), a1 = rd_u32(b + 6 + 8 * ib);
        const float db = mul(mul(rd_f16(b), 0.5f + (float)(a1 >> 28)), 0.25f);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const unsigned long long g = tab_iq2xxs_grid[(a0 >> (8 * l)) & 255];
            const uint32_t s = tab_ksigns_iq2xs[(a1 >> (7 * l)) & 127];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = neg_if(mul(db, (float)((g >> (8 * j)) & 255)), (s >> j) & 1);
        }
    }
};
template <> struct Fmt<T_IQ2_XS> {  // d@0 qs:u16[32]@2 scales[8]@66
    static constexpr int QK = 256, B = 74;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float d = rd_f16(b);
        const uint32_t sc = b[66 + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const float db = mul(mul(d, 0.5f + (float)(l < 2 ? (sc & 15) : (sc >> 4))), 0.25f);
            const uint32_t w = rd_u16(b + 2 + 2 * (4 * ib + l));
            const unsigned long long g = tab_iq2xs_grid[w & 511];
            const uint32_t s = tab_ksigns_iq2xs[w >> 9];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = neg_if(mul(db, (float)((g >> (8 * j)) & 255)), (s >> j) & 1);
        }
    }
};
template <> struct Fmt<T_IQ2_S> {  // d@0 qs[32]@2 signs[32]@34 qh[8]@66 scales[8]@74
    static constexpr int QK = 256, B = 82;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float d = rd_f16(b);
        const uint32_t sc = b[74 + ib], qh = b[66 + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const float db = mul(mul(d, 0.5f + (float)(l < 2 ? (sc & 15) : (sc >> 4))), 0.25f);
            const uint32_t idx = b[2 + 4 * ib + l] | (((qh >> (2 * l)) & 3) << 8);
            const unsigned long long g = tab_iq2s_grid[idx];
            const uint32_t s = b[34 + 4 * ib + l];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = neg_if(mul(db, (float)((g >> (8 * j)) & 255)), (s >> j) & 1);
        }
    }
};
template <> struct Fmt<T_IQ3_XXS> {  // d@0 qs[64]@2 scales_and_signs:u32[8]@66
    static constexpr int QK = 256, B = 98;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t a = rd_u32(b + 66 + 4 * ib);
        const float db = mul(mul(rd_f16(b), 0.5f + (float)(a >> 28)), 0.5f);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t s = tab_ksigns_iq2xs[(a >> (7 * l)) & 127];
            const uint32_t g1 = tab_iq3xxs_grid[b[2 + 8 * ib + 2 * l]];
            const uint32_t g2 = tab_iq3xxs_grid[b[2 + 8 * ib + 2 * l + 1]];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                y[8 * l + j] = neg_if(mul(db, (float)((g1 >> (8 * j)) & 255)), (s >> j) & 1);
                y[8 * l + 4 + j] = neg_if(mul(db, (float)((g2 >> (8 * j)) & 255)), (s >> (j + 4)) & 1);
            }
        }
    }
};
template <> struct Fmt<T_IQ3_S> {  // d@0 qs[64]@2 qh[8]@66 signs[32]@74 scales[4]@106
    static constexpr int QK = 256, B = 110;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t scale = (b[106 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const float db = mul(rd_f16(b), (float)(1 + 2 * (int)scale));
        const uint32_t qh = b[66 + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i1 = b[2 + 8 * ib + 2 * l] | (((qh >> (2 * l)) & 1) << 8);
            const uint32_t i2 = b[2 + 8 * ib + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
            const uint32_t g1 = tab_iq3s_grid[i1], g2 = tab_iq3s_grid[i2];
            const uint32_t s = b[74 + 4 * ib + l];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                y[8 * l + j] = neg_if(mul(db, (float)((g1 >> (8 * j)) & 255)), (s >> j) & 1);
                y[8 * l + 4 + j] = neg_if(mul(db, (float)((g2 >> (8 * j)) & 255)), (s >> (j + 4)) & 1);
            }
        }
    }
};
// iq1s_grid_gpu row: nibble j (low nibbles of bytes 0-3 are elements 0-3, high
// nibbles elements 4-7) holds value + 1 (formats.md §7).
__device__ __forceinline__ int iq1_grid_value(uint32_t g, int j) {
    const int nib = j < 4 ? (g >> (8 * j)) & 15 : (g >> (8 * (j - 4) + 4)) & 15;
    return nib - 1;
}
template <> struct Fmt<T_IQ1_S> {  // d@0 qs[32]@2 qh:u16[8]@34
    static constexpr int QK = 256, B = 50;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t q = rd_u16(b + 34 + 2 * ib);
        const float dl = mul(rd_f16(b), (float)(2 * (int)((q >> 12) & 7) + 1));
        const float delta = (q & 0x8000) ? -0.125f : 0.125f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t g = tab_iq1s_grid_gpu[b[2 + 4 * ib + l] | (((q >> (3 * l)) & 7) << 8)];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = mul(dl, add((float)iq1_grid_value(g, j), delta));
        }
    }
};
template <> struct Fmt<T_IQ1_M> {  // qs[32]@0 qh[16]@32 scales:u16[4]@48
    static constexpr int QK = 256, B = 56;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t s0 = rd_u16(b + 48), s1 = rd_u16(b + 50), s2 = rd_u16(b + 52),
                       s3 = rd_u16(b + 54);
        const float d = f16_to_f32((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) |
                                   (s3 & 0xF000));
        const uint32_t sc = rd_u16(b + 48 + 2 * (ib >> 1));
        const int sh = 6 * (ib & 1);
        const float dl1 = mul(d, (float)(2 * (int)((sc >> sh) & 7) + 1));
        const float dl2 = mul(d, (float)(2 * (int)((sc >> (sh + 3)) & 7) + 1));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t qh = b[32 + 2 * ib + (l >> 1)];
            const uint32_t hi = (l & 1) ? (qh >> 4) & 7 : qh & 7;
            const float delta = (qh & ((l & 1) ? 0x80 : 0x08)) ? -0.125f : 0.125f;
            const uint32_t g = tab_iq1s_grid_gpu[b[4 * ib + l] | (hi << 8)];
            const float dl = l < 2 ? dl1 : dl2;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = mul(dl, add((float)iq1_grid_value(g, j), delta));
        }
    }
};
template <> struct Fmt<T_IQ4_NL> {  // d@0 qs[16]@2; y = d * (float)kv
    static constexpr int QK = 32, B = 18;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[2 + j];
            y[j] = mul(d, (float)tab_kvalues_iq4nl[q & 15]);
            y[j + 16] = mul(d, (float)tab_kvalues_iq4nl[q >> 4]);
        }
    }
};
// IQ4_XS 6-bit sub-block scale ls (formats.md §5).
__device__ __forceinline__ int iq4xs_ls(const uint8_t *b, int ib) {
    return (int)(((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((rd_u16(b + 2) >> (2 * ib)) & 3) << 4));
}
template <> struct Fmt<T_IQ4_XS> {  // d@0 scales_h:u16@2 scales_l[4]@4 qs[128]@8
    static constexpr int QK = 256, B = 136;
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float dl = mul(rd_f16(b), (float)(iq4xs_ls(b, ib) - 32));
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[8 + 16 * ib + j];
            y[j] = mul(dl, (float)tab_kvalues_iq4nl[q & 15]);
            y[j + 16] = mul(dl, (float)tab_kvalues_iq4nl[q >> 4]);
        }
    }
};

// ---- ternary -----------------------------------------------------------------
// Trit n of byte x: q = (x·3^n) mod 256, t = (q·3) >> 8 (ggml dequantize_row_tq1_0).
__device__ __forceinline__ int tq1_trit(uint32_t x, int n) {
    const uint32_t pow3 = (uint32_t)(0x511B090301ULL >> (8 * n)) & 255;   // 1, 3, 9, 27, 81
    const uint32_t q = (x * pow3) & 255;
    return (int)((q * 3) >> 8);
}
template <> struct Fmt<T_TQ1_0> {  // qs[48]@0 qh[4]@48 d@52
    static constexpr int QK = 256, B = 54;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + 52);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int v = 32 * grp + k;
            uint32_t x;
            int n;
            if (v < 160) {           // y[32n + m] from qs[m]
                n = v >> 5; x = b[v & 31];
            } else if (v < 240) {    // y[160 + 16n + m] from qs[32 + m]
                n = (v - 160) >> 4; x = b[32 + ((v - 160) & 15)];
            } else {                 // y[240 + 4n + j] from qh[j]
                n = (v - 240) >> 2; x = b[48 + ((v - 240) & 3)];
            }
            y[k] = mul((float)(tq1_trit(x, n) - 1), d);
        }
    }
};
template <> struct Fmt<T_TQ2_0> {  // qs[64]@0 d@64; y[128c + 32l + m]
    static constexpr int QK = 256, B = 66;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + 64);
        const int c = grp >> 2, l = grp & 3;
#pragma unroll
        for (int m = 0; m < 32; ++m)
            y[m] = mul((float)((int)((b[32 * c + m] >> (2 * l)) & 3) - 1), d);
    }
};

// ---- FP4 ---------------------------------------------------------------------
// ggml_e8m0_to_fp32_half: 2^(e−128); bits (e−1) << 23 for e ≥ 2, else the
// subnormals 0x00200000 << e. e = 255 gives 2^127 (C semantics, no NaN).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return as_f32(e >= 2 ? (e - 1) << 23 : 0x00200000u << e);
}
template <> struct Fmt<T_MXFP4> {  // e@0 qs[16]@1; y = (float)kv * D
    static constexpr int QK = 32, B = 17;
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float D = e8m0_half(b[0]);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[1 + j];
            y[j] = mul((float)tab_kvalues_mxfp4[q & 15], D);
            y[j + 16] = mul((float)tab_kvalues_mxfp4[q >> 4], D);
        }
    }
};
// ggml_ue4m3_to_fp32: half the UE4M3 value; bit 7 ignored except that the
// whole bytes 0x00 and 0x7F give 0. (8 + man)·2^(exp − 11) equals
// (1 + man/8)·2^(exp − 7)·0.5 exactly; man·2^-10 is the exp = 0 case.
__device__ __forceinline__ float ue4m3_half(uint32_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int ex = (x >> 3) & 15, man = x & 7;
    if (ex == 0) return mul((float)man, as_f32((127u - 10u) << 23));
    return mul((float)(8 + man), as_f32((uint32_t)(127 + ex - 11) << 23));
}
template <> struct Fmt<T_NVFP4> {  // d:UE4M3[4]@0 qs[32]@4; y = (float)kv * D
    static constexpr int QK = 64, B = 36;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * grp + h;
            const float D = ue4m3_half(b[s]);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const uint32_t q = b[4 + 8 * s + j];
                y[16 * h + j] = mul((float)tab_kvalues_mxfp4[q & 15], D);
                y[16 * h + 8 + j] = mul((float)tab_kvalues_mxfp4[q >> 4], D);
            }
        }
    }
};

// ---- low-bit -------------------------------------------------------------------
template <> struct Fmt<T_Q1_0> {  // d@0 qs[16]@2; y = bit ? d : −d (a sign flip)
    static constexpr int QK = 128, B = 18;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int j = 32 * grp + k;
            y[k] = ((b[2 + (j >> 3)] >> (j & 7)) & 1) ? d : -d;
        }
    }
};
template <> struct Fmt<T_Q2_0> {  // d@0 qs[16]@2; y = (float)(q − 1) * d, sequential 2-bit
    static constexpr int QK = 64, B = 18;
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int j = 32 * grp + k;
            y[k] = mul((float)((int)((b[2 + (j >> 2)] >> (2 * (j & 3))) & 3) - 1), d);
        }
    }
};

// X-macro of every type with a generic kernel: X(id, name).
#define STRATA_GENERIC_TYPES(X)                                                   \
    X(0, F32) X(1, F16) X(2, Q4_0) X(3, Q4_1) X(6, Q5_0) X(7, Q5_1) X(8, Q8_0)      \
    X(9, Q8_1) X(10, Q2_K) X(11, Q3_K) X(12, Q4_K) X(13, Q5_K) X(14, Q6_K)          \
    X(15, Q8_K) X(16, IQ2_XXS) X(17, IQ2_XS) X(18, IQ3_XXS) X(19, IQ1_S)            \
    X(20, IQ4_NL) X(21, IQ3_S) X(22, IQ2_S) X(23, IQ4_XS) X(29, IQ1_M) X(30, BF16)  \
    X(34, TQ1_0) X(35, TQ2_0) X(39, MXFP4) X(40, NVFP4) X(41, Q1_0) X(42, Q2_0)

}  // namespace strata

// Per-type dequantization of one 32-value group, for the generic kernel.
//
// Fmt<T> derives from Block<T> (strata_blocks.h, generated from the block
// declarations of strata_ref/types.py): QK, B and the field offsets o_<name>;
// no byte offset is written here.
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
template <> struct Fmt<T_F32> : Block<T_F32> {
    static __device__ float value(const uint8_t *b, int j) { return as_f32(rd_u32(b + B * j)); }
};
template <> struct Fmt<T_F16> : Block<T_F16> {
    static __device__ float value(const uint8_t *b, int j) { return rd_f16(b + B * j); }
};
template <> struct Fmt<T_BF16> : Block<T_BF16> {
    static __device__ float value(const uint8_t *b, int j) { return as_f32(rd_u16(b + B * j) << 16); }
};

// ---- legacy 32-value types --------------------------------------------------
template <> struct Fmt<T_Q4_0> : Block<T_Q4_0> {  // y = (float)(nib − 8) * d
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
            y[j] = mul((float)((int)(q & 15) - 8), d);
            y[j + 16] = mul((float)((int)(q >> 4) - 8), d);
        }
    }
};
template <> struct Fmt<T_Q4_1> : Block<T_Q4_1> {  // y = (float)nib * d + m
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d), m = rd_f16(b + o_m);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
            y[j] = add(mul((float)(q & 15), d), m);
            y[j + 16] = add(mul((float)(q >> 4), d), m);
        }
    }
};
template <> struct Fmt<T_Q5_0> : Block<T_Q5_0> {  // y = (float)(x − 16) * d
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d);
        const uint32_t qh = rd_u32(b + o_qh);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
            const int x0 = (int)((q & 15) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = mul((float)x0, d);
            y[j + 16] = mul((float)x1, d);
        }
    }
};
template <> struct Fmt<T_Q5_1> : Block<T_Q5_1> {  // y = (float)x * d + m
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d), m = rd_f16(b + o_m);
        const uint32_t qh = rd_u32(b + o_qh);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
            const uint32_t x0 = (q & 15) | (((qh >> j) & 1) << 4);
            const uint32_t x1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            y[j] = add(mul((float)x0, d), m);
            y[j + 16] = add(mul((float)x1, d), m);
        }
    }
};
template <> struct Fmt<T_Q8_0> : Block<T_Q8_0> {  // y = (float)qs * d
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul((float)rd_i8(b + o_qs + j), d);
    }
};
template <> struct Fmt<T_Q8_1> : Block<T_Q8_1> {  // y = (float)qs * d (s unused)
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul((float)rd_i8(b + o_qs + j), d);
    }
};

// ---- K-quants (256-value super-blocks, group grp = 32 values) -------------
template <> struct Fmt<T_Q2_K> : Block<T_Q2_K> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d), dmin = rd_f16(b + o_dmin);
        const int h = grp >> 2, j = grp & 3;   // value 128h + 32j + 16k + l
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const uint32_t s = b[o_scales + 8 * h + 2 * j + k];
            const float dl = mul(d, (float)(s & 15));
            const float ml = mul(dmin, (float)(s >> 4));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const uint32_t q = (b[o_qs + 32 * h + 16 * k + l] >> (2 * j)) & 3;
                y[16 * k + l] = sub(mul(dl, (float)q), ml);
            }
        }
    }
};
template <> struct Fmt<T_Q3_K> : Block<T_Q3_K> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
        const uint8_t *sc = b + o_scales;
        const int h = grp >> 2, j = grp & 3;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int s = 8 * h + 2 * j + k;
            const int low4 = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
            const int hi2 = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
            const float dl = mul(d, (float)((low4 | (hi2 << 4)) - 32));
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int q = (int)((b[o_qs + 32 * h + 16 * k + l] >> (2 * j)) & 3) -
                              ((b[o_hmask + 16 * k + l] & (1u << (4 * h + j))) ? 0 : 4);
                y[16 * k + l] = mul(dl, (float)q);
            }
        }
    }
};
template <> struct Fmt<T_Q4_K> : Block<T_Q4_K> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        int sc, m;
        scale_min_k4(b + o_scales, grp, sc, m);
        const float d1 = mul(rd_f16(b + o_d), (float)sc);
        const float m1 = mul(rd_f16(b + o_dmin), (float)m);
        const uint8_t *q = b + o_qs + 32 * (grp >> 1);
        const int shift = 4 * (grp & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l)
            y[l] = sub(mul(d1, (float)((q[l] >> shift) & 15)), m1);
    }
};
template <> struct Fmt<T_Q5_K> : Block<T_Q5_K> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        int sc, m;
        scale_min_k4(b + o_scales, grp, sc, m);
        const float d1 = mul(rd_f16(b + o_d), (float)sc);
        const float m1 = mul(rd_f16(b + o_dmin), (float)m);
        const uint8_t *q = b + o_qs + 32 * (grp >> 1);
        const int shift = 4 * (grp & 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const uint32_t x = ((q[l] >> shift) & 15) | (((b[o_qh + l] >> grp) & 1) << 4);
            y[l] = sub(mul(d1, (float)x), m1);
        }
    }
};
template <> struct Fmt<T_Q6_K> : Block<T_Q6_K> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
        const int h = grp >> 2, t = grp & 3;   // value 128h + 32t + l
        const uint8_t *ql = b + o_ql + 64 * h + 32 * (t & 1);
        const uint8_t *qh = b + o_qh + 32 * h;
        const int lshift = 4 * (t >> 1);
#pragma unroll
        for (int l = 0; l < 32; ++l) {
            const int q = (int)(((ql[l] >> lshift) & 15) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
            const float dl = mul(d, (float)rd_i8(b + o_scales + 8 * h + (l >> 4) + 2 * t));
            y[l] = mul(dl, (float)q);
        }
    }
};
template <> struct Fmt<T_Q8_K> : Block<T_Q8_K> {  // y = d * (float)q, d f32
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = as_f32(rd_u32(b + o_d));
#pragma unroll
        for (int j = 0; j < 32; ++j) y[j] = mul(d, (float)rd_i8(b + o_qs + 32 * grp + j));
    }
};

// ---- I-quants (group grp = sub-block ib; y[8l + j]) -----------------------
template <> struct Fmt<T_IQ2_XXS> : Block<T_IQ2_XXS> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t a0 = rd_u32(b + o_qs + 8 * ib), a1 = rd_u32(b + o_qs + 4 + 8 * ib);
        const float db = mul(mul(rd_f16(b + o_d), 0.5f + (float)(a1 >> 28)), 0.25f);
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
template <> struct Fmt<T_IQ2_XS> : Block<T_IQ2_XS> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float d = rd_f16(b + o_d);
        const uint32_t sc = b[o_scales + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const float db = mul(mul(d, 0.5f + (float)(l < 2 ? (sc & 15) : (sc >> 4))), 0.25f);
            const uint32_t w = rd_u16(b + o_qs + 2 * (4 * ib + l));
            const unsigned long long g = tab_iq2xs_grid[w & 511];
            const uint32_t s = tab_ksigns_iq2xs[w >> 9];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = neg_if(mul(db, (float)((g >> (8 * j)) & 255)), (s >> j) & 1);
        }
    }
};
template <> struct Fmt<T_IQ2_S> : Block<T_IQ2_S> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float d = rd_f16(b + o_d);
        const uint32_t sc = b[o_scales + ib], qh = b[o_qh + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const float db = mul(mul(d, 0.5f + (float)(l < 2 ? (sc & 15) : (sc >> 4))), 0.25f);
            const uint32_t idx = b[o_qs + 4 * ib + l] | (((qh >> (2 * l)) & 3) << 8);
            const unsigned long long g = tab_iq2s_grid[idx];
            const uint32_t s = b[o_signs + 4 * ib + l];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = neg_if(mul(db, (float)((g >> (8 * j)) & 255)), (s >> j) & 1);
        }
    }
};
template <> struct Fmt<T_IQ3_XXS> : Block<T_IQ3_XXS> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t a = rd_u32(b + o_scales_and_signs + 4 * ib);
        const float db = mul(mul(rd_f16(b + o_d), 0.5f + (float)(a >> 28)), 0.5f);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t s = tab_ksigns_iq2xs[(a >> (7 * l)) & 127];
            const uint32_t g1 = tab_iq3xxs_grid[b[o_qs + 8 * ib + 2 * l]];
            const uint32_t g2 = tab_iq3xxs_grid[b[o_qs + 8 * ib + 2 * l + 1]];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                y[8 * l + j] = neg_if(mul(db, (float)((g1 >> (8 * j)) & 255)), (s >> j) & 1);
                y[8 * l + 4 + j] = neg_if(mul(db, (float)((g2 >> (8 * j)) & 255)), (s >> (j + 4)) & 1);
            }
        }
    }
};
template <> struct Fmt<T_IQ3_S> : Block<T_IQ3_S> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t scale = (b[o_scales + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const float db = mul(rd_f16(b + o_d), (float)(1 + 2 * (int)scale));
        const uint32_t qh = b[o_qh + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t i1 = b[o_qs + 8 * ib + 2 * l] | (((qh >> (2 * l)) & 1) << 8);
            const uint32_t i2 = b[o_qs + 8 * ib + 2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
            const uint32_t g1 = tab_iq3s_grid[i1], g2 = tab_iq3s_grid[i2];
            const uint32_t s = b[o_signs + 4 * ib + l];
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
template <> struct Fmt<T_IQ1_S> : Block<T_IQ1_S> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t q = rd_u16(b + o_qh + 2 * ib);
        const float dl = mul(rd_f16(b + o_d), (float)(2 * (int)((q >> 12) & 7) + 1));
        const float delta = (q & 0x8000) ? -0.125f : 0.125f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t g = tab_iq1s_grid_gpu[b[o_qs + 4 * ib + l] | (((q >> (3 * l)) & 7) << 8)];
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = mul(dl, add((float)iq1_grid_value(g, j), delta));
        }
    }
};
template <> struct Fmt<T_IQ1_M> : Block<T_IQ1_M> {  // d: top nibbles of the 4 scales
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const uint32_t s0 = rd_u16(b + o_scales), s1 = rd_u16(b + o_scales + 2),
                       s2 = rd_u16(b + o_scales + 4), s3 = rd_u16(b + o_scales + 6);
        const float d = f16_to_f32((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) |
                                   (s3 & 0xF000));
        const uint32_t sc = rd_u16(b + o_scales + 2 * (ib >> 1));
        const int sh = 6 * (ib & 1);
        const float dl1 = mul(d, (float)(2 * (int)((sc >> sh) & 7) + 1));
        const float dl2 = mul(d, (float)(2 * (int)((sc >> (sh + 3)) & 7) + 1));
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const uint32_t qh = b[o_qh + 2 * ib + (l >> 1)];
            const uint32_t hi = (l & 1) ? (qh >> 4) & 7 : qh & 7;
            const float delta = (qh & ((l & 1) ? 0x80 : 0x08)) ? -0.125f : 0.125f;
            const uint32_t g = tab_iq1s_grid_gpu[b[o_qs + 4 * ib + l] | (hi << 8)];
            const float dl = l < 2 ? dl1 : dl2;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                y[8 * l + j] = mul(dl, add((float)iq1_grid_value(g, j), delta));
        }
    }
};
template <> struct Fmt<T_IQ4_NL> : Block<T_IQ4_NL> {  // y = d * (float)kv
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
            y[j] = mul(d, (float)tab_kvalues_iq4nl[q & 15]);
            y[j + 16] = mul(d, (float)tab_kvalues_iq4nl[q >> 4]);
        }
    }
};
// IQ4_XS 6-bit sub-block scale ls (formats.md §5).
__device__ __forceinline__ int iq4xs_ls(const uint8_t *b, int ib) {
    using L = Block<T_IQ4_XS>;
    return (int)(((b[L::o_scales_l + (ib >> 1)] >> (4 * (ib & 1))) & 15) |
                 (((rd_u16(b + L::o_scales_h) >> (2 * ib)) & 3) << 4));
}
template <> struct Fmt<T_IQ4_XS> : Block<T_IQ4_XS> {
    static __device__ void group(const uint8_t *b, int ib, float *y) {
        const float dl = mul(rd_f16(b + o_d), (float)(iq4xs_ls(b, ib) - 32));
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + 16 * ib + j];
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
template <> struct Fmt<T_TQ1_0> : Block<T_TQ1_0> {
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int v = 32 * grp + k;
            uint32_t x;
            int n;
            if (v < 160) {           // y[32n + m] from qs[m]
                n = v >> 5; x = b[o_qs + (v & 31)];
            } else if (v < 240) {    // y[160 + 16n + m] from qs[32 + m]
                n = (v - 160) >> 4; x = b[o_qs + 32 + ((v - 160) & 15)];
            } else {                 // y[240 + 4n + j] from qh[j]
                n = (v - 240) >> 2; x = b[o_qh + ((v - 240) & 3)];
            }
            y[k] = mul((float)(tq1_trit(x, n) - 1), d);
        }
    }
};
template <> struct Fmt<T_TQ2_0> : Block<T_TQ2_0> {  // y[128c + 32l + m]
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
        const int c = grp >> 2, l = grp & 3;
#pragma unroll
        for (int m = 0; m < 32; ++m)
            y[m] = mul((float)((int)((b[o_qs + 32 * c + m] >> (2 * l)) & 3) - 1), d);
    }
};

// ---- FP4 ---------------------------------------------------------------------
// ggml_e8m0_to_fp32_half: 2^(e−128); bits (e−1) << 23 for e ≥ 2, else the
// subnormals 0x00200000 << e. e = 255 gives 2^127 (C semantics, no NaN).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
    return as_f32(e >= 2 ? (e - 1) << 23 : 0x00200000u << e);
}
template <> struct Fmt<T_MXFP4> : Block<T_MXFP4> {  // y = (float)kv * D
    static __device__ void group(const uint8_t *b, int, float *y) {
        const float D = e8m0_half(b[o_e]);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const uint32_t q = b[o_qs + j];
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
template <> struct Fmt<T_NVFP4> : Block<T_NVFP4> {  // y = (float)kv * D, D from UE4M3 d[s]
    static __device__ void group(const uint8_t *b, int grp, float *y) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = 2 * grp + h;
            const float D = ue4m3_half(b[o_d + s]);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const uint32_t q = b[o_qs + 8 * s + j];
                y[16 * h + j] = mul((float)tab_kvalues_mxfp4[q & 15], D);
                y[16 * h + 8 + j] = mul((float)tab_kvalues_mxfp4[q >> 4], D);
            }
        }
    }
};

// ---- low-bit -------------------------------------------------------------------
template <> struct Fmt<T_Q1_0> : Block<T_Q1_0> {  // y = bit ? d : −d (a sign flip)
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int j = 32 * grp + k;
            y[k] = ((b[o_qs + (j >> 3)] >> (j & 7)) & 1) ? d : -d;
        }
    }
};
template <> struct Fmt<T_Q2_0> : Block<T_Q2_0> {  // y = (float)(q − 1) * d, sequential 2-bit
    static __device__ void group(const uint8_t *b, int grp, float *y) {
        const float d = rd_f16(b + o_d);
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            const int j = 32 * grp + k;
            y[k] = mul((float)((int)((b[o_qs + (j >> 2)] >> (2 * (j & 3))) & 3) - 1), d);
        }
    }
};

// STRATA_GENERIC_TYPES(X), the X-macro of every type with a generic kernel,
// is generated into strata_blocks.h: every type the oracle converts needs its
// Fmt<> here.

}  // namespace strata

// Per-type thread dots of a weight block with its q8_1 blocks.
//
// Each `Dot<TYPE>::dot(blk, q8, t)` is the value thread t (0 <= t < T) of the
// T threads sharing weight block `blk` returns, with `q8` the first of the
// block's QK/32 q8_1 blocks. Integer parts follow the vecdotq.cuh
// expressions of ggml-org/llama.cpp (dp4a on packed ints; exact); the float
// combine is written with explicit round-to-nearest intrinsics, and
// __fmaf_rn exactly where strata_ref/routes/mmvq.py calls fma_f32. The value
// sets per thread are routes/mmvq.py's GEOMETRY.
//
// Without CUDA (mmvq_host_check.cpp, built by a CPU test with
// -ffp-contract=off) the intrinsics below are emulated exactly, so CI checks
// these formulas against the NumPy oracle bit for bit.
#pragma once

#include <stdint.h>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#else
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __int2float_rn(int v) { return (float)v; }
static inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    return c;
}
static inline int __vsubss4(int a, int b) {
    uint32_t r = 0;
    for (int k = 0; k < 4; ++k) {
        int d = (int)(int8_t)(a >> (8 * k)) - (int)(int8_t)(b >> (8 * k));
        d = d > 127 ? 127 : d < -128 ? -128 : d;
        r |= (uint32_t)(uint8_t)d << (8 * k);
    }
    return (int)r;
}
// fp16 bits -> float (exact; NaN payloads kept, quieted)
static inline float smv_half_bits_to_float(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return __uint_as_float(s | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) {
        const float v = std::ldexp((float)m, -24);
        return s ? -v : v;
    }
    return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}
#endif

namespace smv {

enum : int {
    Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11,
    Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, MXFP4 = 39
};

constexpr int Q8_1_BYTES = 36;

__device__ __forceinline__ float h2f(const uint8_t *p) {
#ifdef __CUDACC__
    return __half2float(__ushort_as_half(*(const unsigned short *)p));
#else
    return smv_half_bits_to_float((uint16_t)(p[0] | (p[1] << 8)));
#endif
}
__device__ __forceinline__ int ld_b1(const uint8_t *p, int i) {
    const uint8_t *b = p + 4 * i;
    return (int)((uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                 ((uint32_t)b[3] << 24));
}
__device__ __forceinline__ int ld_b2(const uint8_t *p, int i) {
    const uint16_t *h = (const uint16_t *)p;
    return (int)((uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16));
}
__device__ __forceinline__ int ld_b4(const uint8_t *p, int i) { return ((const int *)p)[i]; }

__device__ __forceinline__ int q8i(const uint8_t *q8, int blk, int i) {
    return ld_b4(q8 + Q8_1_BYTES * blk + 4, i);
}
__device__ __forceinline__ float q8d(const uint8_t *q8, int blk) { return h2f(q8 + Q8_1_BYTES * blk); }
__device__ __forceinline__ float q8s(const uint8_t *q8, int blk) { return h2f(q8 + Q8_1_BYTES * blk + 2); }

__device__ __forceinline__ float i2f(int v) { return __int2float_rn(v); }

// Four table bytes selected by the low nibbles of the bytes of `idx`.
__device__ __forceinline__ int lut4(uint32_t idx, const int8_t *tbl) {
    return (int)(((uint32_t)(uint8_t)tbl[idx & 15]) |
                 ((uint32_t)(uint8_t)tbl[(idx >> 8) & 15] << 8) |
                 ((uint32_t)(uint8_t)tbl[(idx >> 16) & 15] << 16) |
                 ((uint32_t)(uint8_t)tbl[(idx >> 24) & 15] << 24));
}

template <int TYPE> struct Dot;

// ---- 32-value blocks ------------------------------------------------------

// Q4_0: d_w * (float(sumi)*d8 - 4*s8)
template <> struct Dot<Q4_0> {
    static constexpr int QK = 32, BYTES = 18, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        int sumi = 0;
        for (int i = 0; i < 2; ++i) {
            const int v = ld_b2(b + 2, 2 * t + i);
            sumi = __dp4a(v & 0x0F0F0F0F, q8i(q8, 0, 2 * t + i), sumi);
            sumi = __dp4a((v >> 4) & 0x0F0F0F0F, q8i(q8, 0, 2 * t + i + 4), sumi);
        }
        const float a = __fmul_rn(i2f(sumi), q8d(q8, 0));
        return __fmul_rn(h2f(b), __fsub_rn(a, __fmul_rn(4.0f, q8s(q8, 0))));
    }
};

// Q4_1: float(sumi)*(d_w*d8) + (m_w*s8)*0.5
template <> struct Dot<Q4_1> {
    static constexpr int QK = 32, BYTES = 20, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        int sumi = 0;
        for (int i = 0; i < 2; ++i) {
            const int v = ld_b4(b + 4, 2 * t + i);
            sumi = __dp4a(v & 0x0F0F0F0F, q8i(q8, 0, 2 * t + i), sumi);
            sumi = __dp4a((v >> 4) & 0x0F0F0F0F, q8i(q8, 0, 2 * t + i + 4), sumi);
        }
        const float dd = __fmul_rn(h2f(b), q8d(q8, 0));
        const float ms = __fmul_rn(h2f(b + 2), q8s(q8, 0));
        return __fadd_rn(__fmul_rn(i2f(sumi), dd), __fmul_rn(ms, 0.5f));
    }
};

// 5-bit legacy integer dot (the qh bit of each value moved to bit 4).
__device__ __forceinline__ int q5_sumi(const uint8_t *qs, uint32_t qh, const uint8_t *q8, int t,
                                       bool b4) {
    int sumi = 0;
    for (int i = 0; i < 2; ++i) {
        const int iq = 2 * t + i;
        const int vl = b4 ? ld_b4(qs, iq) : ld_b2(qs, iq);
        const int vh = (int)(qh >> (4 * iq));
        int v0 = vl & 0x0F0F0F0F;
        v0 |= (vh << 4) & 0x00000010;
        v0 |= (vh << 11) & 0x00001000;
        v0 |= (vh << 18) & 0x00100000;
        v0 |= (vh << 25) & 0x10000000;
        int v1 = (vl >> 4) & 0x0F0F0F0F;
        v1 |= (vh >> 12) & 0x00000010;
        v1 |= (vh >> 5) & 0x00001000;
        v1 |= (vh << 2) & 0x00100000;
        v1 |= (vh << 9) & 0x10000000;
        sumi = __dp4a(v0, q8i(q8, 0, iq), sumi);
        sumi = __dp4a(v1, q8i(q8, 0, iq + 4), sumi);
    }
    return sumi;
}

// Q5_0: d_w * (float(sumi)*d8 - 8*s8)
template <> struct Dot<Q5_0> {
    static constexpr int QK = 32, BYTES = 22, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const uint32_t qh = (uint32_t)ld_b2(b + 2, 0);
        const int sumi = q5_sumi(b + 6, qh, q8, t, false);
        const float a = __fmul_rn(i2f(sumi), q8d(q8, 0));
        return __fmul_rn(h2f(b), __fsub_rn(a, __fmul_rn(8.0f, q8s(q8, 0))));
    }
};

// Q5_1: as Q4_1
template <> struct Dot<Q5_1> {
    static constexpr int QK = 32, BYTES = 24, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const uint32_t qh = (uint32_t)ld_b4(b + 4, 0);
        const int sumi = q5_sumi(b + 8, qh, q8, t, true);
        const float dd = __fmul_rn(h2f(b), q8d(q8, 0));
        const float ms = __fmul_rn(h2f(b + 2), q8s(q8, 0));
        return __fadd_rn(__fmul_rn(i2f(sumi), dd), __fmul_rn(ms, 0.5f));
    }
};

// Q8_0: (d_w*d8) * float(sumi)
template <> struct Dot<Q8_0> {
    static constexpr int QK = 32, BYTES = 34, T = 4;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        int sumi = 0;
        for (int i = 0; i < 2; ++i) sumi = __dp4a(ld_b2(b + 2, 2 * t + i), q8i(q8, 0, 2 * t + i), sumi);
        return __fmul_rn(__fmul_rn(h2f(b), q8d(q8, 0)), i2f(sumi));
    }
};

// IQ4_NL / MXFP4: (d*d8) * float(sumi), values from a 16-entry table.
__device__ __forceinline__ int nl_sumi(const uint8_t *qs, const uint8_t *q8, int t, bool b1,
                                       const int8_t *tbl) {
    int sumi = 0;
    for (int l = 0; l < 2; ++l) {
        const uint32_t a = (uint32_t)(b1 ? ld_b1(qs, 2 * t + l) : ld_b2(qs, 2 * t + l));
        sumi = __dp4a(lut4(a, tbl), q8i(q8, 0, 2 * t + l), sumi);
        sumi = __dp4a(lut4(a >> 4, tbl), q8i(q8, 0, 2 * t + l + 4), sumi);
    }
    return sumi;
}

template <> struct Dot<IQ4_NL> {
    static constexpr int QK = 32, BYTES = 18, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *tbl) {
        const int sumi = nl_sumi(b + 2, q8, t, false, tbl);
        return __fmul_rn(__fmul_rn(h2f(b), q8d(q8, 0)), i2f(sumi));
    }
};

// MXFP4: d = the E8M0 half value 2^(e-128) (formats.md; e = 255 gives 2^127)
template <> struct Dot<MXFP4> {
    static constexpr int QK = 32, BYTES = 17, T = 2;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *tbl) {
        const uint32_t e = b[0];
        const float d = __uint_as_float(e >= 2 ? (e - 1) << 23 : 0x00200000u << e);
        const int sumi = nl_sumi(b + 1, q8, t, true, tbl);
        return __fmul_rn(__fmul_rn(d, q8d(q8, 0)), i2f(sumi));
    }
};

// ---- K-quants (256-value super-blocks) --------------------------------------

// Q2_K: sumf_d = fma(d8_i, float(dot_i*(sc&15)), sumf_d); sumf_m = fma(d8_i,
// float((sc>>4)*sum(u_i)), sumf_m); d*sumf_d - dmin*sumf_m
template <> struct Dot<Q2_K> {
    static constexpr int QK = 256, BYTES = 84, T = 16;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const int bq8 = 4 * (t / 8);
        const int soff = 8 * (t / 8) + (t % 8) / 4;
        const int v = ld_b4(b + 16, t);
        float sd = 0.0f, sm = 0.0f;
        for (int i = 0; i < 4; ++i) {
            const int sc = b[soff + 2 * i];
            const int u = q8i(q8, bq8 + i, t % 8);
            const float d8 = q8d(q8, bq8 + i);
            sd = __fmaf_rn(d8, i2f(__dp4a((v >> (2 * i)) & 0x03030303, u, 0) * (sc & 15)), sd);
            sm = __fmaf_rn(d8, i2f((sc >> 4) * __dp4a(0x01010101, u, 0)), sm);
        }
        return __fsub_rn(__fmul_rn(h2f(b + 80), sd), __fmul_rn(h2f(b + 82), sm));
    }
};

// Q3_K: sumf = fma(d8_i, float(dot_i*sc_i), sumf); d*sumf
template <> struct Dot<Q3_K> {
    static constexpr int QK = 256, BYTES = 110, T = 16;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const int bq8 = 4 * (t / 8);
        const int soff = 8 * (t / 8) + (t % 8) / 4;
        const uint8_t *scales = b + 96;
        const int vl = ld_b2(b + 32, t);
        const int vh = ~ld_b2(b, t % 8) >> bq8;
        float sf = 0.0f;
        for (int i = 0; i < 4; ++i) {
            const int isc = soff + 2 * i;
            const int lo = (scales[isc % 8] >> (4 * (isc / 8))) & 15;
            const int hi = ((scales[8 + isc % 4] >> (2 * (isc / 4))) & 3) << 4;
            const int sc = (lo | hi) - 32;
            const int vil = (vl >> (2 * i)) & 0x03030303;
            const int vih = ((vh >> i) << 2) & 0x04040404;
            const int vi = __vsubss4(vil, vih);
            sf = __fmaf_rn(q8d(q8, bq8 + i), i2f(__dp4a(vi, q8i(q8, bq8 + i, t % 8), 0) * sc), sf);
        }
        return __fmul_rn(h2f(b + 108), sf);
    }
};

// Q4_K / Q5_K scales of the pair of sub-blocks 2j, 2j+1 (get_scale_min_k4).
__device__ __forceinline__ void k4_scales(const uint8_t *sc12, int j, int sc[2], int m[2]) {
    const uint16_t *s = (const uint16_t *)sc12;
    uint16_t a0, a1;
    if (j < 2) {
        a0 = s[j] & 0x3f3f;
        a1 = s[j + 2] & 0x3f3f;
    } else {
        a0 = ((s[j + 2] >> 0) & 0x0f0f) | ((s[j - 2] & 0xc0c0) >> 2);
        a1 = ((s[j + 2] >> 4) & 0x0f0f) | ((s[j] & 0xc0c0) >> 2);
    }
    sc[0] = a0 & 0xff; sc[1] = a0 >> 8;
    m[0] = a1 & 0xff; m[1] = a1 >> 8;
}

// Q4_K / Q5_K combine: sumf_d = fma(d8_i, float(dot1_i*sc_i), sumf_d),
// sumf_m = fma(d8_i, float(dot2_i*m_i), sumf_m); d*sumf_d - dmin*sumf_m
__device__ __forceinline__ float k45_combine(const uint8_t *b, const uint8_t *q8, int t,
                                             const int v0[2], const int v1[2]) {
    const int bq8 = 2 * (t / 4);
    int sc[2], m[2];
    k4_scales(b + 4, t / 4, sc, m);
    float sd = 0.0f, smn = 0.0f;
    for (int i = 0; i < 2; ++i) {
        const int u0 = q8i(q8, bq8 + i, t % 4), u1 = q8i(q8, bq8 + i, t % 4 + 4);
        const int dot1 = __dp4a(v1[i], u1, __dp4a(v0[i], u0, 0));
        const int dot2 = __dp4a(0x01010101, u1, __dp4a(0x01010101, u0, 0));
        const float d8 = q8d(q8, bq8 + i);
        sd = __fmaf_rn(d8, i2f(dot1 * sc[i]), sd);
        smn = __fmaf_rn(d8, i2f(dot2 * m[i]), smn);
    }
    return __fsub_rn(__fmul_rn(h2f(b), sd), __fmul_rn(h2f(b + 2), smn));
}

template <> struct Dot<Q4_K> {
    static constexpr int QK = 256, BYTES = 144, T = 16;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const int *q4 = (const int *)(b + 16 + 32 * (t / 4) + 4 * (t % 4));
        const int a = q4[0], c = q4[4];
        const int v0[2] = {a & 0x0F0F0F0F, (a >> 4) & 0x0F0F0F0F};
        const int v1[2] = {c & 0x0F0F0F0F, (c >> 4) & 0x0F0F0F0F};
        return k45_combine(b, q8, t, v0, v1);
    }
};

template <> struct Dot<Q5_K> {
    static constexpr int QK = 256, BYTES = 176, T = 16;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const int bq8 = 2 * (t / 4);
        const int *ql = (const int *)(b + 48 + 32 * (t / 4) + 4 * (t % 4));
        const int *qh = (const int *)(b + 16 + 4 * (t % 4));
        const int a = ql[0], c = ql[4];
        const int h0 = qh[0] >> bq8, h1 = qh[4] >> bq8;
        int v0[2], v1[2];
        for (int i = 0; i < 2; ++i) {
            v0[i] = ((a >> (4 * i)) & 0x0F0F0F0F) | (((h0 >> i) << 4) & 0x10101010);
            v1[i] = ((c >> (4 * i)) & 0x0F0F0F0F) | (((h1 >> i) << 4) & 0x10101010);
        }
        return k45_combine(b, q8, t, v0, v1);
    }
};

// Q6_K: sumf = fma(d8_i, float(dot_i*sc_i), sumf); d*sumf
template <> struct Dot<Q6_K> {
    static constexpr int QK = 256, BYTES = 210, T = 32;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *) {
        const int bq8 = 4 * (t / 16) + (t % 16) / 8;
        const int soff = 8 * (t / 16) + (t % 16) / 4;
        const int vh_shift = 2 * ((t % 16) / 8);
        const int vl = ld_b2(b, t);
        const int vh = ld_b2(b + 128, 8 * (t / 16) + t % 8) >> vh_shift;
        const int8_t *scales = (const int8_t *)(b + 192);
        float sf = 0.0f;
        for (int i = 0; i < 2; ++i) {
            const int sc = scales[soff + 4 * i];
            const int vil = (vl >> (4 * i)) & 0x0F0F0F0F;
            const int vih = ((vh >> (4 * i)) << 4) & 0x30303030;
            const int vi = __vsubss4(vil | vih, 0x20202020);
            const int dq = __dp4a(vi, q8i(q8, bq8 + 2 * i, t % 8), 0);
            sf = __fmaf_rn(q8d(q8, bq8 + 2 * i), i2f(dq * sc), sf);
        }
        return __fmul_rn(h2f(b + 208), sf);
    }
};

// IQ4_XS: sumi *= ls - 32; (d*d8) * float(sumi)
template <> struct Dot<IQ4_XS> {
    static constexpr int QK = 256, BYTES = 136, T = 8;
    __device__ static float dot(const uint8_t *b, const uint8_t *q8, int t, const int8_t *tbl) {
        int sumi = 0;
        for (int j = 0; j < 4; ++j) {
            const uint32_t a = (uint32_t)ld_b4(b + 8, 4 * t + j);
            sumi = __dp4a(lut4(a, tbl), q8i(q8, t, j), sumi);
            sumi = __dp4a(lut4(a >> 4, tbl), q8i(q8, t, j + 4), sumi);
        }
        const int sh = ld_b2(b + 2, 0) & 0xffff;
        const int ls = ((b[4 + t / 2] >> (4 * (t & 1))) & 15) | (((sh >> (2 * t)) & 3) << 4);
        sumi *= ls - 32;
        return __fmul_rn(__fmul_rn(h2f(b), q8d(q8, t)), i2f(sumi));
    }
};

}  // namespace smv

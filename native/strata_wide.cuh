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
// * pair() (the K-quants and IQ4_XS) computes two chunks of one block that
//   share their bytes: pair index P (0..15) gives chunks lo(P) and
//   lo(P) + D, which read the same quant bytes (low and high nibbles) and
//   for IQ4_XS the same scale, so a thread loads and unpacks them once for
//   16 values. Each value is the same expression as in chunk(). IQ4_XS's
//   kv values come from a lookup kv(i) (KvArray here and in host_check;
//   the kernel passes a warp shuffle, dequant_wide.cu).
// Plain C++ as well, for host_check.cpp.
#pragma once

#include "strata_common.cuh"

namespace strata {

__device__ __forceinline__ bool finite_f32(float v) {
    return (as_u32(v) & 0x7F800000u) != 0x7F800000u;
}

// kv(i) of a 16-entry float table held in an array.
struct KvArray {
    const float *kv;
    __device__ __forceinline__ float operator()(uint32_t i) const { return kv[i]; }
};

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

// Q4_K and Q5_K: the 6-bit scales and mins of groups 2gp and 2gp + 1 from
// the 12 scale bytes at q (get_scale_min_k4 of both at once: the two groups
// are adjacent bytes of each scale word). sc, m: byte 0 for group 2gp,
// byte 1 for 2gp + 1.
__device__ __forceinline__ void scale_min_k4_pair(const uint8_t *q, int gp, uint32_t &sc, uint32_t &m) {
    const uint32_t *w = reinterpret_cast<const uint32_t *>(q);   // q is 4-byte aligned
    const int sh = 16 * (gp & 1);
    const uint32_t a = (w[0] >> sh) & 0xFFFFu, b = (w[1] >> sh) & 0xFFFFu, c = (w[2] >> sh) & 0xFFFFu;
    if (gp < 2) {        // groups 0..3: low 6 bits of q[j], q[j + 4]
        sc = a & 0x3F3Fu;
        m = b & 0x3F3Fu;
    } else {             // groups 4..7: nibbles of q[j + 4], top 2 bits of q[j - 4], q[j]
        sc = (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
        m = ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
    }
}

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
    // pair P: group pair gp = P/4, part p = P%4; chunks 8gp + p (group 2gp,
    // low nibbles) and 8gp + p + 4 (group 2gp + 1, high nibbles of the same
    // 8 qs bytes)
    static constexpr int D = 4;
    static __device__ __forceinline__ int lo(int P) { return 8 * (P >> 2) + (P & 3); }
    template <class KV>
    static __device__ __forceinline__ bool pair(const uint8_t *b, int P, const KV &, float *y0,
                                                float *y1) {
        const int gp = P >> 2, p = P & 3;
        uint32_t sc, m;
        scale_min_k4_pair(b + 4, gp, sc, m);
        const uint32_t h = *reinterpret_cast<const uint32_t *>(b);
        const float d = f16_to_f32(h & 0xFFFFu), dmin = f16_to_f32(h >> 16);
        const float d10 = mul(d, byte_minus(sc, 0, 8388608.0f)), d11 = mul(d, byte_minus(sc, 1, 8388608.0f));
        const float m10 = mul(dmin, byte_minus(m, 0, 8388608.0f)), m11 = mul(dmin, byte_minus(m, 1, 8388608.0f));
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 32 * gp + 8 * p);
        const uint32_t x0 = q.x & 0x0F0F0F0Fu, x1 = q.y & 0x0F0F0F0Fu;
        const uint32_t z0 = (q.x >> 4) & 0x0F0F0F0Fu, z1 = (q.y >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y0[k] = fma_rn(d10, byte_minus(x0, k, 8388608.0f), -m10);
            y0[4 + k] = fma_rn(d10, byte_minus(x1, k, 8388608.0f), -m10);
            y1[k] = fma_rn(d11, byte_minus(z0, k, 8388608.0f), -m11);
            y1[4 + k] = fma_rn(d11, byte_minus(z1, k, 8388608.0f), -m11);
        }
        return finite_f32(d10) && finite_f32(m10) && finite_f32(d11) && finite_f32(m11);
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
    // pairs as Q4_K's; the two groups take bits 2gp and 2gp + 1 of the same qh bytes
    static constexpr int D = 4;
    static __device__ __forceinline__ int lo(int P) { return 8 * (P >> 2) + (P & 3); }
    template <class KV>
    static __device__ __forceinline__ bool pair(const uint8_t *b, int P, const KV &, float *y0,
                                                float *y1) {
        const int gp = P >> 2, p = P & 3;
        uint32_t sc, m;
        scale_min_k4_pair(b + 4, gp, sc, m);
        const uint32_t h = *reinterpret_cast<const uint32_t *>(b);
        const float d = f16_to_f32(h & 0xFFFFu), dmin = f16_to_f32(h >> 16);
        const float d10 = mul(d, byte_minus(sc, 0, 8388608.0f)), d11 = mul(d, byte_minus(sc, 1, 8388608.0f));
        const float m10 = mul(dmin, byte_minus(m, 0, 8388608.0f)), m11 = mul(dmin, byte_minus(m, 1, 8388608.0f));
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 48 + 32 * gp + 8 * p);
        const uint2 qh = *reinterpret_cast<const uint2 *>(b + 16 + 8 * p);
        const uint32_t hx = qh.x >> (2 * gp), hy = qh.y >> (2 * gp);
        const uint32_t x0 = (q.x & 0x0F0F0F0Fu) | ((hx & 0x01010101u) << 4);
        const uint32_t x1 = (q.y & 0x0F0F0F0Fu) | ((hy & 0x01010101u) << 4);
        const uint32_t z0 = ((q.x >> 4) & 0x0F0F0F0Fu) | ((hx & 0x02020202u) << 3);
        const uint32_t z1 = ((q.y >> 4) & 0x0F0F0F0Fu) | ((hy & 0x02020202u) << 3);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y0[k] = fma_rn(d10, byte_minus(x0, k, 8388608.0f), -m10);
            y0[4 + k] = fma_rn(d10, byte_minus(x1, k, 8388608.0f), -m10);
            y1[k] = fma_rn(d11, byte_minus(z0, k, 8388608.0f), -m11);
            y1[4 + k] = fma_rn(d11, byte_minus(z1, k, 8388608.0f), -m11);
        }
        return finite_f32(d10) && finite_f32(m10) && finite_f32(d11) && finite_f32(m11);
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
    // pair P: h = P/8, t = (P/4)%2 (0 or 1), p = P%4; chunks 16h + 4t + p
    // (low nibbles of ql, qh bits 2t) and + 8 (t + 2: high nibbles of the
    // same ql bytes, qh bits 2t + 4 of the same qh bytes)
    static constexpr int D = 8;
    static __device__ __forceinline__ int lo(int P) { return 16 * (P >> 3) + 4 * ((P >> 2) & 1) + (P & 3); }
    template <class KV>
    static __device__ __forceinline__ bool pair(const uint8_t *b, int P, const KV &, float *y0,
                                                float *y1) {
        const int h = P >> 3, t = (P >> 2) & 1, p = P & 3;
        const float d = f16_to_f32(reinterpret_cast<const uint16_t *>(b)[104]);
        const float dl0 = mul(d, (float)(int8_t)b[192 + 8 * h + (p >> 1) + 2 * t]);
        const float dl1 = mul(d, (float)(int8_t)b[192 + 8 * h + (p >> 1) + 2 * t + 4]);
        const uint2 ql = load8_align2(b + 64 * h + 32 * t + 8 * p);
        const uint2 qh = load8_align2(b + 128 + 32 * h + 8 * p);
        const uint32_t hx = qh.x >> (2 * t), hy = qh.y >> (2 * t);
        const uint32_t x0 = (ql.x & 0x0F0F0F0Fu) | ((hx & 0x03030303u) << 4);
        const uint32_t x1 = (ql.y & 0x0F0F0F0Fu) | ((hy & 0x03030303u) << 4);
        const uint32_t z0 = ((ql.x >> 4) & 0x0F0F0F0Fu) | (hx & 0x30303030u);
        const uint32_t z1 = ((ql.y >> 4) & 0x0F0F0F0Fu) | (hy & 0x30303030u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y0[k] = mul(dl0, byte_minus(x0, k, 8388640.0f));
            y0[4 + k] = mul(dl0, byte_minus(x1, k, 8388640.0f));
            y1[k] = mul(dl1, byte_minus(z0, k, 8388640.0f));
            y1[4 + k] = mul(dl1, byte_minus(z1, k, 8388640.0f));
        }
        return finite_f32(dl0) && finite_f32(dl1);
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
    // pair P: ib = P/2, p = P%2; chunks 4ib + p (low nibbles) and 4ib + p + 2
    // (high nibbles of the same 8 qs bytes), one scale
    static constexpr int D = 2;
    static __device__ __forceinline__ int lo(int P) { return 4 * (P >> 1) + (P & 1); }
    template <class KV>
    static __device__ __forceinline__ bool pair(const uint8_t *b, int P, const KV &kv, float *y0,
                                                float *y1) {
        const int ib = P >> 1, p = P & 1;
        const uint32_t h = *reinterpret_cast<const uint32_t *>(b);
        const int ls = (int)(((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((h >> (16 + 2 * ib)) & 3) << 4));
        const float dl = mul(f16_to_f32(h & 0xFFFFu), (float)(ls - 32));
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 8 + 16 * ib + 8 * p);
        const uint32_t x0 = q.x & 0x0F0F0F0Fu, x1 = q.y & 0x0F0F0F0Fu;
        const uint32_t z0 = (q.x >> 4) & 0x0F0F0F0Fu, z1 = (q.y >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y0[k] = mul(dl, kv(perm(x0, 0, 0x4440u | (uint32_t)k)));
            y0[4 + k] = mul(dl, kv(perm(x1, 0, 0x4440u | (uint32_t)k)));
            y1[k] = mul(dl, kv(perm(z0, 0, 0x4440u | (uint32_t)k)));
            y1[4 + k] = mul(dl, kv(perm(z1, 0, 0x4440u | (uint32_t)k)));
        }
        return finite_f32(dl);
    }
};

}  // namespace strata

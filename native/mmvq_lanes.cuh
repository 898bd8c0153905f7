// Lane-group dots: one lane plays four canonical threads of one weight block.
//
// The canonical order (strata_ref/routes/mmvq.py) is a statement about 128
// threads: thread tid = T·g + t visits weight blocks g + BPI·i and adds the
// float dot of its sub-position t. Which hardware thread evaluates a dot does
// not enter the bits. Here lane p of a warp plays the threads tid = 4p + k,
// k = 0..3: four consecutive sub-positions t = 4j + k of one block group
// g = p / L (L = T/4 lanes per block, j = p % L). The four threads share
// their block, so the lane reads its bytes once with wide loads, unpacks the
// K-quant scales once, and evaluates the four dots with exactly the float
// steps of Dot<TYPE>::dot (mmvq_dots.cuh). The warp then holds all 128
// accumulators of its row and combines them in the canonical order.
//
// The weights reach the lanes through shared memory. One warp iteration (an
// "item": BPI consecutive blocks of one row) is a contiguous span of the
// weights; one lane of the warp copies it into a stage of the warp's ring
// with one bulk asynchronous copy (cp.async.bulk, completing on the stage's
// mbarrier), S items ahead of the one the lanes compute, and each lane then
// reads its own block's bytes from the stage (warp_rows, below). The copy
// costs the warp a handful of instructions per item instead of each lane's
// scattered 8- and 16-byte global loads, and keeps S items in flight without
// holding them in registers.
//
// The q8_1 column is staged once per CUDA block in a repacked layout (Q8Stage):
// the 8 quant ints of q8_1 block b as two int4 (16-byte aligned), d as float
// (exact fp16 -> f32), and for Q4_K the four integer pair sums of the block
// that thread k of a 4-thread group takes with dp4a(0x01010101, .) (exact
// integers, a property of the activations alone).
//
// Without CUDA (mmvq_host_check.cpp) the same code runs on the host, one
// warp's 32 lanes together (NL = 32 in warp_rows), the bulk copy a checked
// memcpy, so a CPU test checks the whole walk against the oracle bit for bit.
#pragma once

#include "mmvq_dots.cuh"

namespace smv {

// Four (two) 32-bit words loaded together.
struct W4 {
    uint32_t v[4];
};
struct W2 {
    uint32_t x, y;
};

// Loads from a stage of the weight ring or the staged q8_1 column (shared
// memory on the GPU).
#ifdef __CUDACC__
__device__ __forceinline__ W4 ld16(const uint8_t *p) {   // 16-byte aligned
    const uint4 u = *(const uint4 *)p;
    return W4{{u.x, u.y, u.z, u.w}};
}
__device__ __forceinline__ W4 ld8x2(const uint8_t *p) {  // 8-byte aligned
    const uint2 a = ((const uint2 *)p)[0], b = ((const uint2 *)p)[1];
    return W4{{a.x, a.y, b.x, b.y}};
}
__device__ __forceinline__ uint32_t ld4(const uint8_t *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ W2 ld8(const uint8_t *p) {   // 8-byte aligned
    const uint2 u = *(const uint2 *)p;
    return W2{u.x, u.y};
}
__device__ __forceinline__ uint32_t ld2(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ int ld1s(const uint8_t *p) { return *(const int8_t *)p; }
#else
// Host build (the CPU tests): every load checks its alignment (a GPU would
// fault) and, while a test has set the ranges of host_reads(), that it
// reads inside one of them (the weights, the q8_1 column, the warp's ring);
// failures are counted for the test to report.
struct HostReads {
    const uint8_t *lo[3] = {nullptr, nullptr, nullptr}, *hi[3] = {nullptr, nullptr, nullptr};
    int misaligned = 0, outside = 0;
};
inline HostReads &host_reads() {
    static HostReads r;
    return r;
}
inline void host_read(const uint8_t *p, int n, int align) {
    HostReads &r = host_reads();
    if ((uintptr_t)p % align) ++r.misaligned;
    bool in = !r.hi[0];
    for (int i = 0; i < 3 && !in; ++i) in = r.hi[i] && p >= r.lo[i] && p + n <= r.hi[i];
    if (!in) ++r.outside;
}
inline W4 ld16(const uint8_t *p) { host_read(p, 16, 16); W4 w; std::memcpy(w.v, p, 16); return w; }
inline W4 ld8x2(const uint8_t *p) { host_read(p, 16, 8); W4 w; std::memcpy(w.v, p, 16); return w; }
inline uint32_t ld4(const uint8_t *p) { host_read(p, 4, 4); uint32_t v; std::memcpy(&v, p, 4); return v; }
inline W2 ld8(const uint8_t *p) { host_read(p, 8, 8); W2 v; std::memcpy(&v, p, 8); return v; }
inline uint32_t ld2(const uint8_t *p) { host_read(p, 2, 2); uint16_t v; std::memcpy(&v, p, 2); return v; }
inline int ld1s(const uint8_t *p) { host_read(p, 1, 1); return (int8_t)*p; }
#endif

// 16 bytes at p, where p is only 2-byte aligned (Q6_K's 210-byte blocks;
// the ring keeps the weights' alignment mod 16): the five words from p
// rounded down to 4, realigned by byte permutes (selector 0x3210 or 0x5432).
// Reads at most 4 bytes past p + 16.
__device__ __forceinline__ W4 ld16_w(const uint8_t *p) {
    // pointer arithmetic, not an integer round trip: the compiler then still
    // sees a shared-memory address and emits shared loads
    const uint8_t *a = p - ((uintptr_t)p & 3);
    const uint32_t sel = ((uintptr_t)p & 2) ? 0x5432u : 0x3210u;
    uint32_t x[5];
    for (int m = 0; m < 5; ++m) x[m] = ld4(a + 4 * m);
    W4 r;
    for (int m = 0; m < 4; ++m) r.v[m] = prmt(x[m], x[m + 1], sel);
    return r;
}

// PTX prmt.b32 with selectors whose nibbles may have bit 3 set: that byte of
// the result is then the sign of the byte bits 0-2 select, replicated (0x00
// or 0xFF). The host emulates that mode too (prmt() in mmvq_dots.cuh is
// only ever given clear bits 3). Only the selector's low 16 bits count.
__device__ __forceinline__ uint32_t prmt_sx(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
    return prmt(x, y, s);
#else
    const uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; ++n) {
        const uint32_t c = (s >> (4 * n)) & 15;
        uint32_t byte = (uint32_t)(v >> (8 * (c & 7))) & 0xFF;
        if (c & 8) byte = (byte & 0x80) ? 0xFF : 0;
        r |= byte << (8 * n);
    }
    return r;
#endif
}

// Pins a value in a register: ptxas cannot recompute what an asm statement
// produced, so per-lane and per-warp constants computed once before the
// item loop stay in registers instead of being rebuilt from the kernel
// parameters and the lane index on every item (it did that, about 40
// instructions per item, though registers were free).
__device__ __forceinline__ void keep(int &x) {
#ifdef __CUDA_ARCH__
    asm volatile("mov.b32 %0, %0;" : "+r"(x));
#else
    (void)x;
#endif
}
__device__ __forceinline__ void keep(uint32_t &x) {
#ifdef __CUDA_ARCH__
    asm volatile("mov.b32 %0, %0;" : "+r"(x));
#else
    (void)x;
#endif
}
__device__ __forceinline__ void keep(long long &x) {
#ifdef __CUDA_ARCH__
    asm volatile("mov.b64 %0, %0;" : "+l"(x));
#else
    (void)x;
#endif
}
__device__ __forceinline__ void keep(const uint8_t *&p) {
#ifdef __CUDA_ARCH__
    asm volatile("mov.b64 %0, %0;" : "+l"(p));
#else
    (void)p;
#endif
}

// Shared-memory position of 16-byte chunk c of the staged ints (block b's
// ints 0..3 are chunk 2b, ints 4..7 chunk 2b+1). The XOR swizzle spreads
// the chunks that the 8 lanes of one 128-bit access phase read over all 8
// bank groups, for the access patterns of all three lane layouts below.
__device__ __forceinline__ int q8_chunk(int c) {
    const int key = c >> 3;
    return c ^ ((key ^ ((key & 1) << 2)) & 7);
}

// The staged q8_1 column (see above). Lane accessors take the lane's
// iteration `it` (blocks g + BPI·it): a lane's chunks at iteration it are its
// chunks at iteration 0 plus it·16·BPI (a multiple of 64, which the swizzle
// leaves in place), so the swizzle is computed once per lane.
struct Q8Stage {
    const W4 *q;       // swizzled 16-byte chunks of the quant ints
    const float *dv;   // d per block
    const W4 *s4;      // Q4_K: pair sums of ints (k, k+4), k = 0..3, per block (swizzled)
};

template <int TYPE> struct Lanes;

// float(a * b) for |a * b| < 2^22, bit for bit __int2float_rn's: the
// product's own integer multiply-add forms 2^23 + 2^22 + a*b as the bits of
// a float in [2^23, 2^24) (where the floats are the integers, so that float
// is exact), and one FADD subtracts 2^23 + 2^22 exactly. It replaces the
// I2FP conversion after the product (measured on the H200: Q6_K about 1 %
// less time; Q4_K none, so it keeps i2f).
__device__ __forceinline__ float i2f_prod(int a, int b) {
    return __fsub_rn(__uint_as_float((uint32_t)(a * b) + 0x4B400000u), 12582912.0f);
}

// Q4_K: L = 4 lanes per super-block; lane j has qs ints 8j..8j+7 (sub-blocks
// 2j, 2j+1) and the 16-byte head (d, dmin, scales).
template <> struct Lanes<Q4_K> {
    static constexpr int L = 4, SUMS = 1, PAIRS = 0, BPI = 128 / Dot<Q4_K>::T;
    struct Raw { W4 head, a, c; };
    __device__ static Tbl16 table(const Tbl16 &t) { return t; }
    // per-lane constants: chunk / block offsets at iteration 0 and the scale masks
    struct Lane {
        int lo[2], hi[2], s[2], d, hs, sx;
        uint32_t mx, mz;
        __device__ void keep_all() {
            for (int i = 0; i < 2; ++i) keep(lo[i]), keep(hi[i]), keep(s[i]);
            keep(d), keep(hs), keep(sx), keep(mx), keep(mz);
        }
    };
    __device__ static Lane lane(int g, int j) {
        Lane l;
        const int b0 = 8 * g + 2 * j;
        for (int i = 0; i < 2; ++i) {
            l.lo[i] = q8_chunk(2 * (b0 + i));
            l.hi[i] = q8_chunk(2 * (b0 + i) + 1);
            l.s[i] = q8_chunk(b0 + i);
        }
        l.d = b0;
        // get_scale_min_k4 of pair j: j < 2 takes the low 6 bits of s[j], s[j+2];
        // j >= 2 the nibbles of s[j+2] and the top 2 bits of s[j-2], s[j]
        l.hs = 16 * (j & 1);
        l.mx = j < 2 ? 0x3f3fu : 0xc0c0u;
        l.sx = j < 2 ? 0 : 2;
        l.mz = j < 2 ? 0u : 0x0f0fu;
        return l;
    }
    __device__ static Raw load(const uint8_t *b, const Lane &, int j) {
        return Raw{ld16(b), ld16(b + 16 + 32 * j), ld16(b + 32 + 32 * j)};
    }
    __device__ static void dots(const Raw &r, const Q8Stage &q, const Lane &l, int it, float out[4],
                                const Tbl16 &) {
        // u16 scale words s[0..5] are head words 1..3; x, y, z = s[j%2], s[2+j%2], s[4+j%2]
        const uint32_t x = r.head.v[1] >> l.hs, y = r.head.v[2] >> l.hs, z = r.head.v[3] >> l.hs;
        const uint32_t a0 = ((x & l.mx) >> l.sx) | (z & l.mz);
        const uint32_t a1 = ((y & l.mx) >> l.sx) | ((z >> 4) & l.mz);
        const int sc[2] = {(int)(a0 & 0xff), (int)((a0 >> 8) & 0xff)};
        const int mn[2] = {(int)(a1 & 0xff), (int)((a1 >> 8) & 0xff)};
        const float dw = hb2f(r.head.v[0]), dmin = hb2f(r.head.v[0] >> 16);
        const int cq = 16 * BPI * it, cb = 8 * BPI * it;
        W4 ulo[2], uhi[2], s4[2];
        float d8[2];
        for (int i = 0; i < 2; ++i) {
            ulo[i] = q.q[l.lo[i] + cq];
            uhi[i] = q.q[l.hi[i] + cq];
            s4[i] = q.s4[l.s[i] + cb];
            d8[i] = q.dv[l.d + i + cb];
        }
        for (int k = 0; k < 4; ++k) {
            const int a = (int)r.a.v[k], c = (int)r.c.v[k];
            const int v0[2] = {a & 0x0F0F0F0F, (a >> 4) & 0x0F0F0F0F};
            const int v1[2] = {c & 0x0F0F0F0F, (c >> 4) & 0x0F0F0F0F};
            float sd = 0.0f, smn = 0.0f;
            for (int i = 0; i < 2; ++i) {
                const int dot1 = __dp4a(v1[i], (int)uhi[i].v[k], __dp4a(v0[i], (int)ulo[i].v[k], 0));
                const int dot2 = (int)s4[i].v[k];
                sd = __fmaf_rn(d8[i], i2f(dot1 * sc[i]), sd);
                smn = __fmaf_rn(d8[i], i2f(dot2 * mn[i]), smn);
            }
            out[k] = __fsub_rn(__fmul_rn(dw, sd), __fmul_rn(dmin, smn));
        }
    }
};

#ifndef STRATA_Q6K_FOLD
#define STRATA_Q6K_FOLD 0
#endif

// Q6_K: L = 8; lane j has ql ints 4j..4j+3, qh ints 8(j/4)+4(j%2)+0..3 and
// the two scales 8(j/4)+(j%4), +4. A super-block (210 bytes) may start at
// any even offset mod 16 in its stage: the 16-byte loads realign (ld16_w).
template <> struct Lanes<Q6_K> {
    static constexpr int L = 8, SUMS = 0, PAIRS = 0, BPI = 128 / Dot<Q6_K>::T;
    struct Raw { W4 ql, qh; int s0, s1; uint32_t d; };
    __device__ static Tbl16 table(const Tbl16 &t) { return t; }
    struct Lane {
        int u[2], d[2], vh_shift, soff, qh_off;
        __device__ void keep_all() {
            for (int i = 0; i < 2; ++i) keep(u[i]), keep(d[i]);
            keep(vh_shift), keep(soff), keep(qh_off);
        }
    };
    __device__ static Lane lane(int g, int j) {
        Lane l;
        const int bq = 8 * g + 4 * (j / 4) + (j % 4) / 2;
        for (int i = 0; i < 2; ++i) {
            l.u[i] = q8_chunk(2 * (bq + 2 * i) + (j % 2));
            l.d[i] = bq + 2 * i;
        }
        l.vh_shift = 2 * ((j % 4) / 2);
        l.soff = 192 + 8 * (j / 4) + (j % 4);
        l.qh_off = 128 + 32 * (j / 4) + 16 * (j % 2);
        return l;
    }
    __device__ static Raw load(const uint8_t *b, const Lane &l, int j) {
        Raw r;
        r.ql = ld16_w(b + 16 * j);
        r.qh = ld16_w(b + l.qh_off);
        r.s0 = ld1s(b + l.soff);
        r.s1 = ld1s(b + l.soff + 4);
        r.d = ld2(b + 208);
        return r;
    }
    __device__ static void dots(const Raw &r, const Q8Stage &q, const Lane &l, int it, float out[4],
                                const Tbl16 &) {
        const int cq = 16 * BPI * it, cb = 8 * BPI * it;
        const int sc[2] = {r.s0, r.s1};
        W4 u[2];
        float d8[2];
        for (int i = 0; i < 2; ++i) {
            u[i] = q.q[l.u[i] + cq];
            d8[i] = q.dv[l.d[i] + cb];
        }
        const float d = hb2f(r.d);
        for (int k = 0; k < 4; ++k) {
            const int vl = (int)r.ql.v[k], vh = (int)r.qh.v[k] >> l.vh_shift;
            float sf = 0.0f;
            for (int i = 0; i < 2; ++i) {
                const int vil = (vl >> (4 * i)) & 0x0F0F0F0F;
                const int vih = ((vh >> (4 * i)) << 4) & 0x30303030;
#if STRATA_Q6K_FOLD
                // sum (x - 32)·u = sum x·u - 32·sum u: one more dp4a instead
                // of the byte subtraction (the same integer)
                const int dq = __dp4a(vil | vih, (int)u[i].v[k], __dp4a((int)0xE0E0E0E0, (int)u[i].v[k], 0));
#else
                // __vsubss4(x, 0x20202020) for bytes x in 0..63 (never saturates):
                // byte x + 0x60 stays below 0x100, and ^ 0x80 then gives x - 32.
                const int vi = (int)(((uint32_t)(vil | vih) + 0x60606060u) ^ 0x80808080u);
                const int dq = __dp4a(vi, (int)u[i].v[k], 0);
#endif
                // |dq·sc| <= 4·32·128·128 = 2^21: inside i2f_prod's range
                sf = __fmaf_rn(d8[i], i2f_prod(dq, sc[i]), sf);
            }
            out[k] = __fmul_rn(d, sf);
        }
    }
};

// IQ4_XS: L = 2; lane h has qs ints 16h..16h+15 (sub-blocks 4h..4h+3) and
// the 8-byte head (d, scales_h, scales_l). Its q8_1 ints are staged in pairs
// (PAIRS): the bytes of ints m and m+4 interleaved (word 2m: bytes 0, 1 of
// both, word 2m+1: bytes 2, 3), the order in which a byte permute with
// selector nibbles L0 H0 L1 H1 returns the values of two qs bytes.
//
// The table lookup is two sign-mode byte permutes per four nibbles, summed
// by dp4a. The IQ4_NL values are negative at indices 0-7 and in 1..113 at
// 8-15 (a CPU test checks the table). With the table words {kv[0..7],
// kv[8..15] + 1} (table()):
//   A = prmt_sx(kv[0..7], q): kv[q] where q < 8; where bit 3 is set, the sign
//       of a negative entry, -1;
//   B = prmt_sx(kv[8..15] + 1, q ^ 8): kv[q] + 1 where q >= 8; else the sign
//       of a positive entry, 0;
// so A + B = kv[q] per byte, and dp4a(A, u, dp4a(B, u, s)) adds exactly the
// integers dp4a(kv[q], u, s) adds. Per qs word that is 4 permutes, one XOR
// and two shifts (the permute reads only its selector's low 16 bits) against
// 6 permutes and 6-8 masks and shifts of the three-permute lookup (lut8):
// the lookup was IQ4_XS's largest share of the integer ALU pipe.
template <> struct Lanes<IQ4_XS> {
    static constexpr int L = 2, SUMS = 0, PAIRS = 1, BPI = 128 / Dot<IQ4_XS>::T;
    struct Raw { W2 h; W4 qs[4]; };
    struct Lane {
        int lo[4], hi[4], d, h;
        __device__ void keep_all() {
            for (int k = 0; k < 4; ++k) keep(lo[k]), keep(hi[k]);
            keep(d), keep(h);
        }
    };
    // kv[8..15] + 1 stays below 128, so the bytes never carry
    __device__ static Tbl16 table(const Tbl16 &t) {
        return Tbl16{{t.w[0], t.w[1], t.w[2] + 0x01010101u, t.w[3] + 0x01010101u}};
    }
    __device__ static Lane lane(int g, int h) {
        Lane l;
        for (int k = 0; k < 4; ++k) {
            l.lo[k] = q8_chunk(2 * (8 * g + 4 * h + k));
            l.hi[k] = q8_chunk(2 * (8 * g + 4 * h + k) + 1);
        }
        l.d = 8 * g + 4 * h;
        l.h = h;
        return l;
    }
    // b: the block in its stage, 8-byte aligned (136-byte blocks)
    __device__ static Raw load(const uint8_t *b, const Lane &, int h) {
        Raw r;
        r.h = ld8(b);
        for (int m = 0; m < 4; ++m) r.qs[m] = ld8x2(b + 8 + 64 * h + 16 * m);
        return r;
    }
    __device__ static void dots(const Raw &r, const Q8Stage &q, const Lane &l, int it, float out[4],
                                const Tbl16 &tbl) {
        const int cq = 16 * BPI * it, cb = 8 * BPI * it;
        const float d = hb2f(r.h.x);
        const uint32_t sh = r.h.x >> (16 + 8 * l.h), sl = r.h.y >> (16 * l.h);
        for (int k = 0; k < 4; ++k) {
            // paired ints of q8_1 block 4h + k: words 2m, 2m+1 for qs word m
            const W4 p01 = q.q[l.lo[k] + cq], p23 = q.q[l.hi[k] + cq];
            int sumi = 0;
            for (int m = 0; m < 4; ++m) {
                const uint32_t a = r.qs[k].v[m], x = a ^ 0x88888888u;
                const W4 &pp = m < 2 ? p01 : p23;
                const int u0 = (int)pp.v[2 * (m % 2)], u1 = (int)pp.v[2 * (m % 2) + 1];
                sumi = __dp4a((int)prmt_sx(tbl.w[0], tbl.w[1], a), u0, sumi);
                sumi = __dp4a((int)prmt_sx(tbl.w[2], tbl.w[3], x), u0, sumi);
                sumi = __dp4a((int)prmt_sx(tbl.w[0], tbl.w[1], a >> 16), u1, sumi);
                sumi = __dp4a((int)prmt_sx(tbl.w[2], tbl.w[3], x >> 16), u1, sumi);
            }
            // scale of sub-block t = 4h + k: nibble t of scales_l, bits 2t..2t+1 of scales_h
            const int ls = (int)(((sl >> (4 * k)) & 15) | (((sh >> (2 * k)) & 3) << 4));
            sumi *= ls - 32;
            out[k] = __fmul_rn(__fmul_rn(d, q.dv[l.d + k + cb]), i2f(sumi));
        }
    }
};

// ---- the warp's weight ring -----------------------------------------------
// An item is IPI consecutive iterations of one row (IPI·BPI blocks; a row's
// last item may have fewer). Each stage holds one item's span rounded out to
// 16-byte boundaries (a Q6_K or IQ4_XS span starts at any even or 8-byte
// offset): ring_copy_bytes(), which every copy but those at the end of the
// weights moves whole, so that its size is a constant.
#ifndef STRATA_LANES_IPI_Q4K
#define STRATA_LANES_IPI_Q4K 2
#endif
#ifndef STRATA_LANES_IPI_Q6K
#define STRATA_LANES_IPI_Q6K 2
#endif
#ifndef STRATA_LANES_IPI_IQ4XS
#define STRATA_LANES_IPI_IQ4XS 2
#endif
template <int TYPE> __host__ __device__ constexpr int lane_ipi() {
    return TYPE == Q4_K ? STRATA_LANES_IPI_Q4K : TYPE == Q6_K ? STRATA_LANES_IPI_Q6K : STRATA_LANES_IPI_IQ4XS;
}
template <int TYPE, int IPI = lane_ipi<TYPE>()> __host__ __device__ constexpr int ring_copy_bytes() {
    return (IPI * Lanes<TYPE>::BPI * Dot<TYPE>::BYTES + 15) / 16 * 16 + 16;
}
template <int TYPE, int IPI = lane_ipi<TYPE>()> __host__ __device__ constexpr int ring_stage_bytes() {
    return ring_copy_bytes<TYPE, IPI>();
}

// The kernel's dynamic shared memory, addressed by byte offsets: the ring's
// stages and barriers are offsets, so that every read of a stage is a
// shared-memory load with a 32-bit address (through a generic pointer the
// compiler emitted generic 64-bit loads). The host emulation points
// host_smem() at a buffer of its own.
#ifdef __CUDACC__
extern __shared__ __align__(16) uint8_t smv_smem[];
__device__ __forceinline__ const uint8_t *smem_at(int off) { return smv_smem + off; }
__device__ __forceinline__ uint32_t smem_addr(int off) {
    return (uint32_t)__cvta_generic_to_shared(smv_smem) + (uint32_t)off;
}
__device__ __forceinline__ void mbar_init(int bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
// makes the initialised barriers visible to the bulk copies
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// waits until the barrier's phase with this parity has completed (the
// memory clobber keeps the stage's reads after it)
__device__ __forceinline__ void mbar_wait(int bar, uint32_t parity) {
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "WAIT_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra WAIT_%=;\n}" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void mbar_arrive(int bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// one lane: `bytes` (a multiple of 16) from 16-byte aligned global `src` to
// the 16-byte aligned shared offset `dst`, completing the barrier's phase
__device__ __forceinline__ void bulk_copy(int dst, const uint8_t *src, int bytes, int bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}
__device__ __forceinline__ void smem_put(int off, uint8_t v) { smv_smem[off] = v; }
__device__ __forceinline__ void warp_sync() { __syncwarp(); }
#else
inline uint8_t *&host_smem() {
    static uint8_t *p = nullptr;
    return p;
}
inline const uint8_t *smem_at(int off) { return host_smem() + off; }
// Host: the copy happens at once, so there is nothing to wait for.
inline void mbar_init(int) {}
inline void mbar_init_fence() {}
inline void mbar_wait(int, uint32_t) {}
inline void mbar_arrive(int) {}
inline void bulk_copy(int dst, const uint8_t *src, int bytes, int) {
    host_read(src, bytes, 16);
    host_read(smem_at(dst), bytes, 16);   // the stage must hold it
    if (bytes % 16) ++host_reads().misaligned;
    std::memcpy(host_smem() + dst, src, (size_t)bytes);
}
inline void smem_put(int off, uint8_t v) { host_smem()[off] = v; }
inline void warp_sync() {}
#endif

// One warp's walk: weights w (rows x nb blocks, 16-byte aligned) ending at
// w_end; the warp's rows row0, row0 + rstep, ... below `rows`; n_item items
// per row, the last one last_bytes long; row_jump from the start of a row's
// last item to the start of the warp's next row; S stages at shared offset
// `ring`, their mbarriers at `bar`. An item that starts before safe_end has
// its whole fixed-size copy inside the weights.
template <int TYPE> struct WarpWalk {
    const uint8_t *w, *w_end, *safe_end;
    long long rows, rstep, rbytes, row_jump;
    int nb, n_item, last_bytes, S, ring, bar;
};
template <int TYPE, int IPI = lane_ipi<TYPE>()>
__host__ __device__ inline WarpWalk<TYPE> warp_walk(const uint8_t *w, long long rows, int nb, long long rstep,
                                                    int S, int ring, int bar) {
    constexpr int ITEM = IPI * Lanes<TYPE>::BPI;   // blocks per whole item
    const long long rbytes = (long long)nb * Dot<TYPE>::BYTES;
    const int n_item = (nb + ITEM - 1) / ITEM;
    const uint8_t *w_end = w + rows * rbytes;
    return WarpWalk<TYPE>{w, w_end, w_end - ring_copy_bytes<TYPE, IPI>(), rows, rstep, rbytes,
                          rstep * rbytes - (long long)(n_item - 1) * ITEM * Dot<TYPE>::BYTES, nb, n_item,
                          (nb - (n_item - 1) * ITEM) * Dot<TYPE>::BYTES, S, ring, bar};
}

// The next item to copy: it starts at p and is item `it` of its row (p at or
// past w_end: the warp has no item left).
struct ItemCursor {
    const uint8_t *p;
    int it;
};

// Copies the cursor's item (if the warp has one left) into the stage at
// shared offset `dst` with barrier `bar`, and moves the cursor on (past the
// end, moving on changes nothing that is used). Lane 0
// copies ring_copy_bytes() from the item's start rounded down to 16 with
// one bulk copy. Near the end of the weights (from safe_end on) it copies
// only the item's own span rounded out to 16 bytes, and where even that
// would pass the end of the weights (the matrix's last item, when the
// weights' size is not a multiple of 16), the lanes copy the span byte by
// byte and lane 0 completes the phase with a plain arrive. Lanes lane0 ..
// lane0 + NL - 1 of the warp run this (NL = 1 on the GPU, 32 on the host);
// all values here are the same in every lane.
template <int TYPE, int NL, int IPI = lane_ipi<TYPE>()>
__device__ __forceinline__ void ring_issue(const WarpWalk<TYPE> &wk, ItemCursor &c, int dst, int bar,
                                           int lane0) {
    constexpr int ITEM_BYTES = IPI * Lanes<TYPE>::BPI * Dot<TYPE>::BYTES;
    const int lead = (int)((uintptr_t)c.p & 15);
    if (c.p < wk.safe_end) {
        if (lane0 == 0) bulk_copy(dst, c.p - lead, ring_copy_bytes<TYPE, IPI>(), bar);
    } else if (c.p < wk.w_end) {
        const int nbytes = c.it + 1 == wk.n_item ? wk.last_bytes : ITEM_BYTES;
        const int env = (lead + nbytes + 15) & ~15;
        if (c.p - lead + env <= wk.w_end) {
            if (lane0 == 0) bulk_copy(dst, c.p - lead, env, bar);
        } else {
            for (int i = 0; i < NL; ++i)
                for (int b = lane0 + i; b < nbytes; b += 32) {
#ifndef __CUDACC__
                    host_read(c.p + b, 1, 1);
#endif
                    smem_put(dst + lead + b, c.p[b]);
                }
            warp_sync();
            if (lane0 == 0) mbar_arrive(bar);
        }
    }
    if (++c.it == wk.n_item) {
        c.it = 0;
        c.p += wk.row_jump;
    } else {
        c.p += ITEM_BYTES;
    }
}

// Initialises the warp's barriers and copies its first `pre` items
// (pre <= S): the kernel does this before it stages the q8_1 column.
template <int TYPE, int NL, int IPI = lane_ipi<TYPE>()>
__device__ __forceinline__ ItemCursor ring_start(const WarpWalk<TYPE> &wk, long long row0, int lane0,
                                                 int pre) {
    constexpr int RB = ring_stage_bytes<TYPE, IPI>();
    if (lane0 == 0) {
        for (int s = 0; s < wk.S; ++s) mbar_init(wk.bar + 8 * s);
        mbar_init_fence();
    }
    warp_sync();
    ItemCursor c{wk.w + row0 * wk.rbytes, 0};
    for (int s = 0; s < pre; ++s) ring_issue<TYPE, NL, IPI>(wk, c, wk.ring + s * RB, wk.bar + 8 * s, lane0);
    return c;
}

// The lanes lane0 .. lane0 + NL - 1 of one warp over the warp's rows (NL = 1
// on the GPU, where each lane runs this; 32 on the host, which runs the
// warp's lanes together, phase by phase, as the GPU does). Per row, each
// lane's four threads' sums over blocks g + BPI·it (it < n_it; none when
// >= nb), then on_row(row, lane, acc) for every lane (the kernel combines
// the warp's 128 sums there; all lanes call it at the same time).
// Item q sits in stage q mod S. Per item: wait for its copy; per iteration
// of it, read each lane's block from the stage and evaluate the dots; after
// the last read of the stage, sync the warp (every lane has read it) and
// copy item q + S into the same stage. ring_start copied the first `pre`
// items; the rest of the first S follow here.
template <int TYPE, int NL, int IPI = lane_ipi<TYPE>(), class OnRow>
__device__ __forceinline__ void warp_rows(WarpWalk<TYPE> wk, ItemCursor c, int pre, long long row0,
                                          int lane0, const Q8Stage &qs, const Tbl16 &tbl,
                                          OnRow on_row) {
    using LN = Lanes<TYPE>;
    constexpr int BPI = LN::BPI, SPAN = BPI * Dot<TYPE>::BYTES, RB = ring_stage_bytes<TYPE, IPI>();
    const int nb = wk.nb, n_it = (nb + BPI - 1) / BPI;
    int g[NL], j[NL];
    typename LN::Lane ln[NL];
    for (int i = 0; i < NL; ++i) {
        g[i] = (lane0 + i) / LN::L;
        j[i] = (lane0 + i) % LN::L;
        ln[i] = LN::lane(g[i], j[i]);
        ln[i].keep_all();
        keep(g[i]);
    }
    for (int s = pre; s < wk.S; ++s) ring_issue<TYPE, NL, IPI>(wk, c, wk.ring + s * RB, wk.bar + 8 * s, lane0);
    keep(wk.w_end), keep(wk.safe_end), keep(wk.row_jump), keep(wk.n_item), keep(wk.last_bytes);
    int s = 0, stage = wk.ring;
    uint32_t parity = 0;
    // an item's offset in its stage: its start mod 16 (w is 16-byte aligned)
    const int jump16 = (int)((wk.rstep * wk.rbytes) & 15);
    int off_row = (int)((row0 * wk.rbytes) & 15);
    for (long long row = row0; row < wk.rows; row += wk.rstep) {
        float acc[NL][4];
        for (int i = 0; i < NL; ++i)
            for (int k = 0; k < 4; ++k) acc[i][k] = 0.0f;
        int off = off_row;
        for (int it0 = 0; it0 < n_it; it0 += IPI) {
            mbar_wait(wk.bar + 8 * s, parity);
#pragma unroll
            for (int ii = 0; ii < IPI; ++ii) {
                const int it = it0 + ii;
                if (ii > 0 && it >= n_it) break;
                typename LN::Raw cur[NL];
                // a lane without a block in this iteration (only the row's last
                // can lack one) reads bytes of the stage that belong to no
                // block of it, and evaluates and discards dots on the staged
                // q8_1 zero padding
                for (int i = 0; i < NL; ++i)
                    cur[i] = LN::load(smem_at(stage + off + ii * SPAN + g[i] * Dot<TYPE>::BYTES), ln[i], j[i]);
                if (ii == IPI - 1 || it + 1 == n_it) {
                    warp_sync();
                    ring_issue<TYPE, NL, IPI>(wk, c, stage, wk.bar + 8 * s, lane0);
                }
                for (int i = 0; i < NL; ++i) {
                    float o[4];
                    LN::dots(cur[i], qs, ln[i], it, o, tbl);
                    const bool mine = g[i] + BPI * it < nb;
                    for (int k = 0; k < 4; ++k) acc[i][k] = mine ? __fadd_rn(acc[i][k], o[k]) : acc[i][k];
                }
            }
            off = (off + IPI * SPAN) & 15;
            stage += RB;
            if (++s == wk.S) {
                s = 0;
                stage = wk.ring;
                parity ^= 1;
            }
        }
        off_row = (off_row + jump16) & 15;
        for (int i = 0; i < NL; ++i) on_row(row, lane0 + i, acc[i]);
    }
}

// q8_1 blocks staged for a column of nb weight blocks: whole iterations of
// BPI weight blocks (a multiple of 8), so that the lanes without a block in
// the last iteration read staged zeros, inside the column.
template <int TYPE> __host__ __device__ constexpr int lane_q8_blocks(int nb) {
    static_assert(Lanes<TYPE>::BPI * (Dot<TYPE>::QK / 32) % 8 == 0, "swizzle groups of 8 chunks");
    return (nb + Lanes<TYPE>::BPI - 1) / Lanes<TYPE>::BPI * Lanes<TYPE>::BPI * (Dot<TYPE>::QK / 32);
}

// Stage one q8_1 column of nq8 blocks (36 bytes each, 4-byte aligned) into
// Q8Stage's layout (s_q: 2·npad chunks, s_d: npad floats, s_sum: npad
// chunks when SUMS), blocks nq8..npad-1 as zeros. With PAIRS the quant ints
// u0..u7 are stored as the byte pairs of (u_m, u_m+4), m = 0..3: word 2m =
// bytes 0, 1 of both, word 2m+1 = bytes 2, 3. One thread per q8_1 block:
// its nine words load together.
template <int SUMS, int PAIRS>
__device__ __forceinline__ void stage_q8(const uint8_t *q8, int nq8, int npad, W4 *s_q,
                                         float *s_d, W4 *s_sum, int i0, int step) {
    for (int b = i0; b < npad; b += step) {
        uint32_t v[9] = {};
        if (b < nq8)
            for (int m = 0; m < 9; ++m) v[m] = ld4(q8 + 36 * b + 4 * m);
        s_d[b] = hb2f(v[0]);
        if (PAIRS) {
            uint32_t p[8];
            for (int m = 0; m < 4; ++m) {
                p[2 * m] = prmt(v[1 + m], v[5 + m], 0x5140u);
                p[2 * m + 1] = prmt(v[1 + m], v[5 + m], 0x7362u);
            }
            s_q[q8_chunk(2 * b)] = W4{{p[0], p[1], p[2], p[3]}};
            s_q[q8_chunk(2 * b + 1)] = W4{{p[4], p[5], p[6], p[7]}};
        } else {
            s_q[q8_chunk(2 * b)] = W4{{v[1], v[2], v[3], v[4]}};
            s_q[q8_chunk(2 * b + 1)] = W4{{v[5], v[6], v[7], v[8]}};
        }
        if (SUMS) {
            W4 s;
            for (int k = 0; k < 4; ++k)
                s.v[k] = (uint32_t)__dp4a(0x01010101, (int)v[5 + k], __dp4a(0x01010101, (int)v[1 + k], 0));
            s_sum[q8_chunk(b)] = s;
        }
    }
}

}  // namespace smv

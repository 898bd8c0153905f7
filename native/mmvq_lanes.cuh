// Lane-group dots: one lane plays four canonical threads of one weight block.
//
// The canonical order (strata_ref/routes/mmvq.py) is a statement about 128
// threads: thread tid = T·g + t visits weight blocks g + BPI·i and adds the
// float dot of its sub-position t. Which hardware thread evaluates a dot does
// not enter the bits. Here lane p of a warp plays the threads tid = 4p + k,
// k = 0..3: four consecutive sub-positions t = 4j + k of one block group
// g = p / L (L = T/4 lanes per block, j = p % L). The four threads share
// their block, so the lane loads its bytes once with wide loads, unpacks the
// K-quant scales once, and evaluates the four dots with exactly the float
// steps of Dot<TYPE>::dot (mmvq_dots.cuh). The warp then holds all 128
// accumulators of its row and combines them in the canonical order.
//
// The q8_1 column is staged once per CUDA block in a repacked layout (Q8Stage):
// the 8 quant ints of q8_1 block b as two int4 (16-byte aligned), d as float
// (exact fp16 -> f32; for Q6_K d/4, exact too, see Lanes<Q6_K>), and for
// Q4_K the four integer pair sums of the block that thread k of a 4-thread
// group takes with dp4a(0x01010101, .) (exact integers, a property of the
// activations alone).
//
// Without CUDA (mmvq_host_check.cpp) the same code runs on the host, so a
// CPU test checks every lane dot against the oracle bit for bit.
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
#else
// Host build (the CPU tests): every load checks its alignment (a GPU would
// fault) and, while a test has set the two ranges of host_reads(), that it
// reads inside one of them; failures are counted for the test to report.
struct HostReads {
    const uint8_t *lo[2] = {nullptr, nullptr}, *hi[2] = {nullptr, nullptr};
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
    for (int i = 0; i < 2 && !in; ++i) in = r.hi[i] && p >= r.lo[i] && p + n <= r.hi[i];
    if (!in) ++r.outside;
}
inline W4 ld16(const uint8_t *p) { host_read(p, 16, 16); W4 w; std::memcpy(w.v, p, 16); return w; }
inline W4 ld8x2(const uint8_t *p) { host_read(p, 16, 8); W4 w; std::memcpy(w.v, p, 16); return w; }
inline uint32_t ld4(const uint8_t *p) { host_read(p, 4, 4); uint32_t v; std::memcpy(&v, p, 4); return v; }
inline W2 ld8(const uint8_t *p) { host_read(p, 8, 8); W2 v; std::memcpy(&v, p, 8); return v; }
#endif

// 16 bytes at p, where p is 2-byte aligned and `mis` = p & 3 (0 or 2): the
// five words from p - mis, taken out of three 8-byte loads from p rounded
// down to 8 (starting at their word 0 or 1, as p & 4), then realigned by byte
// permutes (selector 0x3210 or 0x5432). Three wide loads instead of five
// 4-byte ones took Q6_K 2.3-3.9 % less time on the H200. The loads start up
// to 6 bytes before p (for lane 0's ql, the previous super-block's tail) and
// end at most 8 bytes after p + 16 (byte 200 of the super-block at most):
// inside the weights, whose start is 16-byte aligned.
__device__ __forceinline__ W4 ld16_a2(const uint8_t *p, int mis) {
    const uint8_t *a = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)7);
    const bool up = (uintptr_t)p & 4;
    const uint32_t sel = mis ? 0x5432u : 0x3210u;
    uint32_t x[6];
    for (int m = 0; m < 3; ++m) {
        const W2 u = ld8(a + 8 * m);
        x[2 * m] = u.x;
        x[2 * m + 1] = u.y;
    }
    uint32_t w[5];
    for (int m = 0; m < 5; ++m) w[m] = up ? x[m + 1] : x[m];
    W4 r;
    for (int m = 0; m < 4; ++m) r.v[m] = prmt(w[m], w[m + 1], sel);
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

// Q4_K: L = 4 lanes per super-block; lane j has qs ints 8j..8j+7 (sub-blocks
// 2j, 2j+1) and the 16-byte head (d, dmin, scales).
template <> struct Lanes<T_Q4_K> {
    static constexpr int L = 4, SUMS = 1, PAIRS = 0, DQ4 = 0, BPI = 128 / Dot<T_Q4_K>::T;
    struct Raw { W4 head, a, c; };
    __device__ static Tbl16 table(const Tbl16 &t) { return t; }
    // per-lane constants: chunk / block offsets at iteration 0 and the scale masks
    struct Lane {
        int lo[2], hi[2], s[2], d, hs, sx;
        uint32_t mx, mz;
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

// Q6_K: L = 8; lane j has ql ints 4j..4j+3, qh ints 8(j/4)+4(j%2)+0..3 and
// the two scales 8(j/4)+(j%4), +4. A super-block (210 bytes) starts 2 bytes
// off a word boundary when its index is odd: the loads realign.
template <> struct Lanes<T_Q6_K> {
    static constexpr int L = 8, SUMS = 0, PAIRS = 0, DQ4 = 1, BPI = 128 / Dot<T_Q6_K>::T;
    struct Raw { W4 ql, qh; int s0, s1; uint32_t d; };
    __device__ static Tbl16 table(const Tbl16 &t) { return t; }
    struct Lane { int u[2], d[2], vh_shift, soff, qh_off; };
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
        const int mis = (int)((uintptr_t)b & 3);
        Raw r;
        r.ql = ld16_a2(b + 16 * j, mis);
        r.qh = ld16_a2(b + l.qh_off, mis);
        r.s0 = (int8_t)b[l.soff];
        r.s1 = (int8_t)b[l.soff + 4];
        r.d = *(const uint16_t *)(b + 208);
        return r;
    }
    // The quants enter dp4a as bytes 4·(q - 32), q = nibble + 16·h the 6-bit
    // quant: the nibble at bits 2-5, the two bits h at 6-7 with the top one
    // flipped (64·(h ^ 2) = 64·h - 128 mod 256). So dp4a gives 4·dq exactly,
    // |4·dq·sc| <= 4·2^21 = 2^23 converts exactly, and the staged q8_1 scale
    // is d8/4 (DQ4; exact): d8/4 · float(4·dq·sc) is the real number
    // d8 · float(dq·sc), so the FMA rounds to the bits of Dot<Q6_K>::dot's.
    // Per pair (k, i): two shifts and two LOP3, against the five of
    // (nibble | h << 4) - 32 with its masks and the bytewise bias.
    __device__ static void dots(const Raw &r, const Q8Stage &q, const Lane &l, int it, float out[4],
                                const Tbl16 &) {
        const int cq = 16 * BPI * it, cb = 8 * BPI * it;
        const int sc[2] = {r.s0, r.s1};
        W4 u[2];
        float d8q[2];
        for (int i = 0; i < 2; ++i) {
            u[i] = q.q[l.u[i] + cq];
            d8q[i] = q.dv[l.d[i] + cb];
        }
        const float d = hb2f(r.d);
        for (int k = 0; k < 4; ++k) {
            const uint32_t vl = r.ql.v[k], vh = r.qh.v[k];
            float sf = 0.0f;
            for (int i = 0; i < 2; ++i) {
                // nibble i of each ql byte to bits 2-5; bits vh_shift + 4i, +1
                // of each qh byte to bits 6-7 (shifts 6 - vh_shift and 2 - vh_shift)
                const uint32_t lo = i == 0 ? vl << 2 : vl >> 2;
                const uint32_t hi = ((vh << (6 - 4 * i - l.vh_shift)) & 0xC0C0C0C0u) ^ 0x80808080u;
                const int vi = (int)((lo & 0x3C3C3C3Cu) | hi);
                const int dq4 = __dp4a(vi, (int)u[i].v[k], 0);
                sf = __fmaf_rn(d8q[i], i2f(dq4 * sc[i]), sf);
            }
            out[k] = __fmul_rn(d, sf);
        }
    }
};

// IQ4_XS: L = 2; lane h has qs ints 16h..16h+15 (sub-blocks 4h..4h+3) and
// the 8-byte head (d, scales_h, scales_l). Its q8_1 ints are staged in pairs
// (PAIRS): the bytes of ints m and m+4 interleaved (word 2m: bytes 0, 1 of
// both, word 2m+1: bytes 2, 3), the order in which a byte permute with
// selector nibbles L0 H0 L1 H1 returns the values of two qs bytes, so no
// regrouping is needed (the integer sum is the same).
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
// and two shifts (the permute reads only its selector's low 16 bits), and
// 4 dp4a, against 6 permutes, 6-8 masks and shifts and 2 dp4a for the
// three-permute lookup (lut8): the lookup was the largest share of IQ4_XS's
// integer ALU pipe, and dp4a runs on another pipe.
template <> struct Lanes<T_IQ4_XS> {
    static constexpr int L = 2, SUMS = 0, PAIRS = 1, DQ4 = 0, BPI = 128 / Dot<T_IQ4_XS>::T;
    struct Raw { uint32_t h0, h1; W4 qs[4]; };
    // kv[8..15] + 1 stays below 128, so the bytes never carry
    __device__ static Tbl16 table(const Tbl16 &t) {
        return Tbl16{{t.w[0], t.w[1], t.w[2] + 0x01010101u, t.w[3] + 0x01010101u}};
    }
    struct Lane { int lo[4], hi[4], d, h; };
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
    __device__ static Raw load(const uint8_t *b, const Lane &l, int h) {
        Raw r;
        r.h0 = ld4(b);
        r.h1 = ld4(b + 4);
        for (int m = 0; m < 4; ++m) r.qs[m] = ld8x2(b + 8 + 64 * h + 16 * m);
        return r;
    }
    __device__ static void dots(const Raw &r, const Q8Stage &q, const Lane &l, int it, float out[4],
                                const Tbl16 &tbl) {
        const int cq = 16 * BPI * it, cb = 8 * BPI * it;
        const float d = hb2f(r.h0);
        const uint32_t sh = r.h0 >> (16 + 8 * l.h), sl = r.h1 >> (16 * l.h);
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

// Where one lane's blocks are: weights w (rows x nb blocks), the warp's rows
// row0, row0 + rstep, ... below `rows`, the lane's block group g.
template <int TYPE> struct LaneWalk {
    const uint8_t *w;
    long long rows, rstep, rbytes;
    int nb, g;
    // the lane's first block of `row`, clamped to a real block (a row past
    // the end, or g >= nb, give one that is loaded and not used)
    __device__ const uint8_t *first(long long row) const {
        return w + (row < rows ? row : rows - 1) * rbytes +
               (long long)(g < nb ? g : nb - 1) * Dot<TYPE>::BYTES;
    }
};

// Whether every iteration of a row of nb blocks has a block for every lane
// (nb a multiple of BPI): lane_rows<TYPE, true> then drops the tests for a
// lane without a block.
template <int TYPE> __host__ __device__ constexpr bool lane_full(int nb) {
    return nb % Lanes<TYPE>::BPI == 0;
}

// One lane of the lanes kernel over its warp's rows: per row, its four
// threads' sums over blocks g + BPI·it (it < n_it; none when >= nb), then
// on_row(row, acc) (the kernel combines the warp's 128 sums there; every
// lane calls it at the same time). `cur` is the lane's loaded first block.
// The next block (this row's next one, or the next row's first) is loaded
// before the current one is used; a lane without one reloads its current
// block, so every load reads a real block.
template <int TYPE, bool FULL, class OnRow>
__device__ __forceinline__ void lane_rows(const LaneWalk<TYPE> &wk, long long row, int j,
                                          const typename Lanes<TYPE>::Lane &ln, const Q8Stage &qs,
                                          const Tbl16 &tbl, typename Lanes<TYPE>::Raw cur,
                                          OnRow on_row) {
    using LN = Lanes<TYPE>;
    constexpr int BPI = LN::BPI;
    const int g = wk.g, nb = wk.nb, n_it = (nb + BPI - 1) / BPI;
    const long long it_step = (long long)BPI * Dot<TYPE>::BYTES;
    const uint8_t *p = wk.first(row);
    typename LN::Raw nxt;
    for (; row < wk.rows; row += wk.rstep) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const bool more_rows = row + wk.rstep < wk.rows;
        const uint8_t *next_row = wk.first(row + wk.rstep);
#pragma unroll 2
        for (int it = 0; it < n_it; ++it) {
            const bool last = it + 1 == n_it;
            const uint8_t *pn = last ? (more_rows ? next_row : p)
                                     : (FULL || g + BPI * (it + 1) < nb ? p + it_step : p);
            nxt = LN::load(pn, ln, j);
            // a lane without a block in this iteration (only the last can lack
            // one) evaluates and discards dots on the staged zero padding
            float o[4];
#ifdef STRATA_LANES_PROBE_READ
            // probe (tuning builds only): the walk and its loads without the
            // dots, for the time of this access pattern alone
            {
                uint32_t wd[sizeof(cur) / 4], x = 0;
                memcpy(wd, &cur, sizeof(wd));
                for (uint32_t v : wd) x ^= v;
                for (int k = 0; k < 4; ++k) o[k] = __uint_as_float(x & 0x3fffffffu);
            }
#else
            LN::dots(cur, qs, ln, it, o, tbl);
#endif
            const bool mine = FULL || g + BPI * it < nb;
            for (int k = 0; k < 4; ++k) acc[k] = mine ? __fadd_rn(acc[k], o[k]) : acc[k];
            cur = nxt;
            p = pn;
        }
        on_row(row, acc);
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
// Q8Stage's layout (s_q: 2·npad chunks, s_d: npad floats, d/4 with DQ4,
// s_sum: npad chunks when SUMS), blocks nq8..npad-1 as zeros. With PAIRS the quant ints
// u0..u7 are stored as the byte pairs of (u_m, u_m+4), m = 0..3: word 2m =
// bytes 0, 1 of both, word 2m+1 = bytes 2, 3. One thread per q8_1 block:
// its nine words load together.
template <int SUMS, int PAIRS, int DQ4>
__device__ __forceinline__ void stage_q8(const uint8_t *q8, int nq8, int npad, W4 *s_q,
                                         float *s_d, W4 *s_sum, int i0, int step) {
    for (int b = i0; b < npad; b += step) {
        uint32_t v[9] = {};
        if (b < nq8)
            for (int m = 0; m < 9; ++m) v[m] = ld4(q8 + 36 * b + 4 * m);
        // d/4 is exact: an fp16 value is 0, inf, nan or at least 2^-24
        s_d[b] = DQ4 ? __fmul_rn(hb2f(v[0]), 0.25f) : hb2f(v[0]);
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

// Host build of the per-type thread dots (mmvq_dots.cuh) and lane-group dots
// (mmvq_lanes.cuh) for the CPU test tests/test_routes_mmvq_native_formulas.py:
// `smv_host_dot` returns what thread t computes for one weight block and its
// q8_1 blocks, `smv_host_lane_dots` what lane j of the lanes kernel computes
// for its four threads, so the CUDA formulas are checked against
// routes/mmvq.py without a GPU.
// Build: g++ -O1 -std=c++20 -ffp-contract=off -shared -fPIC. C++20 defines
// signed shifts as the two's-complement shifts that nvcc emits for the
// device build (C++17, where a left shift of a negative value is formally
// undefined), so the host runs what the GPU runs.
#include "mmvq_lanes.cuh"
#include "mmvq_setup.h"

#include <vector>

using namespace smv;

extern "C" float smv_host_dot(int type, const uint8_t *blk, const uint8_t *q8, int t,
                              const int8_t *tbl) {
    const Tbl16 tb = tbl16(tbl);
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::dot(blk, q8, t, tb);
        SMV_CASE(T_Q4_0) SMV_CASE(T_Q4_1) SMV_CASE(T_Q5_0) SMV_CASE(T_Q5_1) SMV_CASE(T_Q8_0)
        SMV_CASE(T_IQ4_NL) SMV_CASE(T_MXFP4) SMV_CASE(T_Q2_K) SMV_CASE(T_Q3_K) SMV_CASE(T_Q4_K)
        SMV_CASE(T_Q5_K) SMV_CASE(T_Q6_K) SMV_CASE(T_IQ4_XS) SMV_CASE(T_IQ2_XXS) SMV_CASE(T_IQ2_XS)
        SMV_CASE(T_IQ2_S) SMV_CASE(T_IQ3_XXS) SMV_CASE(T_IQ3_S) SMV_CASE(T_IQ1_S) SMV_CASE(T_IQ1_M)
#undef SMV_CASE
        default: return -1.0f;
    }
}

extern "C" int smv_host_threads(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::T;
        SMV_CASE(T_Q4_0) SMV_CASE(T_Q4_1) SMV_CASE(T_Q5_0) SMV_CASE(T_Q5_1) SMV_CASE(T_Q8_0)
        SMV_CASE(T_IQ4_NL) SMV_CASE(T_MXFP4) SMV_CASE(T_Q2_K) SMV_CASE(T_Q3_K) SMV_CASE(T_Q4_K)
        SMV_CASE(T_Q5_K) SMV_CASE(T_Q6_K) SMV_CASE(T_IQ4_XS) SMV_CASE(T_IQ2_XXS) SMV_CASE(T_IQ2_XS)
        SMV_CASE(T_IQ2_S) SMV_CASE(T_IQ3_XXS) SMV_CASE(T_IQ3_S) SMV_CASE(T_IQ1_S) SMV_CASE(T_IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

// Block geometry as the kernels declare it, checked against strata_ref.types.
extern "C" int smv_host_block_bytes(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::BYTES;
        SMV_CASE(T_Q4_0) SMV_CASE(T_Q4_1) SMV_CASE(T_Q5_0) SMV_CASE(T_Q5_1) SMV_CASE(T_Q8_0)
        SMV_CASE(T_IQ4_NL) SMV_CASE(T_MXFP4) SMV_CASE(T_Q2_K) SMV_CASE(T_Q3_K) SMV_CASE(T_Q4_K)
        SMV_CASE(T_Q5_K) SMV_CASE(T_Q6_K) SMV_CASE(T_IQ4_XS) SMV_CASE(T_IQ2_XXS) SMV_CASE(T_IQ2_XS)
        SMV_CASE(T_IQ2_S) SMV_CASE(T_IQ3_XXS) SMV_CASE(T_IQ3_S) SMV_CASE(T_IQ1_S) SMV_CASE(T_IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

extern "C" int smv_host_block_values(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::QK;
        SMV_CASE(T_Q4_0) SMV_CASE(T_Q4_1) SMV_CASE(T_Q5_0) SMV_CASE(T_Q5_1) SMV_CASE(T_Q8_0)
        SMV_CASE(T_IQ4_NL) SMV_CASE(T_MXFP4) SMV_CASE(T_Q2_K) SMV_CASE(T_Q3_K) SMV_CASE(T_Q4_K)
        SMV_CASE(T_Q5_K) SMV_CASE(T_Q6_K) SMV_CASE(T_IQ4_XS) SMV_CASE(T_IQ2_XXS) SMV_CASE(T_IQ2_XS)
        SMV_CASE(T_IQ2_S) SMV_CASE(T_IQ3_XXS) SMV_CASE(T_IQ3_S) SMV_CASE(T_IQ1_S) SMV_CASE(T_IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

// Lane j's four dots (threads t = 4j + k) of one 256-value weight block at
// `blk` with its 8 q8_1 blocks, staged as the kernel stages them. `mis` (the
// block's address mod 4; the loads read it from the address) is unused.
// Returns 0, 1 for a type without a lanes kernel, or 2 if a load was not aligned.
template <int TYPE>
static void lane_dots(const uint8_t *blk, const uint8_t *q8, int j, const Tbl16 &tb, float out[4]) {
    using LN = Lanes<TYPE>;
    W4 s_q[16], s_sum[8];
    float s_d[8];
    stage_q8<LN::SUMS, LN::PAIRS, LN::DQ4>(q8, 8, 8, s_q, s_d, s_sum, 0, 1);
    const Q8Stage qs{s_q, s_d, s_sum};
    const typename LN::Lane ln = LN::lane(0, j);
    LN::dots(LN::load(blk, ln, j), qs, ln, 0, out, LN::table(tb));
}

extern "C" int smv_host_lane_dots(int type, const uint8_t *blk, int mis, const uint8_t *q8, int j,
                                  const int8_t *tbl, float *out) {
    const Tbl16 tb = tbl16(tbl);
    host_reads() = HostReads{};
    switch (type) {
        case T_Q4_K: lane_dots<T_Q4_K>(blk, q8, j, tb, out); break;
        case T_Q6_K: lane_dots<T_Q6_K>(blk, q8, j, tb, out); break;
        case T_IQ4_XS: lane_dots<T_IQ4_XS>(blk, q8, j, tb, out); break;
        default: return 1;
    }
    return host_reads().misaligned ? 2 : 0;   // 2: a load not aligned as the GPU needs
}

extern "C" int smv_host_q8_chunk(int c) { return q8_chunk(c); }

// The lanes kernel's whole 1-column mat-vec on the host: `nwarps` warps (warp
// v takes rows v, v + nwarps, ...), each lane walking its blocks with
// lane_rows exactly as on the GPU, then the canonical combine of the 128
// thread sums per row. y: rows floats.
template <int TYPE>
static void lanes_matvec(const uint8_t *w, long long rows, int nb, const uint8_t *q8, int nwarps,
                         const Tbl16 &tb, float *y) {
    using LN = Lanes<TYPE>;
    // exactly the kernel's staged column (ASan sees any read past it)
    const int nq8 = nb * (Dot<TYPE>::QK / 32), npad = lane_q8_blocks<TYPE>(nb);
    std::vector<W4> s_q(2 * npad), s_sum(npad);
    std::vector<float> s_d(npad), t(rows * 128);
    stage_q8<LN::SUMS, LN::PAIRS, LN::DQ4>(q8, nq8, npad, s_q.data(), s_d.data(), s_sum.data(), 0, 1);
    const Q8Stage qs{s_q.data(), s_d.data(), s_sum.data()};
    for (int v = 0; v < nwarps; ++v)
        for (int p = 0; p < 32; ++p) {
            const int g = p / LN::L, j = p % LN::L;
            const LaneWalk<TYPE> wk{w, rows, nwarps, (long long)nb * Dot<TYPE>::BYTES, nb, g};
            const typename LN::Lane ln = LN::lane(g, j);
            auto keep = [&](long long row, const float acc[4]) {
                for (int k = 0; k < 4; ++k) t[row * 128 + 4 * p + k] = acc[k];
            };
            const typename LN::Raw first = LN::load(wk.first(v), ln, j);
            if (lane_full<TYPE>(nb))   // the walk the kernel takes for this nb
                lane_rows<TYPE, true>(wk, v, j, ln, qs, LN::table(tb), first, keep);
            else
                lane_rows<TYPE, false>(wk, v, j, ln, qs, LN::table(tb), first, keep);
        }
    for (long long r = 0; r < rows; ++r) {
        const float *tr = &t[r * 128];
        float v[32], u[32];
        for (int l = 0; l < 32; ++l)
            v[l] = __fadd_rn(__fadd_rn(__fadd_rn(tr[l], tr[32 + l]), tr[64 + l]), tr[96 + l]);
        for (int h = 16; h >= 1; h >>= 1) {
            for (int l = 0; l < 32; ++l) u[l] = __fadd_rn(v[l], v[l ^ h]);
            for (int l = 0; l < 32; ++l) v[l] = u[l];
        }
        y[r] = v[0];
    }
}

// Returns 0; 1 for a type without a lanes kernel; 2 if a load was not
// aligned as the GPU needs; 3 if a load read outside the weights and the
// q8_1 column; 4 for a shape the kernel refuses (k not a positive multiple
// of 256, rows or nwarps below 1).
extern "C" int smv_host_lanes_matvec(int type, const uint8_t *w, long long rows, long long k,
                                     const uint8_t *q8, int nwarps, const int8_t *tbl, float *y) {
    const Tbl16 tb = tbl16(tbl);
    const int bytes = type == T_Q4_K ? Dot<T_Q4_K>::BYTES : type == T_Q6_K ? Dot<T_Q6_K>::BYTES
                    : type == T_IQ4_XS ? Dot<T_IQ4_XS>::BYTES : 0;
    if (!bytes) return 1;
    if (k < 256 || k % 256 || rows < 1 || nwarps < 1) return 4;
    HostReads &r = host_reads();
    r = HostReads{};
    r.lo[0] = w;
    r.hi[0] = w + rows * (k / 256) * bytes;
    r.lo[1] = q8;
    r.hi[1] = q8 + k / 32 * Q8_1_BYTES;
    switch (type) {
        case T_Q4_K: lanes_matvec<T_Q4_K>(w, rows, (int)(k / 256), q8, nwarps, tb, y); break;
        case T_Q6_K: lanes_matvec<T_Q6_K>(w, rows, (int)(k / 256), q8, nwarps, tb, y); break;
        default: lanes_matvec<T_IQ4_XS>(w, rows, (int)(k / 256), q8, nwarps, tb, y);
    }
    const int st = r.misaligned ? 2 : r.outside ? 3 : 0;
    r = HostReads{};
    return st;
}

// The reset order of smv_device_reset (mmvq_setup.h), with a stand-in for
// cudaDeviceReset during which another thread makes its launch set-up (as
// launch_lanes does: epoch first, then the set-up, then keep). Returns 0 when
// that set-up is stale after the reset and a set-up made after the reset is
// fresh; 1 when the set-up made during the reset survived it; 2 when the
// later one is not fresh; 3 when the reset's status was lost.
extern "C" int smv_host_reset_order(void) {
    SetupCache during, after;
    const int st = reset_then_bump([&] {
        const int e = epoch_now();
        during.keep(0, 56 * 1024, e, 264);
        return 7;
    });
    if (st != 7) return 3;
    if (during.fresh(0, 56 * 1024, epoch_now())) return 1;
    after.keep(0, 56 * 1024, epoch_now(), 264);
    return after.fresh(0, 56 * 1024, epoch_now()) ? 0 : 2;
}

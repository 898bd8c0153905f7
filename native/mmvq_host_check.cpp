// Host build of the per-type thread dots (mmvq_dots.cuh) and lane-group dots
// (mmvq_lanes.cuh) for the CPU test tests/test_routes_mmvq_native_formulas.py:
// `smv_host_dot` returns what thread t computes for one weight block and its
// q8_1 blocks, `smv_host_lane_dots` what lane j of the lanes kernel computes
// for its four threads, so the CUDA formulas are checked against
// routes/mmvq.py without a GPU.
// Build: g++ -O1 -std=c++17 -ffp-contract=off -shared -fPIC.
#include "mmvq_lanes.cuh"

using namespace smv;

extern "C" float smv_host_dot(int type, const uint8_t *blk, const uint8_t *q8, int t,
                              const int8_t *tbl) {
    const Tbl16 tb = tbl16(tbl);
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::dot(blk, q8, t, tb);
        SMV_CASE(Q4_0) SMV_CASE(Q4_1) SMV_CASE(Q5_0) SMV_CASE(Q5_1) SMV_CASE(Q8_0)
        SMV_CASE(IQ4_NL) SMV_CASE(MXFP4) SMV_CASE(Q2_K) SMV_CASE(Q3_K) SMV_CASE(Q4_K)
        SMV_CASE(Q5_K) SMV_CASE(Q6_K) SMV_CASE(IQ4_XS) SMV_CASE(IQ2_XXS) SMV_CASE(IQ2_XS)
        SMV_CASE(IQ2_S) SMV_CASE(IQ3_XXS) SMV_CASE(IQ3_S) SMV_CASE(IQ1_S) SMV_CASE(IQ1_M)
#undef SMV_CASE
        default: return -1.0f;
    }
}

extern "C" int smv_host_threads(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::T;
        SMV_CASE(Q4_0) SMV_CASE(Q4_1) SMV_CASE(Q5_0) SMV_CASE(Q5_1) SMV_CASE(Q8_0)
        SMV_CASE(IQ4_NL) SMV_CASE(MXFP4) SMV_CASE(Q2_K) SMV_CASE(Q3_K) SMV_CASE(Q4_K)
        SMV_CASE(Q5_K) SMV_CASE(Q6_K) SMV_CASE(IQ4_XS) SMV_CASE(IQ2_XXS) SMV_CASE(IQ2_XS)
        SMV_CASE(IQ2_S) SMV_CASE(IQ3_XXS) SMV_CASE(IQ3_S) SMV_CASE(IQ1_S) SMV_CASE(IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

// Block geometry as the kernels declare it, checked against strata_ref.types.
extern "C" int smv_host_block_bytes(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::BYTES;
        SMV_CASE(Q4_0) SMV_CASE(Q4_1) SMV_CASE(Q5_0) SMV_CASE(Q5_1) SMV_CASE(Q8_0)
        SMV_CASE(IQ4_NL) SMV_CASE(MXFP4) SMV_CASE(Q2_K) SMV_CASE(Q3_K) SMV_CASE(Q4_K)
        SMV_CASE(Q5_K) SMV_CASE(Q6_K) SMV_CASE(IQ4_XS) SMV_CASE(IQ2_XXS) SMV_CASE(IQ2_XS)
        SMV_CASE(IQ2_S) SMV_CASE(IQ3_XXS) SMV_CASE(IQ3_S) SMV_CASE(IQ1_S) SMV_CASE(IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

extern "C" int smv_host_block_values(int type) {
    switch (type) {
#define SMV_CASE(TY) case TY: return Dot<TY>::QK;
        SMV_CASE(Q4_0) SMV_CASE(Q4_1) SMV_CASE(Q5_0) SMV_CASE(Q5_1) SMV_CASE(Q8_0)
        SMV_CASE(IQ4_NL) SMV_CASE(MXFP4) SMV_CASE(Q2_K) SMV_CASE(Q3_K) SMV_CASE(Q4_K)
        SMV_CASE(Q5_K) SMV_CASE(Q6_K) SMV_CASE(IQ4_XS) SMV_CASE(IQ2_XXS) SMV_CASE(IQ2_XS)
        SMV_CASE(IQ2_S) SMV_CASE(IQ3_XXS) SMV_CASE(IQ3_S) SMV_CASE(IQ1_S) SMV_CASE(IQ1_M)
#undef SMV_CASE
        default: return 0;
    }
}

// Lane j's four dots (threads t = 4j + k) of one 256-value weight block at
// `blk` with its 8 q8_1 blocks, staged as the kernel stages them. `mis` (the
// block's address mod 4; the loads read it from the address) is unused.
// Returns 0, or 1 for a type without a lanes kernel.
template <int TYPE>
static void lane_dots(const uint8_t *blk, const uint8_t *q8, int j, const Tbl16 &tb, float out[4]) {
    using LN = Lanes<TYPE>;
    W4 s_q[16], s_sum[8];
    float s_d[8];
    stage_q8<LN::SUMS, LN::PAIRS>(q8, 8, s_q, s_d, s_sum, 0, 1);
    const Q8Stage qs{s_q, s_d, s_sum};
    const typename LN::Lane ln = LN::lane(0, j);
    LN::dots(LN::load(blk, ln, j), qs, ln, 0, out, tb);
}

extern "C" int smv_host_lane_dots(int type, const uint8_t *blk, int mis, const uint8_t *q8, int j,
                                  const int8_t *tbl, float *out) {
    const Tbl16 tb = tbl16(tbl);
    switch (type) {
        case Q4_K: lane_dots<Q4_K>(blk, q8, j, tb, out); return 0;
        case Q6_K: lane_dots<Q6_K>(blk, q8, j, tb, out); return 0;
        case IQ4_XS: lane_dots<IQ4_XS>(blk, q8, j, tb, out); return 0;
        default: return 1;
    }
}

extern "C" int smv_host_q8_chunk(int c) { return q8_chunk(c); }

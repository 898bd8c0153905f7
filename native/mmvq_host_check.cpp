// Host build of the per-type thread dots (mmvq_dots.cuh) for the CPU test
// tests/test_routes_mmvq_native_formulas.py: `smv_host_dot` returns what
// thread t computes for one weight block and its q8_1 blocks, so the CUDA
// formulas are checked against routes/mmvq.py without a GPU.
// Build: g++ -O1 -std=c++17 -ffp-contract=off -shared -fPIC.
#include "mmvq_dots.cuh"

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

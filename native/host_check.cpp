// CPU check of the kernels' per-value formulas (no GPU needed).
//
// Builds the same Fmt<T>::group / Fmt<T>::value (strata_formats.cuh) and
// Wide*::chunk (strata_wide.cuh) code that the CUDA kernels run, as plain C++
// (compile with -ffp-contract=off), and applies them to blocks read from
// stdin. Usage: host_check TYPE generic|wide < blocks > values
// (pairs: the Wide*::pair code of the K-quants and IQ4_XS)
// Output: every value of every block in order, as canonical f32 bits
// (uint32, little-endian); exit status 2 for an unknown type or kernel.
// tests/test_native_host_check.py compares the output with the NumPy oracle.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "strata_formats.cuh"
#include "strata_wide.cuh"

using namespace strata;

template <int T>
static void run_generic(const std::vector<uint8_t> &in, std::vector<uint32_t> &out) {
    using F = Fmt<T>;
    const size_t n = in.size() / F::B;
    out.resize(n * F::QK);
    if constexpr (F::QK == 1) {
        for (size_t i = 0; i < n; ++i) out[i] = out_f32_bits(F::value(in.data(), (int)i));
    } else {
        for (size_t i = 0; i < n; ++i)
            for (int grp = 0; grp < F::QK / 32; ++grp) {
                float y[32];
                F::group(in.data() + i * F::B, grp, y);
                for (int j = 0; j < 32; ++j) out[i * F::QK + 32 * grp + j] = out_f32_bits(y[j]);
            }
    }
}

template <class W>
static void run_wide(const std::vector<uint8_t> &in, std::vector<uint32_t> &out) {
    const size_t n = in.size() / W::B;
    out.resize(n * W::QK);
    for (size_t i = 0; i < n; ++i)
        for (int c = 0; c < W::QK / 8; ++c) {
            float y[8];
            float kv[16];
            for (int k = 0; k < 16; ++k) kv[k] = (float)tab_kvalues_iq4nl[k];
            const bool finite = W::chunk(in.data() + i * W::B, c, kv, y);
            // the kernel canonicalises only when a scale is not finite: check
            // that no NaN escapes when chunk() reported finite scales
            for (int j = 0; j < 8; ++j)
                if (finite && y[j] != y[j]) y[j] = as_f32(0x7FC0DEADu);
            for (int j = 0; j < 8; ++j) out[i * W::QK + 8 * c + j] = out_f32_bits(y[j]);
        }
}

// The wide kernels' chunk pairs (W::pair, 16 per block), written where
// their chunks lo(P) and lo(P) + D go: every chunk exactly once.
template <class W>
static void run_pairs(const std::vector<uint8_t> &in, std::vector<uint32_t> &out) {
    const size_t n = in.size() / W::B;
    out.assign(n * W::QK, 0x7FC0BEEFu);   // a value no pair wrote stays visible
    float kv[16];
    for (int k = 0; k < 16; ++k) kv[k] = (float)tab_kvalues_iq4nl[k];
    for (size_t i = 0; i < n; ++i)
        for (int P = 0; P < W::QK / 16; ++P) {
            float y0[8], y1[8];
            const bool finite = W::pair(in.data() + i * W::B, P, KvArray{kv}, y0, y1);
            for (int j = 0; j < 8; ++j) {
                if (finite && (y0[j] != y0[j] || y1[j] != y1[j])) y0[j] = as_f32(0x7FC0DEADu);
                out[i * W::QK + 8 * W::lo(P) + j] = out_f32_bits(y0[j]);
                out[i * W::QK + 8 * (W::lo(P) + W::D) + j] = out_f32_bits(y1[j]);
            }
        }
}

// FastDiv against '/': divisors 2..5000 and every power of two up to 2^31
// (the wide kernels divide chunk indices by chunks per row, cols/8 >= 4),
// numerators near 0, near multiples of d and near 2^32.
static int divcheck() {
    std::vector<uint32_t> ds;
    for (uint32_t d = 2; d <= 5000; ++d) ds.push_back(d);
    for (int e = 13; e < 32; ++e) { ds.push_back(1u << e); ds.push_back((1u << e) - 1); ds.push_back((1u << e) + 1); }
    ds.push_back(0xFFFFFFFFu);
    long long bad = 0;
    for (uint32_t d : ds) {
        const FastDiv f = make_fast_div(d);
        const uint64_t top = 0xFFFFFFFFull > 3ull * d ? 0xFFFFFFFFull - 3ull * d : 0;
        const uint64_t bases[4] = {0, (uint64_t)d * 1000, (uint64_t)d * 123457, top};
        for (uint64_t base : bases)
            for (uint64_t k = 0; k < 3 * (uint64_t)d && k < 3000; ++k) {
                const uint64_t n = base + k;
                if (n > 0xFFFFFFFFull) break;
                bad += fast_div((uint32_t)n, f) != (uint32_t)n / d;
            }
    }
    printf("divcheck: %lld mismatches\n", bad);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "divcheck") == 0) return divcheck();
    if (argc != 3) {
        fprintf(stderr, "usage: host_check TYPE generic|wide|pairs < blocks > values\n");
        return 2;
    }
    const int type = atoi(argv[1]);
    const bool wide = strcmp(argv[2], "wide") == 0;
    std::vector<uint8_t> in;
    uint8_t buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, stdin)) > 0) in.insert(in.end(), buf, buf + got);
    std::vector<uint32_t> out;
    bool known = true;
    if (wide) {
        switch (type) {
        case T_Q8_0: run_wide<WideQ8_0>(in, out); break;
        case T_Q4_K: run_wide<WideQ4_K>(in, out); break;
        case T_Q5_K: run_wide<WideQ5_K>(in, out); break;
        case T_Q6_K: run_wide<WideQ6_K>(in, out); break;
        case T_IQ4_XS: run_wide<WideIQ4_XS>(in, out); break;
        default: known = false;
        }
    } else if (strcmp(argv[2], "pairs") == 0) {
        switch (type) {
        case T_Q4_K: run_pairs<WideQ4_K>(in, out); break;
        case T_Q5_K: run_pairs<WideQ5_K>(in, out); break;
        case T_Q6_K: run_pairs<WideQ6_K>(in, out); break;
        case T_IQ4_XS: run_pairs<WideIQ4_XS>(in, out); break;
        default: known = false;
        }
    } else if (strcmp(argv[2], "generic") == 0) {
        switch (type) {
#define STRATA_RUN(id, name) \
    case id: run_generic<T_##name>(in, out); break;
            STRATA_GENERIC_TYPES(STRATA_RUN)
#undef STRATA_RUN
        default: known = false;
        }
    } else {
        known = false;
    }
    if (!known) {
        fprintf(stderr, "host_check: no %s code for type %d\n", argv[2], type);
        return 2;
    }
    fwrite(out.data(), 4, out.size(), stdout);
    return 0;
}

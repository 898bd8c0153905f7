// CPU check of the kernels' per-value formulas (no GPU needed).
//
// Builds the same Fmt<T>::group / Fmt<T>::value (strata_formats.cuh) and
// Wide*::chunk (strata_wide.cuh) code that the CUDA kernels run, as plain C++
// (compile with -ffp-contract=off), and applies them to blocks read from
// stdin. Usage: host_check TYPE generic|wide < blocks > values
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

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: host_check TYPE generic|wide < blocks > values\n");
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

// Generic dequantization kernel: one thread per 32 values (spec/kernels.md §3).
//
// Thread g of a launch covers output row r = g / gpr and the 32 values
// starting at column 32·(g % gpr), gpr = ceil(cols/32) groups per row. For a
// block type with QK > 32, the group selects the block (32gi/QK) and the
// group inside it ((32gi mod QK)/32); QK = 1 types (F32, F16, BF16) take up to
// 32 elements and may end in a partial group. Values are written in order,
// one scalar store each, to out[r·ld + 32gi + j].
#include "strata_formats.cuh"
#include "strata_launch.h"

namespace strata {

template <int T>
__global__ void __launch_bounds__(256)
dequant_generic_kernel(const uint8_t *__restrict__ blocks, long long row0, unsigned rows,
                       long long cols, long long ld, int out_dtype, void *__restrict__ out) {
    using F = Fmt<T>;
    const unsigned gpr = (unsigned)((cols + 31) / 32);
    const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= rows * gpr) return;
    const unsigned r = g / gpr, gi = g - r * gpr;
    const long long first = 32LL * gi;
    const long long row_bytes = (cols / F::QK) * F::B;
    const uint8_t *b = blocks + (row0 + r) * row_bytes + (first / F::QK) * F::B;
    const int grp = (int)((first % F::QK) / 32);
    const int n = cols - first < 32 ? (int)(cols - first) : 32;   // < 32 only for QK = 1
    const long long o = (long long)r * ld + first;
    if constexpr (F::QK == 1) {
        for (int j = 0; j < n; ++j) store1(out, out_dtype, o + j, F::value(b, j));
    } else {
        float y[32];   // constant indices only, so it stays in registers
        F::group(b, grp, y);
#pragma unroll
        for (int j = 0; j < 32; ++j) store1(out, out_dtype, o + j, y[j]);
    }
}

TypeInfo generic_type_info(int type) {
    switch (type) {
#define STRATA_INFO(id, name) \
    case id: return TypeInfo{Fmt<T_##name>::QK, Fmt<T_##name>::B};
        STRATA_GENERIC_TYPES(STRATA_INFO)
#undef STRATA_INFO
    default: return TypeInfo{0, 0};
    }
}

template <int T>
static cudaError_t launch_t(const uint8_t *blocks, long long row0, long long rows, long long cols,
                            long long ld, int out_dtype, void *out, cudaStream_t stream) {
    const long long gpr = (cols + 31) / 32;
    const long long batch = kMaxThreadsPerLaunch / gpr;   // rows per launch, >= 1 (checked)
    for (long long r0 = 0; r0 < rows; r0 += batch) {
        const long long n = rows - r0 < batch ? rows - r0 : batch;
        const long long threads = n * gpr;
        const unsigned grid = (unsigned)((threads + 255) / 256);
        char *o = static_cast<char *>(out) + r0 * ld * (out_dtype == OUT_F32 ? 4 : 2);
        dequant_generic_kernel<T><<<grid, 256, 0, stream>>>(blocks, row0 + r0, (unsigned)n, cols,
                                                            ld, out_dtype, o);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t launch_generic(int type, const unsigned char *blocks, long long row0, long long rows,
                           long long cols, long long ld, int out_dtype, void *out,
                           cudaStream_t stream) {
    switch (type) {
#define STRATA_LAUNCH(id, name) \
    case id: return launch_t<T_##name>(blocks, row0, rows, cols, ld, out_dtype, out, stream);
        STRATA_GENERIC_TYPES(STRATA_LAUNCH)
#undef STRATA_LAUNCH
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace strata

// Wide dequantization kernels: one thread per 8 consecutive values of a row,
// 16-byte stores (spec/kernels.md §4). Re-partitioning threads cannot change
// a bit (each value keeps its formats.md §5 expression in f32 until the final
// narrowing), so these must equal the generic kernel bitwise.
//
// Guards (checked in api.cu before any launch): the output pointer is
// 16-byte aligned and ld % 8 == 0; the blocks pointer has the alignment of
// wide_blocks_align(type); Q8_0 additionally needs ld == cols.
#include <algorithm>

#include "strata_wide.cuh"
#include "strata_iq_tables.h"
#include "strata_launch.h"

namespace strata {

// A scale was Inf or NaN: make every NaN output the canonical NaN.
__device__ __forceinline__ void canonicalize8(float *y) {
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = as_f32(out_f32_bits(y[j]));
}

// Tuning knobs (compile-time; the measured choice is the default, see
// docs/native.md): chunks per thread (default: each Wide type's CPT for
// f16/bf16 outputs and 1 for f32, whose two stores per chunk already double
// the work per thread; STRATA_WIDE_CPT overrides it for every type and
// dtype), threads per CUDA block, streaming (evict-first) stores.
#ifdef STRATA_WIDE_CPT
template <class W, int OUT> struct CptOf { static constexpr int value = STRATA_WIDE_CPT; };
#else
template <class W, int OUT> struct CptOf { static constexpr int value = OUT == OUT_F32 ? 1 : W::CPT; };
#endif
#ifndef STRATA_WIDE_THREADS
#define STRATA_WIDE_THREADS 256
#endif
#ifndef STRATA_WIDE_STREAM
#define STRATA_WIDE_STREAM 0
#endif
constexpr int kThreads = STRATA_WIDE_THREADS;

// Row-major kernel for any ld % 8 == 0: chunk c of a launch is chunk c % cpr
// of row c / cpr (cpr = cols/8 chunks per row). A CUDA block covers
// kThreads·kCpt consecutive chunks, thread t those at t + kThreads·k, so
// every store instruction of a warp stays one contiguous 512-byte run.
// `blocks` and `out` point at the launch's first row; the host sizes each
// launch so that every byte offset into blocks and every element offset into
// out fits 32 bits (cheap index arithmetic). Out-of-range chunks read the
// last valid chunk and store nothing, so the loop has no early exit and the
// loads of all kCpt chunks can be in flight together.
template <class W, int OUT>
__global__ void __launch_bounds__(kThreads)
dequant_wide_kernel(const uint8_t *__restrict__ blocks, unsigned total, FastDiv cpr,
                    unsigned row_bytes, unsigned ld, void *__restrict__ out) {
    __shared__ float kv[16];
    if constexpr (W::KV) {
        if (threadIdx.x < 16) kv[threadIdx.x] = (float)tab_kvalues_iq4nl[threadIdx.x];
        __syncthreads();
    }
    constexpr unsigned CPB = W::QK / 8;   // chunks per block
    constexpr int kCpt = CptOf<W, OUT>::value;
    float y[kCpt][8];
    bool finite[kCpt];
    unsigned o[kCpt];
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c0 = (blockIdx.x * kCpt + k) * kThreads + threadIdx.x;
        const unsigned c = c0 < total ? c0 : total - 1;
        const unsigned r = fast_div(c, cpr), ci = c - r * cpr.d;
        const uint8_t *b = blocks + (r * row_bytes + (ci / CPB) * (unsigned)W::B);
        finite[k] = W::chunk(b, ci % CPB, kv, y[k]);
        o[k] = r * ld + 8 * ci;
    }
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        if ((blockIdx.x * kCpt + k) * kThreads + threadIdx.x >= total) continue;
        if (!finite[k]) canonicalize8(y[k]);
        store8_canonical<OUT, STRATA_WIDE_STREAM>(out, o[k], y[k]);
    }
}

// Q8_0 with ld == cols: the rows are one flat run of blocks and outputs, so
// chunk c is block c/4, part c%4, and lands at out + 8c (no division).
template <int OUT>
__global__ void __launch_bounds__(kThreads)
dequant_wide_q8_0_kernel(const uint8_t *__restrict__ blocks, unsigned chunks,
                         void *__restrict__ out) {
    constexpr int kCpt = CptOf<WideQ8_0, OUT>::value;
    float y[kCpt][8];
    bool finite[kCpt];
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c0 = (blockIdx.x * kCpt + k) * kThreads + threadIdx.x;
        const unsigned c = c0 < chunks ? c0 : chunks - 1;
        finite[k] = WideQ8_0::chunk(blocks + (long long)(c >> 2) * WideQ8_0::B, c & 3, nullptr, y[k]);
    }
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c = (blockIdx.x * kCpt + k) * kThreads + threadIdx.x;
        if (c >= chunks) continue;
        if (!finite[k]) canonicalize8(y[k]);
        store8_canonical<OUT, STRATA_WIDE_STREAM>(out, 8LL * c, y[k]);
    }
}

template <class W, int OUT>
static unsigned wide_grid(long long chunks) {
    constexpr int per_block = kThreads * CptOf<W, OUT>::value;
    return (unsigned)((chunks + per_block - 1) / per_block);
}

bool wide_has_kernel(int type, int out_dtype) {
    const bool dtype_ok = out_dtype == OUT_F32 || out_dtype == OUT_F16 || out_dtype == OUT_BF16;
    switch (type) {
    case T_Q8_0: case T_Q4_K: case T_Q5_K: case T_Q6_K: case T_IQ4_XS: return dtype_ok;
    default: return false;
    }
}

int wide_blocks_align(int type) {
    switch (type) {
    case T_Q8_0: return 2;    // u16 loads
    case T_Q6_K: return 2;    // u16 loads (210-byte blocks are only 2-byte aligned)
    case T_Q4_K: return 8;    // 8-byte qs loads
    case T_Q5_K: return 8;
    case T_IQ4_XS: return 8;
    default: return 0;
    }
}

bool wide_needs_dense(int type) { return type == T_Q8_0; }

template <class W, int OUT>
static cudaError_t launch_rows(const uint8_t *blocks, long long row0, long long rows,
                               long long cols, long long ld, void *out, cudaStream_t stream) {
    const long long cpr = cols / 8;
    const long long row_bytes = (cols / W::QK) * W::B;
    // Rows per launch: at most 2^30 chunks, and 32-bit offsets into the
    // launch's blocks ((rows)·row_bytes) and outputs ((rows − 1)·ld + cols).
    const long long lim = 0xFFFFFFFFLL;
    long long batch = kMaxThreadsPerLaunch / cpr;
    batch = std::min(batch, lim / row_bytes);
    batch = std::min(batch, (lim - cols) / ld + 1);
    const int size = OUT == OUT_F32 ? 4 : 2;
    const FastDiv div = make_fast_div((uint32_t)cpr);
    for (long long r0 = 0; r0 < rows; r0 += batch) {
        const long long n = rows - r0 < batch ? rows - r0 : batch;
        dequant_wide_kernel<W, OUT><<<wide_grid<W, OUT>(n * cpr), kThreads, 0, stream>>>(
            blocks + (row0 + r0) * row_bytes, (unsigned)(n * cpr), div, (unsigned)row_bytes,
            (unsigned)(n > 1 ? ld : cols), static_cast<char *>(out) + r0 * ld * size);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int OUT>
static cudaError_t launch_q8_0(const uint8_t *blocks, long long row0, long long rows,
                               long long cols, void *out, cudaStream_t stream) {
    const long long row_bytes = (cols / 32) * 34;
    const long long cpr = cols / 8;
    const long long batch = kMaxThreadsPerLaunch / cpr;
    const int size = OUT == OUT_F32 ? 4 : 2;
    for (long long r0 = 0; r0 < rows; r0 += batch) {
        const long long n = rows - r0 < batch ? rows - r0 : batch;
        const long long chunks = n * cpr;
        dequant_wide_q8_0_kernel<OUT><<<wide_grid<WideQ8_0, OUT>(chunks), kThreads, 0, stream>>>(
            blocks + (row0 + r0) * row_bytes, (unsigned)chunks,
            static_cast<char *>(out) + r0 * cols * size);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

template <int OUT>
static cudaError_t launch_wide_out(int type, const uint8_t *blocks, long long row0, long long rows,
                                   long long cols, long long ld, void *out, cudaStream_t stream) {
    switch (type) {
    case T_Q8_0: return launch_q8_0<OUT>(blocks, row0, rows, cols, out, stream);
    case T_Q4_K: return launch_rows<WideQ4_K, OUT>(blocks, row0, rows, cols, ld, out, stream);
    case T_Q5_K: return launch_rows<WideQ5_K, OUT>(blocks, row0, rows, cols, ld, out, stream);
    case T_Q6_K: return launch_rows<WideQ6_K, OUT>(blocks, row0, rows, cols, ld, out, stream);
    case T_IQ4_XS: return launch_rows<WideIQ4_XS, OUT>(blocks, row0, rows, cols, ld, out, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_wide(int type, const unsigned char *blocks, long long row0, long long rows,
                        long long cols, long long ld, int out_dtype, void *out,
                        cudaStream_t stream) {
    switch (out_dtype) {
    case OUT_F32: return launch_wide_out<OUT_F32>(type, blocks, row0, rows, cols, ld, out, stream);
    case OUT_F16: return launch_wide_out<OUT_F16>(type, blocks, row0, rows, cols, ld, out, stream);
    case OUT_BF16: return launch_wide_out<OUT_BF16>(type, blocks, row0, rows, cols, ld, out, stream);
    default: return cudaErrorInvalidValue;
    }
}

}  // namespace strata

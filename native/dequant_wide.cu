// Wide dequantization kernels: one thread per 8 consecutive values of a row
// (a chunk), or per two chunks of one block that share their bytes (the
// K-quants and IQ4_XS to f16/bf16), 16-byte stores (spec/kernels.md §4). Re-partitioning threads cannot change
// a bit (each value keeps its formats.md §5 expression in f32 until the final
// narrowing), so these must equal the generic kernel bitwise.
//
// Guards (checked in api.cu before any launch): the output pointer is
// 16-byte aligned and ld % 8 == 0; the blocks pointer has the alignment of
// wide_blocks_align(type); Q8_0 additionally needs ld == cols.
#include <algorithm>
#include <type_traits>

#include "strata_dequant.h"
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
#ifndef STRATA_WIDE_CPT_F32
#define STRATA_WIDE_CPT_F32 1
#endif
template <class W, int OUT> struct CptOf {
    static constexpr int value = OUT == OUT_F32 ? STRATA_WIDE_CPT_F32 : W::CPT;
};
#endif
#ifndef STRATA_WIDE_THREADS
#define STRATA_WIDE_THREADS 256
#endif
#ifndef STRATA_WIDE_STREAM
#define STRATA_WIDE_STREAM 0
#endif
constexpr int kThreads = STRATA_WIDE_THREADS;
// f32 store path (STRATA_WIDE_F32_STORE): 1 (default) lane pairs swap
// halves with one shuffle round so that each warp store instruction writes
// whole 32-byte sectors; 0 each thread stores its own 32 bytes with two
// 16-byte stores, so that every store instruction writes half of each
// sector it touches. On the H200 the 0 path ran at 52-83 % of the copy
// bandwidth (Nsight Compute: drain and MIO-throttle stalls, DRAM at 44-72 %
// of peak) and the 1 path at 93-95 % (docs/native.md). A shared-memory
// transpose that made each store instruction 512 contiguous bytes measured
// the same or up to 1.7 points lower than 1, and was dropped.
#ifndef STRATA_WIDE_F32_STORE
#define STRATA_WIDE_F32_STORE 1
#endif
constexpr int kF32Store = STRATA_WIDE_F32_STORE;

// The f32 chunk of 8 values of this lane at element offset o (32 bytes),
// stored together with its lane pair (every lane of the warp calls it,
// `valid` or not: the shuffle needs all of them). Chunks come in lane pairs
// 2m, 2m+1 that are adjacent in the output (o + 8 = the odd lane's o):
// chunk counts are even and rows hold an even number of chunks, so a pair
// is never split by the end of the data or of a row, and both lanes are
// valid or neither is. The even lane keeps its first half and sends its
// second, the odd lane sends its first: store 1 writes the pair's first
// sector (even lane: its own first half; odd lane: the even lane's second
// half), store 2 the pair's second sector.
template <class Off>   // unsigned (row kernel) or long long (dense Q8_0)
__device__ __forceinline__ void store8_f32_pair(float *__restrict__ out, Off o, const float *y,
                                                bool valid) {
    const bool odd = threadIdx.x & 1;
    float r[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = __shfl_xor_sync(0xffffffffu, odd ? y[k] : y[4 + k], 1);
    if (!valid) return;
    float *p = out + o;
    const uint4 a = odd ? make_uint4(as_u32(r[0]), as_u32(r[1]), as_u32(r[2]), as_u32(r[3]))
                        : make_uint4(as_u32(y[0]), as_u32(y[1]), as_u32(y[2]), as_u32(y[3]));
    const uint4 b = odd ? make_uint4(as_u32(y[4]), as_u32(y[5]), as_u32(y[6]), as_u32(y[7]))
                        : make_uint4(as_u32(r[0]), as_u32(r[1]), as_u32(r[2]), as_u32(r[3]));
    store16<STRATA_WIDE_STREAM>(odd ? p - 4 : p, a);
    store16<STRATA_WIDE_STREAM>(odd ? p + 4 : p + 8, b);
}

// Row-major body for any ld % 8 == 0, one CUDA block `blk` of a launch:
// chunk c of the launch is chunk c % cpr of row c / cpr (cpr = cols/8 chunks
// per row). A CUDA block covers kThreads·kCpt consecutive chunks, thread t
// those at t + kThreads·k, so every f16/bf16 store instruction of a warp
// stays one contiguous 512-byte run (f32: store8_f32_pair, whole sectors). `blocks` and `out` point at the launch's first
// row; the host sizes each launch so that every byte offset into blocks and
// every element offset into out fits 32 bits (cheap index arithmetic).
// Out-of-range chunks read the last valid chunk and store nothing, so the
// loop has no early exit and the loads of all kCpt chunks can be in flight
// together. Both the single-tensor kernel and the many-tensor kernel below
// run this same code.
template <class W, int OUT>
__device__ __forceinline__ void wide_rows_block(const uint8_t *__restrict__ blocks, unsigned total,
                                                FastDiv cpr, unsigned row_bytes, unsigned ld,
                                                void *__restrict__ out, unsigned blk,
                                                const float *kv) {
    constexpr unsigned CPB = W::QK / 8;   // chunks per block
    constexpr int kCpt = CptOf<W, OUT>::value;
    float y[kCpt][8];
    bool finite[kCpt];
    unsigned o[kCpt];
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c0 = (blk * kCpt + k) * kThreads + threadIdx.x;
        const unsigned c = c0 < total ? c0 : total - 1;
        const unsigned r = fast_div(c, cpr), ci = c - r * cpr.d;
        const uint8_t *b = blocks + (r * row_bytes + (ci / CPB) * (unsigned)W::B);
        finite[k] = W::chunk(b, ci % CPB, kv, y[k]);
        o[k] = r * ld + 8 * ci;
    }
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const bool valid = (blk * kCpt + k) * kThreads + threadIdx.x < total;
        if constexpr (OUT == OUT_F32 && kF32Store != 0) {
            if (!finite[k]) canonicalize8(y[k]);
            store8_f32_pair(static_cast<float *>(out), o[k], y[k], valid);
        } else {
            if (!valid) continue;
            if (!finite[k]) canonicalize8(y[k]);
            store8_canonical<OUT, STRATA_WIDE_STREAM>(out, o[k], y[k]);
        }
    }
}

// Chunk pairs (STRATA_WIDE_PAIRS, default 1; K-quants and IQ4_XS to f16 and
// bf16): thread t of a CUDA block takes the pairs at t + kThreads·k of the
// launch, pair P being Wide::pair index P % 16 of block P / 16 in row-major
// order (rows hold a whole number of blocks, 16 pairs each). A thread then
// loads and unpacks a block's shared bytes once for 16 values: on the H200
// the single-chunk kernels issued 70 % of the issue slots (Nsight Compute)
// and reached 83-88 % of the copy, the pairs 51-55 % and 91-93 %. A warp's
// pairs cover 64 consecutive chunks, and each 16-byte store instruction
// writes whole 32-byte sectors (runs of 2 or 4 adjacent chunks). f32
// outputs keep single chunks: with pairs their lane-pair stores need twice
// the shuffles per thread, and they measured 1-12 points slower.
// STRATA_WIDE_PPT: pairs per thread (2 measured slower: 48 registers, 62 %
// occupancy).
#ifndef STRATA_WIDE_PAIRS
#define STRATA_WIDE_PAIRS 1
#endif
#ifndef STRATA_WIDE_PPT
#define STRATA_WIDE_PPT 1
#endif
constexpr int kPpt = STRATA_WIDE_PPT;   // pairs per thread
template <class W, int OUT>
constexpr bool kPairs = STRATA_WIDE_PAIRS != 0 && W::QK == 256 && OUT != OUT_F32;

// IQ4_XS's kv table for the pair kernel: lane l holds kv[l % 16] and a
// lookup is a shuffle from that lane (every lane of the warp runs pair()).
// Unlike the shared table of the single-chunk kernels it needs no
// __syncthreads at the start of each CUDA block, which Nsight Compute
// showed as 5 cycles of barrier stall per issued instruction.
struct KvShfl {
    float v;
    __device__ __forceinline__ float operator()(uint32_t i) const {
        return __shfl_sync(0xffffffffu, v, (int)i);
    }
};

template <class W, int OUT>
__device__ __forceinline__ void wide_pairs_block(const uint8_t *__restrict__ blocks, unsigned total,
                                                 FastDiv cpr, unsigned row_bytes, unsigned ld,
                                                 void *__restrict__ out, unsigned blk,
                                                 const float *kv) {
    static_assert(OUT != OUT_F32, "f32 outputs take single chunks");
    const unsigned npairs = total / 2, ppr = cpr.d / 2;
    const KvShfl kvs{W::KV ? (float)tab_kvalues_iq4nl[threadIdx.x & 15] : 0.0f};
    float y[kPpt][2][8];
    bool finite[kPpt];
    unsigned o[kPpt];
#pragma unroll
    for (int k = 0; k < kPpt; ++k) {
        const unsigned P0 = (blk * kPpt + k) * kThreads + threadIdx.x;
        const unsigned P = P0 < npairs ? P0 : npairs - 1;
        const unsigned r = fast_div(2 * P, cpr);   // = P / ppr, with the launch's divisor
        const unsigned pi = P - r * ppr, sb = pi >> 4, pl = pi & 15;
        finite[k] = W::pair(blocks + (r * row_bytes + sb * (unsigned)W::B), (int)pl, kvs, y[k][0], y[k][1]);
        o[k] = r * ld + 8 * (sb * (W::QK / 8) + (unsigned)W::lo((int)pl));
    }
#pragma unroll
    for (int k = 0; k < kPpt; ++k) {
        if ((blk * kPpt + k) * kThreads + threadIdx.x >= npairs) continue;
        if (!finite[k]) {
            canonicalize8(y[k][0]);
            canonicalize8(y[k][1]);
        }
        store8_canonical<OUT, STRATA_WIDE_STREAM>(out, o[k], y[k][0]);
        store8_canonical<OUT, STRATA_WIDE_STREAM>(out, o[k] + 8 * W::D, y[k][1]);
    }
}

// The row-major body of a CUDA block: chunk pairs or single chunks.
template <class W, int OUT>
__device__ __forceinline__ void wide_body(const uint8_t *__restrict__ blocks, unsigned total,
                                          FastDiv cpr, unsigned row_bytes, unsigned ld,
                                          void *__restrict__ out, unsigned blk, const float *kv) {
    if constexpr (kPairs<W, OUT>)
        wide_pairs_block<W, OUT>(blocks, total, cpr, row_bytes, ld, out, blk, kv);
    else
        wide_rows_block<W, OUT>(blocks, total, cpr, row_bytes, ld, out, blk, kv);
}

// Q8_0 with ld == cols, one CUDA block `blk`: the rows are one flat run of
// blocks and outputs, so chunk c is block c/4, part c%4, and lands at
// out + 8c (no division).
template <int OUT>
__device__ __forceinline__ void wide_q8_0_block(const uint8_t *__restrict__ blocks,
                                                unsigned chunks, void *__restrict__ out,
                                                unsigned blk) {
    constexpr int kCpt = CptOf<WideQ8_0, OUT>::value;
    float y[kCpt][8];
    bool finite[kCpt];
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c0 = (blk * kCpt + k) * kThreads + threadIdx.x;
        const unsigned c = c0 < chunks ? c0 : chunks - 1;
        finite[k] = WideQ8_0::chunk(blocks + (long long)(c >> 2) * WideQ8_0::B, c & 3, nullptr, y[k]);
    }
#pragma unroll
    for (int k = 0; k < kCpt; ++k) {
        const unsigned c = (blk * kCpt + k) * kThreads + threadIdx.x;
        if constexpr (OUT == OUT_F32 && kF32Store != 0) {
            if (!finite[k]) canonicalize8(y[k]);
            store8_f32_pair(static_cast<float *>(out), 8LL * c, y[k], c < chunks);
        } else {
            if (c >= chunks) continue;
            if (!finite[k]) canonicalize8(y[k]);
            store8_canonical<OUT, STRATA_WIDE_STREAM>(out, 8LL * c, y[k]);
        }
    }
}

// IQ4_XS's 16-entry kv table into shared memory, for the single-chunk
// kernels (a no-op for other types and for the pair kernel, KvShfl).
template <class W, int OUT>
__device__ __forceinline__ void load_kv(float *kv) {
    if constexpr (W::KV && !kPairs<W, OUT>) {
        if (threadIdx.x < 16) kv[threadIdx.x] = (float)tab_kvalues_iq4nl[threadIdx.x];
        __syncthreads();
    }
}

template <class W>
constexpr bool kDense = std::is_same<W, WideQ8_0>::value;   // the ld == cols kernel

template <class W, int OUT>
__global__ void __launch_bounds__(kThreads)
dequant_wide_kernel(const uint8_t *__restrict__ blocks, unsigned total, FastDiv cpr,
                    unsigned row_bytes, unsigned ld, void *__restrict__ out) {
    __shared__ float kv[16];
    load_kv<W, OUT>(kv);
    wide_body<W, OUT>(blocks, total, cpr, row_bytes, ld, out, blockIdx.x, kv);
}

template <int OUT>
__global__ void __launch_bounds__(kThreads)
dequant_wide_q8_0_kernel(const uint8_t *__restrict__ blocks, unsigned chunks,
                         void *__restrict__ out) {
    wide_q8_0_block<OUT>(blocks, chunks, out, blockIdx.x);
}

// One launch over several tensors (spans). A span is one row batch of one
// tensor, with the arguments of a single-tensor launch, and owns the CUDA
// blocks [first_block, next span's first_block) of the grid. The spans ride
// in the kernel's parameters (about 0.8 KB; no device memory, no copy, so a
// call can be captured into a CUDA graph); the dynamically indexed reads
// below are constant-bank loads (ptxas reports no stack frame).
struct WideSpan {
    const uint8_t *blocks;   // the span's first row
    void *out;               // its first output element
    unsigned total;          // chunks of 8 values
    unsigned row_bytes;
    unsigned ld;             // cols when the span is one row (keeps offsets in 32 bits)
    unsigned first_block;    // first CUDA block of the span in its launch
    FastDiv cpr;             // chunks per row
};
constexpr int kMaxSpans = 16;
struct WideSpans {
    WideSpan s[kMaxSpans];
    int count;
};

template <class W, int OUT>
__global__ void __launch_bounds__(kThreads) dequant_wide_many_kernel(const WideSpans spans) {
    __shared__ float kv[16];
    load_kv<W, OUT>(kv);
    int i = 0;   // uniform over the CUDA block: at most 15 compares
    while (i + 1 < spans.count && blockIdx.x >= spans.s[i + 1].first_block) ++i;
    const WideSpan &sp = spans.s[i];
    const unsigned blk = blockIdx.x - sp.first_block;
    if constexpr (kDense<W>)
        wide_q8_0_block<OUT>(sp.blocks, sp.total, sp.out, blk);
    else
        wide_body<W, OUT>(sp.blocks, sp.total, sp.cpr, sp.row_bytes, sp.ld, sp.out, blk, kv);
}

template <class W, int OUT>
static unsigned wide_grid(long long chunks) {
    constexpr int per_block = kPairs<W, OUT> ? 2 * kThreads * kPpt : kThreads * CptOf<W, OUT>::value;
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

// The spans of rows [row0, row0 + rows) of one tensor, in order, each handed
// to f: row batches of at most kMaxThreadsPerLaunch chunks whose 32-bit
// offsets cannot overflow (blocks: rows·row_bytes; outputs: (rows − 1)·ld +
// cols). Q8_0's dense kernel uses 64-bit offsets and needs only the chunk bound.
template <class W, int OUT, class F>
static cudaError_t for_each_span(const uint8_t *blocks, long long row0, long long rows,
                                 long long cols, long long ld, void *out, F &&f) {
    const long long cpr = cols / 8;
    const long long row_bytes = (cols / W::QK) * W::B;
    long long batch = kMaxThreadsPerLaunch / cpr;
    if constexpr (!kDense<W>) {
        const long long lim = 0xFFFFFFFFLL;
        batch = std::min(batch, lim / row_bytes);
        batch = std::min(batch, (lim - cols) / ld + 1);
    }
    const int size = OUT == OUT_F32 ? 4 : 2;
    const FastDiv div = make_fast_div((uint32_t)cpr);
    for (long long r0 = 0; r0 < rows; r0 += batch) {
        const long long n = std::min(rows - r0, batch);
        WideSpan s{};
        s.blocks = blocks + (row0 + r0) * row_bytes;
        s.out = static_cast<char *>(out) + r0 * ld * size;
        s.total = (unsigned)(n * cpr);
        s.row_bytes = (unsigned)row_bytes;
        s.ld = (unsigned)(n > 1 ? ld : cols);
        s.cpr = div;
        const cudaError_t e = f(s);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

// Calls f(W{}, std::integral_constant<int, OUT>{}) with the Wide struct of
// `type` and the output dtype; cudaErrorInvalidValue for a pair without a
// kernel. The single place that maps run-time codes to kernel templates.
template <class F>
static cudaError_t with_wide(int type, int out_dtype, F &&f) {
    auto by_type = [&](auto out) -> cudaError_t {
        switch (type) {
        case T_Q8_0: return f(WideQ8_0{}, out);
        case T_Q4_K: return f(WideQ4_K{}, out);
        case T_Q5_K: return f(WideQ5_K{}, out);
        case T_Q6_K: return f(WideQ6_K{}, out);
        case T_IQ4_XS: return f(WideIQ4_XS{}, out);
        default: return cudaErrorInvalidValue;
        }
    };
    switch (out_dtype) {
    case OUT_F32: return by_type(std::integral_constant<int, OUT_F32>{});
    case OUT_F16: return by_type(std::integral_constant<int, OUT_F16>{});
    case OUT_BF16: return by_type(std::integral_constant<int, OUT_BF16>{});
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t launch_wide(int type, const unsigned char *blocks, long long row0, long long rows,
                        long long cols, long long ld, int out_dtype, void *out,
                        cudaStream_t stream) {
    return with_wide(type, out_dtype, [&](auto w, auto out_c) -> cudaError_t {
        using W = decltype(w);
        constexpr int OUT = decltype(out_c)::value;
        return for_each_span<W, OUT>(blocks, row0, rows, cols, ld, out, [&](const WideSpan &s) {
            const unsigned grid = wide_grid<W, OUT>(s.total);
            if constexpr (kDense<W>)
                dequant_wide_q8_0_kernel<OUT><<<grid, kThreads, 0, stream>>>(s.blocks, s.total, s.out);
            else
                dequant_wide_kernel<W, OUT><<<grid, kThreads, 0, stream>>>(
                    s.blocks, s.total, s.cpr, s.row_bytes, s.ld, s.out);
            return cudaGetLastError();
        });
    });
}

// The spans of all tensors, packed kMaxSpans per launch in order: one launch
// unless a tensor is so large that its rows need several batches (more than
// 2^30 chunks or 4 GiB of blocks) or the tensors bring more than kMaxSpans
// spans in all.
cudaError_t launch_wide_many(int type, const strata_dequant_item *items, int count,
                             int out_dtype, cudaStream_t stream) {
    return with_wide(type, out_dtype, [&](auto w, auto out_c) -> cudaError_t {
        using W = decltype(w);
        constexpr int OUT = decltype(out_c)::value;
        WideSpans pack{};
        unsigned grid = 0;
        auto flush = [&]() -> cudaError_t {
            if (pack.count == 0) return cudaSuccess;
            dequant_wide_many_kernel<W, OUT><<<grid, kThreads, 0, stream>>>(pack);
            pack.count = 0;
            grid = 0;
            return cudaGetLastError();
        };
        for (int i = 0; i < count; ++i) {
            const strata_dequant_item &it = items[i];
            const cudaError_t e = for_each_span<W, OUT>(
                static_cast<const uint8_t *>(it.blocks), it.row0, it.rows, it.cols, it.ld, it.out,
                [&](WideSpan s) -> cudaError_t {
                    if (pack.count == kMaxSpans) {
                        const cudaError_t f = flush();
                        if (f != cudaSuccess) return f;
                    }
                    s.first_block = grid;
                    grid += wide_grid<W, OUT>(s.total);   // <= 2^22 per span
                    pack.s[pack.count++] = s;
                    return cudaSuccess;
                });
            if (e != cudaSuccess) return e;
        }
        return flush();
    });
}

}  // namespace strata

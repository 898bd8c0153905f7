// Internal interface between api.cu (argument checks, status codes) and the
// kernel translation units. Each launcher assumes its arguments were checked
// and returns the cudaError_t of the launch.
#pragma once

#include <cuda_runtime.h>

struct strata_dequant_item;

namespace strata {

struct TypeInfo {
    int qk;      // values per block
    int bytes;   // bytes per block
};

// Generic kernel: block geometry of `type`, or {0, 0} when it has none.
TypeInfo generic_type_info(int type);
cudaError_t launch_generic(int type, const unsigned char *blocks, long long row0,
                           long long rows, long long cols, long long ld, int out_dtype,
                           void *out, cudaStream_t stream);

// Wide kernels: whether one exists for (type, out dtype), the alignment it
// needs of the blocks pointer, and whether it requires ld == cols (Q8_0).
bool wide_has_kernel(int type, int out_dtype);
int wide_blocks_align(int type);
bool wide_needs_dense(int type);
cudaError_t launch_wide(int type, const unsigned char *blocks, long long row0,
                        long long rows, long long cols, long long ld, int out_dtype,
                        void *out, cudaStream_t stream);

// Wide kernels over several tensors of one type: their row batches packed
// into as few launches as the limits allow. Arguments checked.
cudaError_t launch_wide_many(int type, const strata_dequant_item *items, int count,
                             int out_dtype, cudaStream_t stream);

cudaError_t launch_f32_to_bf16(const float *in, unsigned short *out, long long n,
                               cudaStream_t stream);
cudaError_t launch_f32_to_f16(const float *in, unsigned short *out, long long n,
                              cudaStream_t stream);

// Largest number of threads one launch may cover; longer work is split into
// row batches so that thread indices fit 32 bits (cheap index division).
constexpr long long kMaxThreadsPerLaunch = 1LL << 30;

}  // namespace strata

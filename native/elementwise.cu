// Elementwise f32 -> bf16 / f16 conversions (spec/kernels.md §13,
// elementwise_parity): bf16 by ggml's bit rule in software (NaN payloads
// kept, quiet bit forced), f16 by __float2half_rn with NaN -> 0x7FFF.
#include "strata_common.cuh"
#include "strata_launch.h"

namespace strata {

__global__ void f32_to_bf16_kernel(const uint32_t *__restrict__ in, uint16_t *__restrict__ out,
                                   long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = bf16_bits_ggml(in[i]);
}

__global__ void f32_to_f16_kernel(const float *__restrict__ in, uint16_t *__restrict__ out,
                                  long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = out_f16_bits(in[i]);
}

static unsigned grid_for(long long n) {
    const long long g = (n + 255) / 256;
    return (unsigned)(g < 65536 ? g : 65536);
}

cudaError_t launch_f32_to_bf16(const float *in, unsigned short *out, long long n,
                               cudaStream_t stream) {
    f32_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(reinterpret_cast<const uint32_t *>(in),
                                                         out, n);
    return cudaGetLastError();
}

cudaError_t launch_f32_to_f16(const float *in, unsigned short *out, long long n,
                              cudaStream_t stream) {
    f32_to_f16_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n);
    return cudaGetLastError();
}

}  // namespace strata

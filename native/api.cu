// The C ABI of strata_dequant.h: argument checks and status codes in front
// of the kernel launchers. Nothing is launched unless every check passes.
#include <stdint.h>

#include "strata_dequant.h"
#include "strata_launch.h"

using namespace strata;

static thread_local int g_last_cuda_error = 0;

static int cuda_status(cudaError_t e) {
    if (e == cudaSuccess) return STRATA_OK;
    g_last_cuda_error = (int)e;
    return STRATA_E_CUDA;
}

static bool aligned(const void *p, int a) { return a > 0 && ((uintptr_t)p % (uintptr_t)a) == 0; }

extern "C" {

int strata_abi_version(void) { return STRATA_ABI_VERSION; }

int strata_dequant_has_kernel(int type, int kernel, int out_dtype) {
    if (out_dtype < STRATA_OUT_F32 || out_dtype > STRATA_OUT_BF16) return 0;
    if (kernel == STRATA_KERNEL_GENERIC) return generic_type_info(type).qk > 0;
    if (kernel == STRATA_KERNEL_WIDE) return wide_has_kernel(type, out_dtype);
    return 0;
}

int strata_block_bytes(int type) { return generic_type_info(type).bytes; }
int strata_block_values(int type) { return generic_type_info(type).qk; }
int strata_wide_blocks_align(int type) { return wide_blocks_align(type); }

int strata_dequant(int type, const void *blocks, long long row0, long long rows, long long cols,
                   long long ld, int out_dtype, void *out, int kernel, void *stream) {
    if (out_dtype < STRATA_OUT_F32 || out_dtype > STRATA_OUT_BF16) return STRATA_E_ARG;
    if (kernel != STRATA_KERNEL_GENERIC && kernel != STRATA_KERNEL_WIDE) return STRATA_E_ARG;
    if (!strata_dequant_has_kernel(type, kernel, out_dtype)) return STRATA_E_TYPE;
    if (blocks == nullptr || out == nullptr) return STRATA_E_NULL;
    const TypeInfo ti = generic_type_info(type);
    // Shape guards; the limits keep every index product far from overflow.
    if (rows <= 0 || cols <= 0 || row0 < 0 || ld < cols || cols % ti.qk != 0) return STRATA_E_SHAPE;
    if (cols > (1LL << 30) || rows > (1LL << 40) || ld > (1LL << 40) || row0 > (1LL << 40))
        return STRATA_E_SHAPE;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const unsigned char *b = static_cast<const unsigned char *>(blocks);
    if (kernel == STRATA_KERNEL_GENERIC)
        return cuda_status(launch_generic(type, b, row0, rows, cols, ld, out_dtype, out, s));
    // Wide guards (spec/kernels.md §4): 16-byte stores at out + (r·ld + 8c)·size.
    if (cols % 8 != 0 || ld % 8 != 0 || !aligned(out, 16) || !aligned(blocks, wide_blocks_align(type)))
        return STRATA_E_GUARD;
    if (wide_needs_dense(type) && ld != cols) return STRATA_E_GUARD;
    return cuda_status(launch_wide(type, b, row0, rows, cols, ld, out_dtype, out, s));
}

int strata_f32_to_bf16(const void *in, void *out, long long n, void *stream) {
    if (in == nullptr || out == nullptr) return STRATA_E_NULL;
    if (n <= 0) return STRATA_E_SHAPE;
    return cuda_status(launch_f32_to_bf16(static_cast<const float *>(in),
                                          static_cast<unsigned short *>(out), n,
                                          static_cast<cudaStream_t>(stream)));
}

int strata_f32_to_f16(const void *in, void *out, long long n, void *stream) {
    if (in == nullptr || out == nullptr) return STRATA_E_NULL;
    if (n <= 0) return STRATA_E_SHAPE;
    return cuda_status(launch_f32_to_f16(static_cast<const float *>(in),
                                         static_cast<unsigned short *>(out), n,
                                         static_cast<cudaStream_t>(stream)));
}

int strata_last_cuda_error(void) { return g_last_cuda_error; }

const char *strata_cuda_error_string(int err) { return cudaGetErrorString((cudaError_t)err); }

int strata_device_count(int *count) {
    if (count == nullptr) return STRATA_E_NULL;
    return cuda_status(cudaGetDeviceCount(count));
}

int strata_device_cc(int device, int *major, int *minor) {
    if (major == nullptr || minor == nullptr) return STRATA_E_NULL;
    const int s = cuda_status(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device));
    if (s != STRATA_OK) return s;
    return cuda_status(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device));
}

int strata_set_device(int device) { return cuda_status(cudaSetDevice(device)); }

int strata_malloc(void **ptr, long long nbytes) {
    if (ptr == nullptr) return STRATA_E_NULL;
    if (nbytes <= 0) return STRATA_E_SHAPE;
    return cuda_status(cudaMalloc(ptr, (size_t)nbytes));
}

int strata_free(void *ptr) { return cuda_status(cudaFree(ptr)); }

int strata_memcpy_htod(void *dst, const void *src, long long nbytes) {
    if (nbytes < 0) return STRATA_E_SHAPE;
    if (nbytes == 0) return STRATA_OK;
    if (dst == nullptr || src == nullptr) return STRATA_E_NULL;
    return cuda_status(cudaMemcpy(dst, src, (size_t)nbytes, cudaMemcpyHostToDevice));
}

int strata_memcpy_dtoh(void *dst, const void *src, long long nbytes) {
    if (nbytes < 0) return STRATA_E_SHAPE;
    if (nbytes == 0) return STRATA_OK;
    if (dst == nullptr || src == nullptr) return STRATA_E_NULL;
    return cuda_status(cudaMemcpy(dst, src, (size_t)nbytes, cudaMemcpyDeviceToHost));
}

int strata_memset(void *ptr, int value, long long nbytes) {
    if (nbytes < 0) return STRATA_E_SHAPE;
    if (nbytes == 0) return STRATA_OK;
    if (ptr == nullptr) return STRATA_E_NULL;
    return cuda_status(cudaMemset(ptr, value, (size_t)nbytes));
}

int strata_synchronize(void) { return cuda_status(cudaDeviceSynchronize()); }

}  // extern "C"

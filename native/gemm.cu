// The prompt-path GEMM routes of ../shared/spec/kernels.md §11 behind the C
// ABI of strata_gemm.h: the FP16-operand route (one cublasGemmEx), the FP32
// route (exact widening, cublasSgemm) and the slicing loop by scratch rows.
//
// Layout: X (T x K) and W (N x K) are row-major, Y (T x ldy) row-major. In
// cuBLAS's column-major terms W is a K x N matrix with ld K and X a K x T
// matrix with ld K, so Y^T (N x T, ld ldy) = op(W)=W^T · X: opA = T, opB = N,
// m = N, n = T, k = K. That is Strata's `Gemm::f16` call, unchanged.
#include <climits>
#include <cstdint>
#include <cstdlib>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "strata_gemm.h"

namespace {

constexpr long long kWorkspaceBytes = 32LL << 20;
constexpr int kDequantOutF16 = 1;            // STRATA_OUT_F16 of strata_dequant.h
constexpr int kDequantKernelWide = 1;        // STRATA_KERNEL_WIDE of strata_dequant.h

typedef int (*dequant_fn_t)(int type, const void *blocks, long long row0, long long rows,
                            long long cols, long long ld, int out_dtype, void *out,
                            int kernel, void *stream);

thread_local int g_last_error = 0;

int cuda_status(cudaError_t e) {
    if (e == cudaSuccess) return STRATA_GEMM_OK;
    g_last_error = (int)e;
    return STRATA_GEMM_E_CUDA;
}

int cublas_status(cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return STRATA_GEMM_OK;
    g_last_error = (int)s;
    return STRATA_GEMM_E_CUBLAS;
}

// Exact conversions: f16 -> f32 is exact for every half (NaN stays NaN);
// f32 -> f16 is __float2half_rn (RNE, ±Inf from 65520), the rounding the
// FP16 route applies to float32 activations.
__global__ void widen_f16_kernel(const __half *in, float *out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __half2float(in[i]);
}

__global__ void round_f16_kernel(const float *in, __half *out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(in[i]);
}

unsigned grid_for(long long n) {
    long long b = (n + 255) / 256;
    return (unsigned)(b < (1LL << 20) ? b : (1LL << 20));
}

}  // namespace

struct strata_gemm_ctx {
    int device;
    cublasHandle_t handle;
    void *workspace;
    dequant_fn_t dequant;
    void *xbuf;            // activations converted for the route (f16 or f32)
    long long xbuf_bytes;
    void *wbuf;            // f32 route: the widened weight rows
    long long wbuf_bytes;
};

namespace {

// A buffer of at least `bytes`; an in-flight use of the old one on `stream`
// is waited for before it is freed. Growth is geometric (at least doubling,
// whole MiB), so a caller stepping T up one row at a time reallocates
// O(log T) times, not once per call.
int ensure(void **buf, long long *cap, long long bytes, cudaStream_t stream) {
    if (*cap >= bytes) return STRATA_GEMM_OK;
    if (bytes < 2 * *cap) bytes = 2 * *cap;
    bytes = (bytes + (1LL << 20) - 1) & ~((1LL << 20) - 1);
    if (*buf != nullptr) {
        int st = cuda_status(cudaStreamSynchronize(stream));
        if (st) return st;
        cudaFree(*buf);
        *buf = nullptr;
        *cap = 0;
    }
    int st = cuda_status(cudaMalloc(buf, (size_t)bytes));
    if (st) return st;
    *cap = bytes;
    return STRATA_GEMM_OK;
}

int bind(strata_gemm_ctx *ctx, cudaStream_t stream) {
    int st = cuda_status(cudaSetDevice(ctx->device));
    if (st) return st;
    // cublasSetStream resets the workspace to cuBLAS's pool, so the fixed
    // workspace is set again after it on every call.
    st = cublas_status(cublasSetStream(ctx->handle, stream));
    if (st) return st;
    return cublas_status(cublasSetWorkspace(ctx->handle, ctx->workspace, (size_t)kWorkspaceBytes));
}

bool fits_int(long long v) { return v > 0 && v <= INT_MAX; }

int check_shape(long long n, long long k, long long t, long long ldy) {
    if (!fits_int(n) || !fits_int(k) || !fits_int(t) || !fits_int(ldy) || ldy < n)
        return STRATA_GEMM_E_SHAPE;
    return STRATA_GEMM_OK;
}

// The activation operand of `route`, converting into ctx->xbuf when X's
// dtype is not the route's operand type.
int prepare_x(strata_gemm_ctx *ctx, int route, const void *x, int x_dtype, long long t,
              long long k, cudaStream_t stream, const void **xop) {
    const long long n = t * k;
    if (route == STRATA_GEMM_F16 && x_dtype == STRATA_GEMM_X_F32) {
        int st = ensure(&ctx->xbuf, &ctx->xbuf_bytes, n * 2, stream);
        if (st) return st;
        round_f16_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const float *>(x),
                                                          static_cast<__half *>(ctx->xbuf), n);
        *xop = ctx->xbuf;
        return cuda_status(cudaGetLastError());
    }
    if (route == STRATA_GEMM_F32 && x_dtype == STRATA_GEMM_X_F16) {
        int st = ensure(&ctx->xbuf, &ctx->xbuf_bytes, n * 4, stream);
        if (st) return st;
        widen_f16_kernel<<<grid_for(n), 256, 0, stream>>>(static_cast<const __half *>(x),
                                                          static_cast<float *>(ctx->xbuf), n);
        *xop = ctx->xbuf;
        return cuda_status(cudaGetLastError());
    }
    *xop = x;
    return STRATA_GEMM_OK;
}

// Y[:, 0:m] (row stride ldy) = X · W^T + beta·Y for m rows of f16 weights
// and the route's activation operand `xop`.
int gemm_rows(strata_gemm_ctx *ctx, int route, const void *w_f16, long long m, long long k,
              const void *xop, long long t, float *y, long long ldy, int beta,
              cudaStream_t stream) {
    const float alpha = 1.0f, b = beta ? 1.0f : 0.0f;
    if (route == STRATA_GEMM_F16)
        return cublas_status(cublasGemmEx(
            ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)t, (int)k, &alpha,
            w_f16, CUDA_R_16F, (int)k, xop, CUDA_R_16F, (int)k, &b, y, CUDA_R_32F, (int)ldy,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    const long long nw = m * k;
    int st = ensure(&ctx->wbuf, &ctx->wbuf_bytes, nw * 4, stream);
    if (st) return st;
    widen_f16_kernel<<<grid_for(nw), 256, 0, stream>>>(static_cast<const __half *>(w_f16),
                                                       static_cast<float *>(ctx->wbuf), nw);
    st = cuda_status(cudaGetLastError());
    if (st) return st;
    return cublas_status(cublasSgemm(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)t, (int)k,
                                     &alpha, static_cast<const float *>(ctx->wbuf), (int)k,
                                     static_cast<const float *>(xop), (int)k, &b, y, (int)ldy));
}

int check_common(strata_gemm_ctx *ctx, int route, const void *w, const void *x, int x_dtype,
                 const float *y, int beta) {
    if (ctx == nullptr || w == nullptr || x == nullptr || y == nullptr) return STRATA_GEMM_E_NULL;
    if (route != STRATA_GEMM_F16 && route != STRATA_GEMM_F32) return STRATA_GEMM_E_ARG;
    if (x_dtype != STRATA_GEMM_X_F32 && x_dtype != STRATA_GEMM_X_F16) return STRATA_GEMM_E_ARG;
    if (beta != 0 && beta != 1) return STRATA_GEMM_E_ARG;
    return STRATA_GEMM_OK;
}

}  // namespace

extern "C" {

int strata_gemm_abi_version(void) { return STRATA_GEMM_ABI_VERSION; }

long long strata_gemm_workspace_bytes(void) { return kWorkspaceBytes; }

int strata_gemm_create(int device, void *dequant_fn, strata_gemm_ctx **out) {
    if (out == nullptr) return STRATA_GEMM_E_NULL;
    *out = nullptr;
    int st = cuda_status(cudaSetDevice(device));
    if (st) return st;
    strata_gemm_ctx *ctx = static_cast<strata_gemm_ctx *>(calloc(1, sizeof(strata_gemm_ctx)));
    if (ctx == nullptr) return cuda_status(cudaErrorMemoryAllocation);
    ctx->device = device;
    ctx->dequant = reinterpret_cast<dequant_fn_t>(dequant_fn);
    st = cublas_status(cublasCreate(&ctx->handle));
    if (!st) st = cublas_status(cublasSetMathMode(ctx->handle, CUBLAS_DEFAULT_MATH));
    if (!st) st = cuda_status(cudaMalloc(&ctx->workspace, (size_t)kWorkspaceBytes));
    if (!st) st = cublas_status(cublasSetWorkspace(ctx->handle, ctx->workspace,
                                                   (size_t)kWorkspaceBytes));
    if (st) {
        strata_gemm_destroy(ctx);
        return st;
    }
    *out = ctx;
    return STRATA_GEMM_OK;
}

int strata_gemm_destroy(strata_gemm_ctx *ctx) {
    if (ctx == nullptr) return STRATA_GEMM_E_NULL;
    cudaSetDevice(ctx->device);
    cudaDeviceSynchronize();
    if (ctx->handle) cublasDestroy(ctx->handle);
    if (ctx->workspace) cudaFree(ctx->workspace);
    if (ctx->xbuf) cudaFree(ctx->xbuf);
    if (ctx->wbuf) cudaFree(ctx->wbuf);
    free(ctx);
    return STRATA_GEMM_OK;
}

int strata_gemm_cublas_version(strata_gemm_ctx *ctx, int *version) {
    if (ctx == nullptr || version == nullptr) return STRATA_GEMM_E_NULL;
    return cublas_status(cublasGetVersion(ctx->handle, version));
}

int strata_gemm_dense(strata_gemm_ctx *ctx, int route, const void *w_f16, long long n,
                      long long k, const void *x, int x_dtype, long long t, float *y,
                      long long ldy, int beta, void *stream) {
    int st = check_common(ctx, route, w_f16, x, x_dtype, y, beta);
    if (!st) st = check_shape(n, k, t, ldy);
    if (st) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const void *xop = nullptr;
    if ((st = bind(ctx, s)) || (st = prepare_x(ctx, route, x, x_dtype, t, k, s, &xop))) return st;
    return gemm_rows(ctx, route, w_f16, n, k, xop, t, y, ldy, beta, s);
}

int strata_gemm_quant(strata_gemm_ctx *ctx, int route, int wtype, const void *w_blocks,
                      long long n, long long k, const void *x, int x_dtype, long long t,
                      float *y, long long ldy, int beta, void *scratch,
                      long long scratch_elems, int dequant_kernel, void *stream) {
    int st = check_common(ctx, route, w_blocks, x, x_dtype, y, beta);
    if (st) return st;
    if (scratch == nullptr) return STRATA_GEMM_E_NULL;
    if (ctx->dequant == nullptr || dequant_kernel < 0 || dequant_kernel > kDequantKernelWide)
        return STRATA_GEMM_E_ARG;
    if ((st = check_shape(n, k, t, ldy))) return st;
    // Strata's Gemm::native: the whole of W when it fits, else floor(scratch / K) rows.
    const long long rows = (n * k <= scratch_elems) ? n : scratch_elems / k;
    if (rows < 1) return STRATA_GEMM_E_SHAPE;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const void *xop = nullptr;
    if ((st = bind(ctx, s)) || (st = prepare_x(ctx, route, x, x_dtype, t, k, s, &xop))) return st;
    for (long long r0 = 0; r0 < n; r0 += rows) {
        const long long m = (rows < n - r0) ? rows : n - r0;
        int dq = ctx->dequant(wtype, w_blocks, r0, m, k, k, kDequantOutF16, scratch,
                              dequant_kernel, stream);
        if (dq != 0) {
            g_last_error = dq;
            return STRATA_GEMM_E_DEQUANT;
        }
        if ((st = gemm_rows(ctx, route, scratch, m, k, xop, t, y + r0, ldy, beta, s))) return st;
    }
    return STRATA_GEMM_OK;
}

int strata_gemm_last_error(void) { return g_last_error; }

const char *strata_gemm_error_string(int status, int err) {
    if (status == STRATA_GEMM_E_CUDA) return cudaGetErrorString((cudaError_t)err);
    if (status == STRATA_GEMM_E_CUBLAS) return cublasGetStatusString((cublasStatus_t)err);
    if (status == STRATA_GEMM_E_DEQUANT) return "strata_dequant refused the slice";
    return "";
}

}  // extern "C"

/* strata-ref prompt-path GEMM: the C ABI of libstrata_gemm.
 *
 * Y[T, N] = X[T, K] · W[N, K]^T (+ Y when beta = 1), X and W row-major, Y
 * float32 with row stride ldy >= N; columns [N, ldy) of Y are never written.
 * Two routes (../shared/spec/kernels.md §11):
 *   STRATA_GEMM_F16  one cublasGemmEx: W and X as CUDA_R_16F, Y CUDA_R_32F,
 *                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT;
 *   STRATA_GEMM_F32  both operands widened exactly to f32 on the GPU, then
 *                    cublasSgemm with the same transposes, ld and beta.
 * A context per device owns the cuBLAS handle (CUBLAS_DEFAULT_MATH) and its
 * fixed 32 MiB workspace, both created once, plus operand buffers that grow
 * on demand. The weights of the prompt path are dequantized through the
 * dequant library's `strata_dequant` (native/strata_dequant.h), whose
 * address the caller passes to strata_gemm_create.
 *
 * Every entry point returns a strata_gemm_status; on a refusal (shape,
 * null, argument) nothing is launched and nothing is written.
 *
 * The block between the cdef markers is read verbatim by the Python loader
 * (cffi ABI mode, strata_ref/native/gemm_build.py): plain C only.
 */
#ifndef STRATA_GEMM_H
#define STRATA_GEMM_H

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
enum strata_gemm_route {
    STRATA_GEMM_F16 = 0,     /* FP16-operand route: cublasGemmEx */
    STRATA_GEMM_F32 = 1      /* FP32 route: widen, cublasSgemm */
};

enum strata_gemm_x_dtype {
    STRATA_GEMM_X_F32 = 0,   /* float32 activations (rounded to f16 by the F16 route) */
    STRATA_GEMM_X_F16 = 1    /* f16 activations (widened exactly by the F32 route) */
};

enum strata_gemm_status {
    STRATA_GEMM_OK = 0,
    STRATA_GEMM_E_SHAPE = 2,    /* t, n or k <= 0, ldy < n, a size past INT_MAX, scratch below one row */
    STRATA_GEMM_E_NULL = 3,     /* a null pointer or context */
    STRATA_GEMM_E_ARG = 5,      /* unknown route or x dtype, beta not 0 or 1, no dequant entry */
    STRATA_GEMM_E_CUDA = 6,     /* a CUDA runtime call failed: strata_gemm_last_error has the cudaError_t */
    STRATA_GEMM_E_CUBLAS = 7,   /* a cuBLAS call failed: strata_gemm_last_error has the cublasStatus_t */
    STRATA_GEMM_E_DEQUANT = 8   /* strata_dequant refused a slice: strata_gemm_last_error has its status */
};

typedef struct strata_gemm_ctx strata_gemm_ctx;

int strata_gemm_abi_version(void);

/* Bytes of the cuBLAS workspace each context owns (32 MiB). */
long long strata_gemm_workspace_bytes(void);

/* A context on CUDA device `device`: cuBLAS handle, workspace. `dequant_fn`
 * is the address of strata_dequant (may be null: then only
 * strata_gemm_dense works). */
int strata_gemm_create(int device, void *dequant_fn, strata_gemm_ctx **ctx);
int strata_gemm_destroy(strata_gemm_ctx *ctx);

/* cublasGetVersion of the context's handle (e.g. 130000 + minor·100 + patch). */
int strata_gemm_cublas_version(strata_gemm_ctx *ctx, int *version);

/* One GEMM over weights already in f16 (w_f16: n rows of k halves, row
 * stride k). x: t rows of k values of `x_dtype`, row stride k. y: float32,
 * row stride ldy. beta 0 overwrites, 1 accumulates. Asynchronous on
 * `stream` (a cudaStream_t; null is the legacy default stream). */
int strata_gemm_dense(strata_gemm_ctx *ctx, int route, const void *w_f16, long long n,
                      long long k, const void *x, int x_dtype, long long t, float *y,
                      long long ldy, int beta, void *stream);

/* The prompt path (Strata's Gemm::native): W is a ggml tensor of type
 * `wtype` (n rows of k values, from row 0 at w_blocks). If n·k <= scratch_elems
 * all of W is dequantized to f16 into `scratch` and one GEMM runs; otherwise
 * rows = scratch_elems / k per slice, and for r0 = 0, rows, ...: rows
 * [r0, r0 + m) are dequantized (ld = k) with kernel kind `dequant_kernel`
 * (strata_kernel of strata_dequant.h) and multiplied into columns
 * [r0, r0 + m) of Y. Returns STRATA_GEMM_E_SHAPE when the scratch holds no
 * row. scratch: at least min(n·k, rows·k) halves of device memory. */
int strata_gemm_quant(strata_gemm_ctx *ctx, int route, int wtype, const void *w_blocks,
                      long long n, long long k, const void *x, int x_dtype, long long t,
                      float *y, long long ldy, int beta, void *scratch,
                      long long scratch_elems, int dequant_kernel, void *stream);

/* Detail of this thread's last E_CUDA / E_CUBLAS / E_DEQUANT status, and
 * the text of a cudaError_t or cublasStatus_t. */
int strata_gemm_last_error(void);
const char *strata_gemm_error_string(int status, int err);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#define STRATA_GEMM_ABI_VERSION 1

#endif /* STRATA_GEMM_H */

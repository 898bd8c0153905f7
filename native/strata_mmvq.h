/* strata-ref native q8_1 mat-vec and MoE experts: the C ABI of libstrata_mmvq.
 *
 * Contract: ../shared/spec/kernels.md §§6-10 and the NumPy oracle
 * (strata_ref/routes/q8_1.py, mmvq.py, experts.py), bit for bit. Every entry
 * point returns 0 on success or a non-zero status (1 type, 2 shape, 3 null,
 * 5 argument, 6 CUDA) and then launches nothing. Pointers are device memory.
 * The block between the cdef markers is read verbatim by
 * strata_ref/native/mmvq.py (cffi ABI mode): plain C declarations only.
 */
#ifndef STRATA_MMVQ_H
#define STRATA_MMVQ_H

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
int smv_abi_version(void);

/* 1 if the mat-vec kernels serve ggml type `type`, else 0. */
int smv_has_type(int type);
/* The 1-column kernel of rows_per_warp 0: 0 automatic (the lanes kernel
 * where it serves the call, else the plain kernel with 1 row per block),
 * 1 or 2 rows per block of the plain kernel, 3 the lanes kernel (one warp
 * per row, each lane playing 4 of the 128 canonical threads; it serves
 * Q4_K, Q6_K and IQ4_XS with 16-byte aligned weights and K up to its
 * shared-memory limit, and the plain kernel runs otherwise). A tuning knob
 * for the bench and the parity tool; the output bits do not depend on it.
 * Returns 5 for another value. Process-wide, not thread-safe. */
int smv_set_plain_kernel(int kind);
/* 1 if the lanes kernel serves type `type`, else 0. */
int smv_has_lanes(int type);

/* q8_1 blocks (36 bytes per 32 values) of n float32 values; n % 32 == 0. */
int smv_quantize_q8_1(const float *x, void *q8, long long n, void *stream);

/* y[c*rows + r] = row r of W (rows x K, type `type`) times q8_1 column c
 * (column c starts at q8 + c*(K/32)*36), c < ncols (1..8).
 * rows_per_warp 0: for 1 column the kernel smv_set_plain_kernel names (by
 * default the lanes kernel where it serves the call, else the plain kernel),
 * for 2..8 columns the plain kernel (one 128-thread block per row);
 * 1, 2 or 4: the warp kernel (R consecutive rows per warp, 4 warps per
 * block, four virtual-warp accumulators). All give the canonical order. */
int smv_mmvq(int type, const void *w, long long rows, long long k, const void *q8,
             int ncols, float *y, int rows_per_warp, void *stream);

/* MoE FFN (experts.py): x (n_tok x H) float32, ids/wts (n_tok x k),
 * gate/up (n_exp x FF rows of H values, type t_gu), down (n_exp x H rows of
 * FF values, type t_down); out (n_tok x H). mode 0: separate kernels; mode 8:
 * fused gate/up + SwiGLU + q8_1 epilogue. scratch: smv_experts_scratch_bytes. */
long long smv_experts_scratch_bytes(long long h, long long ff, int n_tok, int k);
int smv_experts(int mode, int t_gu, int t_down, const void *gate, const void *up,
                const void *down, long long h, long long ff, const float *x, int n_tok,
                const int *ids, const float *wts, int k, float *out, void *scratch,
                void *stream);

/* Timing helpers for the bench: mean milliseconds per call over `iters`
 * calls after one warm-up, measured with CUDA events. smv_time_mmvq's call i
 * reads the weight copy at w + (i % nbuf)·wstride bytes: with nbuf copies
 * larger than the L2 together, every call reads its weights from DRAM.
 * smv_set_time_graph(0) (the default) times back-to-back launches on the
 * legacy stream; 1 captures the iters calls into one CUDA graph on a private
 * stream and times a replay, without host launch gaps (as decode engines run
 * a step). The mode is one setting for the whole process (not per thread).
 * Other values: status 5. */
int smv_set_time_graph(int on);
int smv_time_mmvq(int type, const void *w, long long wstride, int nbuf, long long rows,
                  long long k, const void *q8, int ncols, float *y, int rows_per_warp,
                  int iters, float *ms);
int smv_time_copy(void *dst, const void *src, long long nbytes, int iters, float *ms);
/* A read-only kernel over the first `nbytes` (multiple of 16 read; 16-byte
 * aligned w and wstride) of each weight copy, rotating like smv_time_mmvq:
 * the bench's peer for what reading the same bytes costs. */
int smv_time_read(const void *w, long long wstride, int nbuf, long long nbytes, int iters,
                  float *ms);
int smv_time_experts(int mode, int t_gu, int t_down, const void *gate, const void *up,
                     const void *down, long long h, long long ff, const float *x, int n_tok,
                     const int *ids, const float *wts, int k, float *out, void *scratch,
                     int iters, float *ms);

int smv_last_cuda_error(void);
/* The CUDA runtime's current device is per host thread: smv_set_device sets
 * it for the calling thread, smv_get_device returns it (-1 when the runtime
 * cannot say; the error in smv_last_cuda_error). strata_ref's wrapper makes
 * its device current before each call from any thread. */
int smv_set_device(int device);
int smv_get_device(void);
/* Test hook: the next device query (current device and multiprocessor count,
 * made by smv_time_read and by the lanes kernel's launch set-up) of the
 * calling thread fails with CUDA error `cuda_error` (> 0, else status 5), so
 * a test can check that the failure is returned as that call's status 6. */
int smv_fail_next_device_query(int cuda_error);
/* cudaDeviceReset of the current device: every pointer into that device's
 * memory becomes invalid. The kernels' cached launch set-up (shared-memory
 * limit, occupancy) is redone on their next call, in every host thread. */
int smv_device_reset(void);
int smv_malloc(void **ptr, long long nbytes);
int smv_free(void *ptr);
int smv_memcpy_htod(void *dst, const void *src, long long nbytes);
int smv_memcpy_dtoh(void *dst, const void *src, long long nbytes);
int smv_synchronize(void);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#define SMV_ABI_VERSION 7

#endif /* STRATA_MMVQ_H */

/* strata-ref native dequantization: the C ABI of libstrata_dequant.
 *
 * Kernel contract: ../shared/spec/kernels.md §§2-5 (generic kernel, wide
 * kernels, NaN canonicalisation); per-value formulas: spec/formats.md §5.
 * Every entry point returns a strata_status; a call that the kernels cannot
 * serve returns a non-zero status and launches and writes nothing.
 *
 * The block between the cdef markers is read verbatim by the Python loader
 * (cffi ABI mode, strata_ref/native/loader.py), so it holds only plain C
 * declarations: no preprocessor lines, no stdint names.
 */
#ifndef STRATA_DEQUANT_H
#define STRATA_DEQUANT_H

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
enum strata_out_dtype {
    STRATA_OUT_F32 = 0,
    STRATA_OUT_F16 = 1,
    STRATA_OUT_BF16 = 2
};

enum strata_kernel {
    STRATA_KERNEL_GENERIC = 0,   /* one thread per 32 values, scalar stores */
    STRATA_KERNEL_WIDE = 1       /* one thread per 8 values, 16-byte stores */
};

enum strata_status {
    STRATA_OK = 0,
    STRATA_E_TYPE = 1,       /* no kernel of this kind for the type / output dtype */
    STRATA_E_SHAPE = 2,      /* rows or cols 0, cols % QK != 0, ld < cols, row0 < 0, too large */
    STRATA_E_NULL = 3,       /* a null pointer */
    STRATA_E_GUARD = 4,      /* a wide kernel's guard failed: ld or pointer alignment */
    STRATA_E_ARG = 5,        /* unknown output dtype or kernel kind */
    STRATA_E_CUDA = 6,       /* a CUDA call failed; see strata_last_cuda_error */
    STRATA_E_COUNT = 7       /* strata_dequant_many: count < 1 or > STRATA_DEQUANT_MANY_MAX */
};

enum strata_limits {
    STRATA_DEQUANT_MANY_MAX = 16,  /* tensors per strata_dequant_many call */
    STRATA_TIMED_MAX_REPS = 64     /* launches per strata_dequant_timed call */
};

/* One tensor of a strata_dequant_many call: the arguments of strata_dequant. */
typedef struct strata_dequant_item {
    const void *blocks;   /* row 0 of the tensor (device memory) */
    long long row0;
    long long rows;
    long long cols;
    long long ld;         /* output row stride, elements */
    void *out;            /* output row 0 (device memory) */
} strata_dequant_item;

int strata_abi_version(void);

/* 1 if `kernel` exists for (ggml type id, output dtype), else 0. */
int strata_dequant_has_kernel(int type, int kernel, int out_dtype);

/* Block bytes and values per block of a type with a generic kernel; 0 if none. */
int strata_block_bytes(int type);
int strata_block_values(int type);

/* Byte alignment the wide kernel of `type` needs of the blocks pointer; 0 if none. */
int strata_wide_blocks_align(int type);

/* Dequantize rows [row0, row0 + rows) of a tensor whose row 0 starts at
 * `blocks` (device memory): value c of output row r goes to out[r*ld + c]
 * for c < cols; elements [cols, ld) are never written. Asynchronous on
 * `stream` (a cudaStream_t; null is the legacy default stream). The kernel
 * kind is taken as given (no fallback): the policy lives in the caller. */
int strata_dequant(int type, const void *blocks, long long row0, long long rows,
                   long long cols, long long ld, int out_dtype, void *out,
                   int kernel, void *stream);

/* Dequantize `count` tensors of one type with the WIDE kernel in one launch
 * (more only when a tensor needs several row batches, i.e. more than 2^30
 * chunks of 8 values or 4 GiB of blocks): item i behaves exactly as
 * strata_dequant(type, items[i].blocks, items[i].row0, items[i].rows,
 * items[i].cols, items[i].ld, out_dtype, items[i].out, STRATA_KERNEL_WIDE,
 * stream), bit for bit (the same device code). Every item is checked
 * first, with the single call's shape rules and wide guards; if one fails,
 * nothing is launched, the status says why and *bad_item (when bad_item is
 * not null) names the item (-1 when the failure is not an item's). Outputs
 * must not overlap. 1 <= count <= STRATA_DEQUANT_MANY_MAX, else
 * STRATA_E_COUNT; a type or dtype without a wide kernel is STRATA_E_TYPE. */
int strata_dequant_many(int type, const strata_dequant_item *items, int count,
                        int out_dtype, int *bad_item, void *stream);

/* Elementwise conversions of n float32 values (device memory):
 * bf16 by ggml's bit rule (NaN -> (u >> 16) | 0x40, else RNE on bit 16),
 * f16 by __float2half_rn with every NaN -> 0x7FFF. */
int strata_f32_to_bf16(const void *in, void *out, long long n, void *stream);
int strata_f32_to_f16(const void *in, void *out, long long n, void *stream);

/* The cudaError_t of the last STRATA_E_CUDA status of this thread, and its text. */
int strata_last_cuda_error(void);
const char *strata_cuda_error_string(int err);

/* Minimal runtime helpers, so that the host convenience and the parity tool
 * need no other CUDA binding. Each returns a strata_status. */
int strata_device_count(int *count);
int strata_device_cc(int device, int *major, int *minor);
int strata_set_device(int device);
int strata_malloc(void **ptr, long long nbytes);
int strata_free(void *ptr);
int strata_memcpy_htod(void *dst, const void *src, long long nbytes);
int strata_memcpy_dtoh(void *dst, const void *src, long long nbytes);
int strata_memset(void *ptr, int value, long long nbytes);
int strata_synchronize(void);

/* Timing and stream-ordered copies for strata-ref's device hashing
 * (strata_ref/native/hash_device.py): CUDA events with default flags (so
 * they record time), an asynchronous device-to-device copy and memset, the
 * free and total device memory, the device's name and L2 size. Each returns
 * a strata_status. strata_event_elapsed_ms waits for `stop` first. */
int strata_event_create(void **event);
int strata_event_destroy(void *event);
int strata_event_record(void *event, void *stream);
int strata_event_elapsed_ms(float *ms, void *start, void *stop);
int strata_memcpy_dtod_async(void *dst, const void *src, long long nbytes, void *stream);
int strata_memset_async(void *ptr, int value, long long nbytes, void *stream);
int strata_mem_get_info(long long *free_bytes, long long *total_bytes);
int strata_device_name(int device, char *name, int len);
int strata_l2_cache_bytes(int device, int *bytes);

/* Time `reps` (1..STRATA_TIMED_MAX_REPS) launches of strata_dequant with the
 * same arguments, each bracketed by CUDA events on `stream` and, when
 * flush_bytes >= 16, preceded by a kernel that reads `flush_bytes` of
 * `flush` (16-byte aligned), which evicts the L2 cache and leaves it clean.
 * Everything is enqueued by this one call, so no host work falls between an
 * event and the launch it brackets; ms[i] receives launch i's milliseconds
 * once the last event completes. The type, dtype, kernel and shape are
 * checked first, with strata_dequant's statuses, before anything is
 * launched; reps out of range is STRATA_E_COUNT, a bad flush buffer
 * STRATA_E_ARG. */
int strata_dequant_timed(int type, const void *blocks, long long row0, long long rows,
                         long long cols, long long ld, int out_dtype, void *out, int kernel,
                         const void *flush, long long flush_bytes, int reps, float *ms,
                         void *stream);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#define STRATA_ABI_VERSION 3   /* 2: strata_dequant_many; 3: events, async copy, device info, strata_dequant_timed */

#endif /* STRATA_DEQUANT_H */

/* ggml_ops: ggml-cpu's own mat-mul and activation quantizers, for reference
 * data of the ARM builds (tools/arm_ref.py runs it under qemu). The same
 * calls as tools/ggml_mm.py and `tools/llama_ref.py actquant` make through
 * ctypes on the x86 builds.
 *
 *   ggml_ops mm TYPE ROWS COLS N W_FILE X_FILE OUT_FILE [THREADS]
 *       y = ggml_mul_mat(W, x) through a ggml graph on the plain CPU buffer
 *       (ggml_init with the data in the context, ggml_graph_compute_with_ctx,
 *       THREADS threads, default 2): W the raw blocks of a ROWS x COLS
 *       tensor of ggml type id TYPE, x float32 (N, COLS); OUT float32 (N, ROWS).
 *   ggml_ops quant TYPE N X_FILE OUT_FILE
 *       ggml_get_type_traits_cpu(TYPE)->from_float over N float32 values.
 *   ggml_ops unary OP N X_FILE OUT_FILE
 *       y = ggml_tanh(x) (OP tanh: libm tanhf per value) or ggml_gelu(x)
 *       (OP gelu: ggml's fp16 GELU table) through a ggml graph, one
 *       thread, over N float32 values; OUT float32 (N).
 *   ggml_ops info
 *       llama's system info line is not linked here: ggml-cpu's features and
 *       the SVE vector length in bytes.
 *
 * Exit status 2 with one line on stderr on bad input.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

static void die(const char *what) {
    fprintf(stderr, "ggml_ops: error: %s\n", what);
    exit(2);
}

static void *read_all(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open an input file");
    void *buf = malloc(want ? want : 1);
    if (!buf) die("out of memory");
    if (fread(buf, 1, want, f) != want || fgetc(f) != EOF) die("input file has the wrong size");
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) die("cannot write the output file");
}

static long num(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end) die("not a number");
    return v;
}

static int cmd_mm(int argc, char **argv) {
    if (argc < 9) die("usage: ggml_ops mm TYPE ROWS COLS N W_FILE X_FILE OUT_FILE [THREADS]");
    int type = (int)num(argv[2]);
    long rows = num(argv[3]), cols = num(argv[4]), n = num(argv[5]);
    int threads = argc > 9 ? (int)num(argv[9]) : 2;
    if (type < 0 || type >= GGML_TYPE_COUNT || rows <= 0 || cols <= 0 || n <= 0) die("bad shape or type");
    size_t wbytes = ggml_row_size((enum ggml_type)type, cols) * (size_t)rows;
    size_t xbytes = (size_t)n * (size_t)cols * sizeof(float);
    void *w = read_all(argv[6], wbytes);
    void *x = read_all(argv[7], xbytes);
    struct ggml_init_params ip = {wbytes + xbytes + 4 * (size_t)n * (size_t)rows + (64u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, (enum ggml_type)type, cols, rows);
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, n);
    memcpy(a->data, w, wbytes);
    memcpy(b->data, x, xbytes);
    struct ggml_tensor *y = ggml_mul_mat(ctx, a, b);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) die("graph compute failed");
    write_all(argv[8], y->data, 4 * (size_t)n * (size_t)rows);
    ggml_free(ctx);
    return 0;
}

static int cmd_quant(int argc, char **argv) {
    if (argc < 6) die("usage: ggml_ops quant TYPE N X_FILE OUT_FILE");
    int type = (int)num(argv[2]);
    long n = num(argv[3]);
    if (type < 0 || type >= GGML_TYPE_COUNT || n <= 0) die("bad type or length");
    long bs = ggml_blck_size((enum ggml_type)type);
    if (n % bs) die("length is not a whole number of blocks");
    const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu((enum ggml_type)type);
    if (!tr->from_float) die("type has no from_float");
    float *x = read_all(argv[4], (size_t)n * sizeof(float));
    size_t ob = ggml_row_size((enum ggml_type)type, n);
    void *out = calloc(1, ob);
    tr->from_float(x, out, n);
    write_all(argv[5], out, ob);
    return 0;
}

static int cmd_unary(int argc, char **argv) {
    if (argc < 6) die("usage: ggml_ops unary tanh|gelu N X_FILE OUT_FILE");
    int tanh_op = !strcmp(argv[2], "tanh");
    if (!tanh_op && strcmp(argv[2], "gelu")) die("unary op must be tanh or gelu");
    long n = num(argv[3]);
    if (n <= 0) die("bad length");
    float *x = read_all(argv[4], (size_t)n * sizeof(float));
    struct ggml_init_params ip = {8 * (size_t)n + (16u << 20), NULL, false};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    memcpy(a->data, x, (size_t)n * sizeof(float));
    struct ggml_tensor *y = tanh_op ? ggml_tanh(ctx, a) : ggml_gelu(ctx, a);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    if (ggml_graph_compute_with_ctx(ctx, gf, 1) != GGML_STATUS_SUCCESS) die("graph compute failed");
    write_all(argv[5], y->data, (size_t)n * sizeof(float));
    ggml_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    ggml_cpu_init();
    if (argc >= 2 && !strcmp(argv[1], "mm")) return cmd_mm(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "quant")) return cmd_quant(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "unary")) return cmd_unary(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "info")) {
        printf("neon %d arm_fma %d fp16_va %d dotprod %d matmul_int8 %d sve %d sve_bytes %d sme %d llamafile %d\n",
               ggml_cpu_has_neon(), ggml_cpu_has_arm_fma(), ggml_cpu_has_fp16_va(), ggml_cpu_has_dotprod(),
               ggml_cpu_has_matmul_int8(), ggml_cpu_has_sve(), ggml_cpu_has_sve() ? ggml_cpu_get_sve_cnt() : 0,
               ggml_cpu_has_sme(), ggml_cpu_has_llamafile());
        return 0;
    }
    die("usage: ggml_ops mm|quant|unary|info ...");
    return 2;
}

/* llama_logits: the raw float32 logits llama.cpp computes for one GGUF model
 * and one token plan, written to a file (tools/arm_ref.py builds this against
 * the static llama.cpp of each ARM variant and runs it under qemu).
 *
 *   llama_logits [options] MODEL OUT STEP...
 *
 * Options (the settings of tools/llama_ref.py, which drives llama-cpp-python
 * 0.3.36's `Llama`): --n-ctx N (512), --n-batch N (512; n_ubatch the same),
 * --threads N (2, also for batches), --type-k T / --type-v T (a ggml type
 * id, default F16), --flash-attn 0|1 (0).
 *
 * Steps, run in order against one context (a running id list P starts empty):
 *   tok:FILE[:MAX]  append the ids of FILE's text (llama_tokenize with BOS as
 *                   the model adds it, no special parsing), the first MAX
 *   ids:A,B,...     append these ids
 *   eval:I:J        evaluate P[I:J] (J empty: to the end) as `Llama.eval`
 *                   does: drop the memory from the current position on, then
 *                   llama_decode in chunks of n_batch ids, every id output
 *   gen:N           N greedy steps: append the first argmax of the last
 *                   output row and evaluate it as one call
 *   reset           `Llama.reset`: the position goes back to 0; recurrent and
 *                   hybrid models also clear their memory
 *
 * OUT: "ARMLOG01", int32 n_vocab, int32 n_rows, int32 n_ids, the n_ids
 * int32 ids of P, then n_rows x n_vocab float32 (every output row, in the
 * order computed), little-endian. stdout gets llama_print_system_info() and
 * the SVE vector length in bytes (0 without SVE); llama.cpp's log goes to
 * stderr.
 *
 * --dump FILE [--dump-layer L,...]: a graph-evaluation callback (cb_eval) as
 * tools/llama_dump.py installs it (every node evaluated one by one) writes
 * each F32 / F16 node with data to FILE: int32 call (the llama_decode call,
 * from 0), int32 index (the node's number among the F32 / F16 nodes of the
 * call), int32 op, int32 type, int64 ne[4], char name[64], then its values
 * as float32 in (ne3, ne2, ne1, ne0) order, strides followed. With
 * --dump-layer L[,L...] only those layers' nodes are written (name ending in
 * "-L" before any " (", or holding "_lL "); the index still counts every
 * node.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "ggml-cpu.h"

static void die(const char *what) {
    fprintf(stderr, "llama_logits: error: %s\n", what);
    exit(2);
}

typedef struct {
    int32_t *v;
    size_t n, cap;
} ivec;

static void ipush(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 256;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        if (!a->v) die("out of memory");
    }
    a->v[a->n++] = x;
}

typedef struct {
    float *v;
    size_t rows, cap, width;
} rows_t;

static void push_rows(rows_t *r, const float *src, size_t n) {
    if (r->rows + n > r->cap) {
        while (r->rows + n > r->cap) r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, r->cap * r->width * sizeof(float));
        if (!r->v) die("out of memory");
    }
    memcpy(r->v + r->rows * r->width, src, n * r->width * sizeof(float));
    r->rows += n;
}

static FILE *dump_file;
static int dump_layers[16], n_dump_layers, dump_call, dump_index;

static int layer_wanted(const char *name, int layer) {
    char tag[32];
    snprintf(tag, sizeof tag, "_l%d ", layer);
    if (strstr(name, tag)) return 1;
    size_t n = strcspn(name, " ");         /* "Qcur-3 (view) (permuted)" -> "Qcur-3" */
    const char *dash = NULL;
    for (size_t i = 0; i < n; i++) if (name[i] == '-') dash = name + i;
    if (!dash) return 0;
    char *end;
    long v = strtol(dash + 1, &end, 10);
    return end == name + n && end != dash + 1 && v == layer;
}

static int dump_wanted(const char *name) {
    if (!n_dump_layers) return 1;
    for (int k = 0; k < n_dump_layers; k++)
        if (layer_wanted(name, dump_layers[k])) return 1;
    return 0;
}

static float elem(const struct ggml_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const char *p = (const char *)t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
    if (t->type == GGML_TYPE_F32) { float f; memcpy(&f, p, 4); return f; }
    ggml_fp16_t h; memcpy(&h, p, 2);
    return ggml_fp16_to_fp32(h);
}

/* tools/llama_dump.py `dump`'s callback: every node asked for, F32 / F16
 * nodes with data read after they are computed */
static bool dump_cb(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    if (ask) return true;
    if ((t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) || !t->data) return true;
    int index = dump_index++;
    if (!dump_wanted(t->name)) return true;
    int32_t head[4] = {dump_call, index, (int32_t)t->op, (int32_t)t->type};
    char name[64] = {0};
    memcpy(name, t->name, sizeof name - 1);
    fwrite(head, sizeof head, 1, dump_file);
    fwrite(t->ne, sizeof(int64_t), 4, dump_file);
    fwrite(name, 1, sizeof name, dump_file);
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    float f = elem(t, i0, i1, i2, i3);
                    fwrite(&f, 4, 1, dump_file);
                }
    return true;
}

static struct llama_context *ctx;
static struct llama_model *model;
static llama_pos n_past;
static rows_t out_rows;

/* Llama.eval of llama-cpp-python 0.3.36 (llama.py): memory from n_past on is
 * dropped, then chunks of n_batch with every logit requested. */
static void eval_ids(const int32_t *ids, size_t n, int n_batch) {
    llama_memory_seq_rm(llama_get_memory(ctx), -1, n_past, -1);
    struct llama_batch b = llama_batch_init(n_batch, 0, 1);
    for (size_t i = 0; i < n; i += n_batch) {
        size_t m = n - i < (size_t)n_batch ? n - i : (size_t)n_batch;
        b.n_tokens = (int32_t)m;
        for (size_t k = 0; k < m; k++) {
            b.token[k] = ids[i + k];
            b.pos[k] = n_past + (llama_pos)k;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = 0;
            b.logits[k] = 1;
        }
        dump_index = 0;
        int rc = llama_decode(ctx, b);
        dump_call++;
        if (rc != 0) {
            fprintf(stderr, "llama_logits: error: llama_decode returned %d\n", rc);
            exit(1);
        }
        push_rows(&out_rows, llama_get_logits(ctx), m);
        n_past += (llama_pos)m;
    }
    llama_batch_free(b);
}

static int32_t last_argmax(void) {
    if (!out_rows.rows) die("gen: no output row yet");
    const float *r = out_rows.v + (out_rows.rows - 1) * out_rows.width;
    size_t best = 0;
    for (size_t i = 1; i < out_rows.width; i++)
        if (r[i] > r[best]) best = i;   /* numpy argmax: the first maximum */
    return (int32_t)best;
}

static void append_file_tokens(ivec *p, const char *spec) {
    char path[4096];
    long max = -1;
    const char *colon = strrchr(spec, ':');
    size_t len = strlen(spec);
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end == 0 && end != colon + 1) { max = v; len = (size_t)(colon - spec); }
    }
    if (len >= sizeof path) die("tok: path too long");
    memcpy(path, spec, len);
    path[len] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) die("tok: cannot open the text file");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    if (size < 0 || size > (64 << 20)) die("tok: text file too large");
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) die("tok: cannot read");
    fclose(f);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int32_t cap = (int32_t)size + 16;
    int32_t *tok = malloc((size_t)cap * sizeof *tok);
    int32_t n = llama_tokenize(vocab, text, (int32_t)size, tok, cap, true, false);
    if (n < 0) die("tok: llama_tokenize failed");
    if (max >= 0 && n > max) n = (int32_t)max;
    for (int32_t i = 0; i < n; i++) ipush(p, tok[i]);
    free(tok);
    free(text);
}

static void write_out(const char *path, const ivec *p) {
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot create the output file");
    int32_t head[3] = {(int32_t)out_rows.width, (int32_t)out_rows.rows, (int32_t)p->n};
    fwrite("ARMLOG01", 1, 8, f);
    fwrite(head, sizeof head, 1, f);
    fwrite(p->v, sizeof(int32_t), p->n, f);
    fwrite(out_rows.v, sizeof(float) * out_rows.width, out_rows.rows, f);
    if (fclose(f) != 0) die("cannot write the output file");
}

int main(int argc, char **argv) {
    int n_ctx = 512, n_batch = 512, threads = 2, type_k = GGML_TYPE_F16, type_v = GGML_TYPE_F16;
    int flash = 0;
    const char *dump_path = NULL;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (i + 1 >= argc) die("option without a value");
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--dump")) { dump_path = argv[i + 1]; continue; }
        if (!strcmp(argv[i], "--dump-layer")) {
            for (const char *c = argv[i + 1]; *c && n_dump_layers < 16;) {
                char *end;
                dump_layers[n_dump_layers++] = (int)strtol(c, &end, 10);
                if (end == c) die("--dump-layer: not a number");
                c = *end == ',' ? end + 1 : end;
            }
            continue;
        }
        if (!strcmp(argv[i], "--n-ctx")) n_ctx = v;
        else if (!strcmp(argv[i], "--n-batch")) n_batch = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--type-k")) type_k = v;
        else if (!strcmp(argv[i], "--type-v")) type_v = v;
        else if (!strcmp(argv[i], "--flash-attn")) flash = v;
        else die("unknown option");
    }
    if (argc - i < 3) die("usage: llama_logits [options] MODEL OUT STEP...");
    const char *model_path = argv[i], *out_path = argv[i + 1];

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load the model");
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = (uint32_t)n_batch;
    cp.n_ubatch = (uint32_t)n_batch;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = (enum ggml_type)type_k;
    cp.type_v = (enum ggml_type)type_v;
    if (dump_path) {
        dump_file = fopen(dump_path, "wb");
        if (!dump_file) die("cannot create the dump file");
        cp.cb_eval = dump_cb;
        cp.cb_eval_user_data = NULL;
    }
    ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create the context");
    out_rows.width = (size_t)llama_vocab_n_tokens(llama_model_get_vocab(model));

    printf("system_info: %s\n", llama_print_system_info());
    printf("sve_bytes: %d\n", ggml_cpu_has_sve() ? ggml_cpu_get_sve_cnt() : 0);
    fflush(stdout);

    ivec p = {0};
    for (int k = i + 2; k < argc; k++) {
        const char *s = argv[k];
        if (!strncmp(s, "tok:", 4)) {
            append_file_tokens(&p, s + 4);
        } else if (!strncmp(s, "ids:", 4)) {
            for (const char *c = s + 4; *c;) {
                char *end;
                long v = strtol(c, &end, 10);
                if (end == c) die("ids: not a number");
                ipush(&p, (int32_t)v);
                c = *end == ',' ? end + 1 : end;
            }
        } else if (!strncmp(s, "eval:", 5)) {
            char *end;
            long a = strtol(s + 5, &end, 10), b = (long)p.n;
            if (*end != ':') die("eval: wants eval:I:J");
            if (end[1]) b = strtol(end + 1, NULL, 10);
            if (a < 0 || b > (long)p.n || a >= b) die("eval: range outside the ids");
            eval_ids(p.v + a, (size_t)(b - a), n_batch);
        } else if (!strncmp(s, "gen:", 4)) {
            long n = strtol(s + 4, NULL, 10);
            for (long g = 0; g < n; g++) {
                int32_t t = last_argmax();
                ipush(&p, t);
                eval_ids(&t, 1, n_batch);
            }
        } else if (!strcmp(s, "reset")) {
            n_past = 0;
            if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model))
                llama_memory_clear(llama_get_memory(ctx), true);
        } else {
            die("unknown step");
        }
    }
    write_out(out_path, &p);
    if (dump_file && fclose(dump_file) != 0) die("cannot write the dump file");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

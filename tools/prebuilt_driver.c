/* Reference logits from a prebuilt llama.cpp (a GGML_BACKEND_DL build whose
 * CPU backend is one of several libggml-cpu-<variant>.so), through its own
 * libllama. Built and run by tools/prebuilt_ref.py; see its docstring.
 *
 *   prebuilt_driver BACKEND_DIR MODEL OUTDIR N_GEN FA[,FA...] (--text TEXT | --ids I,J,...)
 *
 * BACKEND_DIR is handed to ggml_backend_load_all_from_path before anything
 * else touches the registry, so the CPU backend comes from that folder only
 * (ggml-backend-reg.cpp, ggml_backend_load_best: the libggml-cpu-*.so with
 * the highest ggml_backend_score; a folder holding one variant forces it).
 * For each flash-attention mode FA (on, off, auto) a fresh context (n_ctx
 * 512, n_batch 512, n_ubatch 512, 2 threads, F16 K and V; the other fields
 * llama_context_default_params) computes, with a logit requested at every
 * position:
 *   incremental: the prompt ids in one llama_decode, then N_GEN greedy ids
 *                (argmax of the last row, lowest id on ties), one per call;
 *   batched:     after llama_memory_clear, prompt + greedy ids in one call.
 * Written under OUTDIR/<FA>/: prompt.i32, greedy.i32, incr.f32, batched.f32
 * (rows x n_vocab, little-endian), and OUTDIR/meta.txt (key=value lines:
 * n_vocab, the loaded CPU library, llama_print_system_info, the CPU
 * backend's features) and OUTDIR/log.txt (llama.cpp's log: the buffer types
 * the weights went to, how flash_attn auto resolved).
 * Exit status: 0 ok, 2 usage, 3 no CPU backend loaded (this CPU cannot
 * execute the variant), 4 model/context/decode failure. */
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ggml-backend.h"
#include "llama.h"

static FILE *g_log;
/* one persistent CPU threadpool without polling (ggml_graph_compute would
 * otherwise start a polling pool for every graph: same arithmetic, but
 * spinning threads waste a shared machine's cores) */
static ggml_threadpool_t g_pool;

static void log_cb(enum ggml_log_level level, const char *text, void *ud) {
    (void)level; (void)ud;
    if (g_log) { fputs(text, g_log); fflush(g_log); }
}

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    const char *name = info->dlpi_name;
    if (name && strstr(name, "libggml-cpu")) fprintf((FILE *)data, "cpu_library=%s\n", name);
    return 0;
}

static int die(int code, const char *msg, const char *arg) {
    fprintf(stderr, "prebuilt_driver: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    return code;
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) return -1;
    return 0;
}

/* Decode ids[0..n) at positions pos0.. with a logit at every position;
 * copy the rows to out (n x n_vocab). */
static int decode_rows(struct llama_context *ctx, const llama_token *ids, int n, int pos0,
                       float *out, int n_vocab) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) return rc;
    for (int i = 0; i < n; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        if (!row) return -100;
        memcpy(out + (size_t)i * n_vocab, row, sizeof(float) * n_vocab);
    }
    return 0;
}

static int argmax(const float *row, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static int run_mode(struct llama_model *model, const char *fa, const llama_token *prompt,
                    int n_prompt, int n_gen, const char *outdir, int n_vocab) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    cp.flash_attn_type = !strcmp(fa, "on") ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : !strcmp(fa, "off") ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                       : LLAMA_FLASH_ATTN_TYPE_AUTO;
    if (g_log) fprintf(g_log, "### prebuilt_driver: context flash_attn=%s\n", fa);
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return die(4, "llama_init_from_model failed", fa);
    if (g_pool) llama_attach_threadpool(ctx, g_pool, g_pool);

    int n_all = n_prompt + n_gen;
    llama_token *ids = malloc(sizeof(llama_token) * n_all);
    float *incr = malloc(sizeof(float) * (size_t)n_all * n_vocab);
    float *batched = malloc(sizeof(float) * (size_t)n_all * n_vocab);
    if (!ids || !incr || !batched) return die(4, "out of memory", NULL);
    memcpy(ids, prompt, sizeof(llama_token) * n_prompt);
    if (decode_rows(ctx, ids, n_prompt, 0, incr, n_vocab)) return die(4, "prompt decode failed", fa);
    for (int i = 0; i < n_gen; i++) {
        int p = n_prompt + i;
        ids[p] = argmax(incr + (size_t)(p - 1) * n_vocab, n_vocab);
        if (decode_rows(ctx, ids + p, 1, p, incr + (size_t)p * n_vocab, n_vocab))
            return die(4, "incremental decode failed", fa);
    }
    llama_memory_clear(llama_get_memory(ctx), true);
    if (decode_rows(ctx, ids, n_all, 0, batched, n_vocab)) return die(4, "batched decode failed", fa);

    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", outdir, fa);
    mkdir(dir, 0755);
    if (write_file(dir, "prompt.i32", ids, sizeof(llama_token) * n_prompt) ||
        write_file(dir, "greedy.i32", ids + n_prompt, sizeof(llama_token) * n_gen) ||
        write_file(dir, "incr.f32", incr, sizeof(float) * (size_t)n_all * n_vocab) ||
        write_file(dir, "batched.f32", batched, sizeof(float) * (size_t)n_all * n_vocab))
        return die(4, "cannot write to", dir);
    free(ids); free(incr); free(batched);
    llama_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 8 || (strcmp(argv[6], "--text") && strcmp(argv[6], "--ids")))
        return die(2, "usage: prebuilt_driver BACKEND_DIR MODEL OUTDIR N_GEN FA[,FA...] "
                      "(--text TEXT | --ids I,J,...)", NULL);
    const char *backend_dir = argv[1], *model_path = argv[2], *outdir = argv[3];
    int n_gen = atoi(argv[4]);
    if (n_gen < 0 || n_gen > 400) return die(2, "N_GEN must be in 0..400", argv[4]);
    mkdir(outdir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/log.txt", outdir);
    g_log = fopen(path, "w");
    llama_log_set(log_cb, NULL);

    ggml_backend_load_all_from_path(backend_dir);
    llama_backend_init();
    ggml_backend_reg_t cpu = ggml_backend_reg_by_name("CPU");
    if (!cpu) return die(3, "no CPU backend loaded from", backend_dir);

    snprintf(path, sizeof path, "%s/meta.txt", outdir);
    FILE *meta = fopen(path, "w");
    if (!meta) return die(4, "cannot write", path);
    dl_iterate_phdr(phdr_cb, meta);
    fprintf(meta, "llama_version=%s\n", llama_version());
    fprintf(meta, "system_info=%s\n", llama_print_system_info());
    ggml_backend_get_features_t get_features =
        (ggml_backend_get_features_t)ggml_backend_reg_get_proc_address(cpu, "ggml_backend_get_features");
    if (get_features)
        for (struct ggml_backend_feature *f = get_features(cpu); f && f->name; f++)
            fprintf(meta, "feature.%s=%s\n", f->name, f->value);
    typedef ggml_threadpool_t (*tp_new_t)(struct ggml_threadpool_params *);
    tp_new_t tp_new = (tp_new_t)ggml_backend_reg_get_proc_address(cpu, "ggml_threadpool_new");
    if (tp_new) {
        struct ggml_threadpool_params tpp = ggml_threadpool_params_default(2);
        tpp.poll = 0;
        g_pool = tp_new(&tpp);
    }
    fprintf(meta, "threadpool=%s\n", g_pool ? "persistent, 2 threads, poll 0" : "per graph");

    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) return die(4, "cannot load model", model_path);
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    fprintf(meta, "n_vocab=%d\n", n_vocab);
    fclose(meta);

    llama_token prompt[512];
    int n_prompt = 0;
    if (!strcmp(argv[6], "--text")) {
        n_prompt = llama_tokenize(vocab, argv[7], (int32_t)strlen(argv[7]), prompt, 512, true, false);
        if (n_prompt < 0) return die(2, "prompt longer than 512 tokens", NULL);
    } else {
        for (char *s = argv[7]; *s && n_prompt < 512;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || v < 0 || v >= n_vocab) return die(2, "bad id list", argv[7]);
            prompt[n_prompt++] = (llama_token)v;
            s = *end == ',' ? end + 1 : end;
        }
    }
    if (n_prompt < 1 || n_prompt + n_gen > 512) return die(2, "prompt + N_GEN must be 1..512 ids", NULL);

    char modes[256];
    snprintf(modes, sizeof modes, "%s", argv[5]);
    for (char *fa = strtok(modes, ","); fa; fa = strtok(NULL, ",")) {
        if (strcmp(fa, "on") && strcmp(fa, "off") && strcmp(fa, "auto"))
            return die(2, "FA must be on, off or auto", fa);
        int rc = run_mode(model, fa, prompt, n_prompt, n_gen, outdir, n_vocab);
        if (rc) return rc;
    }
    llama_model_free(model);
    llama_backend_free();
    if (g_log) fclose(g_log);
    return 0;
}

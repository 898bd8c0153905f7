/* llama_trace: the C driver of strata-ref's trace container (docs/trace.md).
 *
 * Runs token ids through a llama.cpp build with a graph-evaluation callback
 * (cb_eval) and writes every node it computes into a trace container: a zip
 * of .npy files that `strata-ref diff` compares with `strata-ref trace`'s
 * output (or with another build's). Build it against the build you want to
 * check, with that build's headers (tools/llama_trace_build.py does it):
 *
 *   cc -O2 -o llama_trace tools/llama_trace.c -I LLAMA/include -I LLAMA/ggml/include \
 *      LIB/libllama.so LIB/libggml.so LIB/libggml-base.so -Wl,-rpath,LIB
 *
 *   llama_trace MODEL.gguf OUT.npz (--tokens 1,2,3 | --prompt TEXT) [--split N]
 *       [--threads N] [--flash-attn on|off] [--cache-type-k T] [--cache-type-v T]
 *       [--tensors PAT1,PAT2] [--all] [--backend-dir DIR]
 *
 * The run: n_ctx 512 (or the next multiple of 256 that holds the ids),
 * n_batch n_ctx, n_ubatch 512, 2 threads, every logit row requested, flash
 * attention off and an F16 KV cache unless told otherwise: the settings of
 * tools/llama_dump.py --trace (the Python driver), which writes the same
 * container. --split N evaluates the first N ids in one call and then one
 * id per call. --backend-dir loads the ggml backends of a build that keeps
 * them in separate libraries (GGML_BACKEND_DL; a folder holding one
 * libggml-cpu-<variant>.so forces that variant).
 *
 * What is written (docs/trace.md): every node except views and the copies
 * into the KV cache or the recurrent state (--all keeps them), of type F32
 * (float32), F16 (float16) or I32 (int32), as `t:SEQ:CALL:OP:NAME.npy`
 * with OP from ggml_op_desc and NAME llama.cpp's; a node ggml left
 * unnamed is named OP(src0,src1,...) after its sources (views' suffixes
 * dropped, a source without a name of its own as `_`). Exit 0 on success,
 * 2 with one line on stderr otherwise.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

/* ------------------------------------------------------------------ errors */
static char * part_path;      /* the file being written, removed on an error */

static void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("llama_trace: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (part_path) remove(part_path);
    exit(2);
}

/* llama.cpp's log: errors only, as one line each */
static void quiet_log(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void * xmalloc(size_t n) {
    void * p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static char * xstrdup(const char * s) {
    size_t n = strlen(s) + 1;
    char * p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

/* ------------------------------------------------------------------ growable buffer */
typedef struct { unsigned char * p; size_t n, cap; } buf_t;

static void buf_put(buf_t * b, const void * d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char * p = realloc(b->p, cap);
        if (!p) die("out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void buf_u16(buf_t * b, uint16_t v) { unsigned char c[2] = {v & 255, v >> 8}; buf_put(b, c, 2); }
static void buf_u32(buf_t * b, uint32_t v) { for (int i = 0; i < 4; i++) { unsigned char c = (v >> (8 * i)) & 255; buf_put(b, &c, 1); } }
static void buf_u64(buf_t * b, uint64_t v) { for (int i = 0; i < 8; i++) { unsigned char c = (v >> (8 * i)) & 255; buf_put(b, &c, 1); } }
static void buf_str(buf_t * b, const char * s) { buf_put(b, s, strlen(s)); }

/* ------------------------------------------------------------------ zip (stored, zip64) */
static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const unsigned char * p, size_t n) {
    crc = ~crc;
    while (n--) crc = crc_table[(crc ^ *p++) & 255] ^ (crc >> 8);
    return ~crc;
}

typedef struct { char * name; uint32_t crc; uint64_t size, offset; } zentry_t;

typedef struct {
    FILE * f;
    uint64_t pos;
    zentry_t * e;
    size_t n, cap;
} zip_t;

static void zwrite(zip_t * z, const void * p, size_t n) {
    if (n && fwrite(p, 1, n, z->f) != n) die("cannot write the output (disk full?)");
    z->pos += n;
}

/* one member of `head` then `data` bytes, stored */
static void zip_add(zip_t * z, const char * name, const void * head, size_t nhead, const void * data, size_t ndata) {
    uint32_t crc = crc_update(0, head, nhead);
    crc = crc_update(crc, data, ndata);
    uint64_t size = (uint64_t) nhead + ndata;
    int big = size >= 0xFFFFFFFFu;
    buf_t h = {0};
    buf_u32(&h, 0x04034b50u);
    buf_u16(&h, big ? 45 : 20);
    buf_u16(&h, 0x0800);                          /* names are UTF-8 */
    buf_u16(&h, 0);                               /* stored */
    buf_u16(&h, 0); buf_u16(&h, (1 << 5) | 1);    /* 1980-01-01 00:00 */
    buf_u32(&h, crc);
    buf_u32(&h, big ? 0xFFFFFFFFu : (uint32_t) size);
    buf_u32(&h, big ? 0xFFFFFFFFu : (uint32_t) size);
    buf_u16(&h, (uint16_t) strlen(name));
    buf_u16(&h, big ? 20 : 0);
    buf_str(&h, name);
    if (big) { buf_u16(&h, 1); buf_u16(&h, 16); buf_u64(&h, size); buf_u64(&h, size); }
    if (z->n == z->cap) {
        z->cap = z->cap ? 2 * z->cap : 64;
        z->e = realloc(z->e, z->cap * sizeof(zentry_t));
        if (!z->e) die("out of memory");
    }
    z->e[z->n++] = (zentry_t) {xstrdup(name), crc, size, z->pos};
    zwrite(z, h.p, h.n);
    zwrite(z, head, nhead);
    zwrite(z, data, ndata);
    free(h.p);
}

/* the central directory with zip64 fields on every entry, then the zip64
   end record, its locator and the end record */
static void zip_close(zip_t * z) {
    uint64_t cd = z->pos;
    buf_t c = {0};
    for (size_t i = 0; i < z->n; i++) {
        zentry_t * e = &z->e[i];
        buf_u32(&c, 0x02014b50u);
        buf_u16(&c, 45); buf_u16(&c, 45);
        buf_u16(&c, 0x0800); buf_u16(&c, 0);
        buf_u16(&c, 0); buf_u16(&c, (1 << 5) | 1);
        buf_u32(&c, e->crc);
        buf_u32(&c, 0xFFFFFFFFu); buf_u32(&c, 0xFFFFFFFFu);
        buf_u16(&c, (uint16_t) strlen(e->name));
        buf_u16(&c, 28);
        buf_u16(&c, 0); buf_u16(&c, 0); buf_u16(&c, 0);
        buf_u32(&c, 0);
        buf_u32(&c, 0xFFFFFFFFu);
        buf_str(&c, e->name);
        buf_u16(&c, 1); buf_u16(&c, 24);
        buf_u64(&c, e->size); buf_u64(&c, e->size); buf_u64(&c, e->offset);
        free(e->name);
    }
    uint64_t cd_size = c.n;
    uint64_t z64 = cd + cd_size;
    buf_u32(&c, 0x06064b50u); buf_u64(&c, 44);
    buf_u16(&c, 45); buf_u16(&c, 45);
    buf_u32(&c, 0); buf_u32(&c, 0);
    buf_u64(&c, z->n); buf_u64(&c, z->n);
    buf_u64(&c, cd_size); buf_u64(&c, cd);
    buf_u32(&c, 0x07064b50u); buf_u32(&c, 0); buf_u64(&c, z64); buf_u32(&c, 1);
    buf_u32(&c, 0x06054b50u);
    buf_u16(&c, 0); buf_u16(&c, 0);
    buf_u16(&c, z->n > 0xFFFF ? 0xFFFF : (uint16_t) z->n);
    buf_u16(&c, z->n > 0xFFFF ? 0xFFFF : (uint16_t) z->n);
    buf_u32(&c, cd_size >= 0xFFFFFFFFu ? 0xFFFFFFFFu : (uint32_t) cd_size);
    buf_u32(&c, 0xFFFFFFFFu);
    buf_u16(&c, 0);
    zwrite(z, c.p, c.n);
    free(c.p);
    free(z->e);
    if (fclose(z->f) != 0) die("cannot write the output (disk full?)");
}

/* ------------------------------------------------------------------ .npy */
/* the header of an .npy file, version 1.0, padded to 64 bytes */
static void npy_header(buf_t * b, const char * descr, const int64_t * shape, int ndim) {
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim; i++) n += snprintf(dict + n, sizeof dict - n, "%lld%s", (long long) shape[i],
                                                 ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    n += snprintf(dict + n, sizeof dict - n, "), }");
    size_t total = 10 + (size_t) n + 1;
    size_t pad = (64 - total % 64) % 64;
    buf_put(b, "\x93NUMPY\x01\x00", 8);
    buf_u16(b, (uint16_t) (n + pad + 1));
    buf_put(b, dict, n);
    for (size_t i = 0; i < pad; i++) buf_put(b, " ", 1);
    buf_put(b, "\n", 1);
}

/* UTF-8 text as a NumPy str scalar ('<U<n>', UTF-32LE); an invalid byte
   becomes U+FFFD */
static void npy_put_str(zip_t * z, const char * key, const char * s) {
    buf_t d = {0};
    size_t nchar = 0;
    const unsigned char * p = (const unsigned char *) s;
    while (*p) {
        uint32_t cp = 0xFFFD;
        int len = 1;
        if (p[0] < 0x80) cp = p[0];
        else if ((p[0] & 0xE0) == 0xC0 && (p[1] & 0xC0) == 0x80) { cp = ((p[0] & 31u) << 6) | (p[1] & 63u); len = 2; }
        else if ((p[0] & 0xF0) == 0xE0 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80) {
            cp = ((p[0] & 15u) << 12) | ((p[1] & 63u) << 6) | (p[2] & 63u); len = 3;
        } else if ((p[0] & 0xF8) == 0xF0 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80) {
            cp = ((p[0] & 7u) << 18) | ((p[1] & 63u) << 12) | ((p[2] & 63u) << 6) | (p[3] & 63u); len = 4;
        }
        buf_u32(&d, cp);
        nchar++;
        p += len;
    }
    char descr[32];
    snprintf(descr, sizeof descr, "<U%zu", nchar ? nchar : 1);
    if (!nchar) buf_u32(&d, 0);
    buf_t h = {0};
    npy_header(&h, descr, NULL, 0);
    char name[256];
    snprintf(name, sizeof name, "%s.npy", key);
    zip_add(z, name, h.p, h.n, d.p, d.n);
    free(h.p);
    free(d.p);
}

static void npy_put(zip_t * z, const char * key, const char * descr, const int64_t * shape, int ndim,
                    const void * data, size_t nbytes) {
    buf_t h = {0};
    npy_header(&h, descr, shape, ndim);
    size_t klen = strlen(key) + 5;
    char * name = xmalloc(klen);
    snprintf(name, klen, "%s.npy", key);
    zip_add(z, name, h.p, h.n, data, nbytes);
    free(name);
    free(h.p);
}

static void npy_put_i64(zip_t * z, const char * key, int64_t v) { npy_put(z, key, "<i8", NULL, 0, &v, 8); }

/* ------------------------------------------------------------------ names */
typedef struct { const void * key; char * name; } nslot_t;
static nslot_t * names;
static size_t names_cap;

static size_t nhash(const void * p) { uint64_t x = (uint64_t) (uintptr_t) p; x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; return (size_t) x; }

static size_t names_used;

static void names_clear(void) {
    for (size_t i = 0; i < names_cap; i++) { free(names[i].name); names[i] = (nslot_t) {0}; }
    names_used = 0;
}

static nslot_t * names_slot(const void * key) {
    if (!names_cap) { names_cap = 1 << 16; names = calloc(names_cap, sizeof(nslot_t)); if (!names) die("out of memory"); }
    size_t i = nhash(key) & (names_cap - 1);
    while (names[i].key && names[i].key != key) i = (i + 1) & (names_cap - 1);
    return &names[i];
}

static void names_set(const void * key, const char * name) {
    if (names_used * 2 >= names_cap) {          /* grow */
        nslot_t * old = names; size_t oc = names_cap;
        names_cap *= 2; names = calloc(names_cap, sizeof(nslot_t)); if (!names) die("out of memory");
        for (size_t i = 0; i < oc; i++) if (old[i].key) *names_slot(old[i].key) = old[i];
        free(old);
    }
    nslot_t * s = names_slot(key);
    if (!s->key) names_used++;
    free(s->name);
    s->key = key;
    s->name = xstrdup(name);
}

static int is_auto_name(const char * s) {
    const char * d = NULL;
    if (!*s) return 1;
    if (!strncmp(s, "node_", 5)) d = s + 5; else if (!strncmp(s, "leaf_", 5)) d = s + 5; else return 0;
    if (!*d) return 0;
    for (; *d; d++) if (!isdigit((unsigned char) *d)) return 0;
    return 1;
}

/* `s` without ggml's view suffixes, into out */
static void strip_views(const char * s, buf_t * out) {
    static const char * suf[] = {" (view)", " (reshaped)", " (permuted)", " (transposed)"};
    size_t n = strlen(s);
    for (int again = 1; again;) {
        again = 0;
        for (int i = 0; i < 4; i++) {
            size_t k = strlen(suf[i]);
            if (n >= k && !memcmp(s + n - k, suf[i], k)) { n -= k; again = 1; }
        }
    }
    buf_put(out, s, n);
}

static const char * name_of(const struct ggml_tensor * t) {
    nslot_t * s = names_slot(t);
    return s->key ? s->name : ggml_get_name(t);
}

/* OP(src0,src1,...) of an unnamed node (strata_ref.tracefile.derived_name) */
static char * derived_name(const struct ggml_tensor * t, const char * op) {
    buf_t b = {0};
    buf_str(&b, op);
    buf_put(&b, "(", 1);
    int first = 1;
    for (int i = 0; i < GGML_MAX_SRC; i++) {
        if (!t->src[i]) continue;
        if (!first) buf_put(&b, ",", 1);
        first = 0;
        buf_t s = {0};
        strip_views(name_of(t->src[i]), &s);
        buf_put(&s, "", 1);
        if (is_auto_name((char *) s.p)) buf_put(&b, "_", 1); else buf_str(&b, (char *) s.p);
        free(s.p);
    }
    buf_put(&b, ")", 2);
    return (char *) b.p;
}

/* ------------------------------------------------------------------ the callback */
typedef struct {
    zip_t * z;
    int call;
    long seq;
    int all;
    char ** pats;
    int npats;
    int checked;
} state_t;

static const char * SKIPPED[] = {"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "SET_ROWS", "CPY"};

static int wanted(state_t * st, const char * name) {
    if (!st->npats) return 1;
    for (int i = 0; i < st->npats; i++) if (!fnmatch(st->pats[i], name, 0)) return 1;
    return 0;
}

/* the node's values, row-major with ggml's strides followed (contiguous
   copy of ne[0] * ... * ne[3] elements of esz bytes) */
static void * node_values(const struct ggml_tensor * t, size_t esz, size_t * nbytes) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    *nbytes = (size_t) n * esz;
    unsigned char * out = xmalloc(*nbytes);
    if (!n) return out;
    int host = t->buffer == NULL || ggml_backend_buffer_is_host(t->buffer);
    if (!host) {
        if (!ggml_is_contiguous(t)) { free(out); return NULL; }
        ggml_backend_tensor_get(t, out, 0, *nbytes);
        return out;
    }
    const unsigned char * base = t->data;
    size_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                const unsigned char * row = base + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                if (t->nb[0] == esz) { memcpy(out + k, row, (size_t) t->ne[0] * esz); k += (size_t) t->ne[0] * esz; }
                else for (int64_t i0 = 0; i0 < t->ne[0]; i0++, k += esz) memcpy(out + k, row + i0 * t->nb[0], esz);
            }
    return out;
}

static bool cb_eval(struct ggml_tensor * t, bool ask, void * ud) {
    state_t * st = ud;
    if (ask) return true;
    if (!st->checked) {
        /* the headers this was compiled with must lay out ggml_tensor as
           the library does */
        if (ggml_get_name(t) != t->name || ggml_nelements(t) != t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3])
            die("this llama.cpp build lays out struct ggml_tensor differently from the headers llama_trace "
                "was compiled with: rebuild it against that build's headers");
        st->checked = 1;
    }
    const char * op = ggml_op_desc(t);
    char * dname = NULL;
    const char * name = ggml_get_name(t);
    if (is_auto_name(name)) {
        dname = derived_name(t, op);
        names_set(t, dname);
        name = dname;
    } else {
        nslot_t * s = names_slot(t);
        if (s->key) { free(s->name); s->name = xstrdup(name); }
    }
    int skip = 0;
    if (!st->all) for (size_t i = 0; i < sizeof SKIPPED / sizeof *SKIPPED; i++) if (!strcmp(op, SKIPPED[i])) skip = 1;
    const char * descr = t->type == GGML_TYPE_F32 ? "<f4" : t->type == GGML_TYPE_F16 ? "<f2" : t->type == GGML_TYPE_I32 ? "<i4" : NULL;
    if (!skip && descr && wanted(st, name)) {
        size_t nbytes;
        void * data = node_values(t, ggml_type_size(t->type), &nbytes);
        if (!data) {
            fprintf(stderr, "llama_trace: warning: %s (%s) is neither host memory nor contiguous: left out\n", name, op);
        } else {
            int64_t shape[4];
            int nd = 4;
            for (int i = 0; i < 4; i++) shape[i] = t->ne[3 - i];
            int first = 0;
            while (nd - first > 1 && shape[first] == 1) first++;
            size_t klen = strlen(name) + strlen(op) + 64;
            char * key = xmalloc(klen);
            snprintf(key, klen, "t:%06ld:%d:%s:%s", st->seq, st->call, op, name);
            npy_put(st->z, key, descr, shape + first, nd - first, data, nbytes);
            st->seq++;
            free(key);
            free(data);
        }
    }
    free(dname);
    return true;
}

/* ------------------------------------------------------------------ options */
static enum ggml_type cache_type(const char * s) {
    static const struct { const char * n; enum ggml_type t; } T[] = {
        {"f32", GGML_TYPE_F32}, {"f16", GGML_TYPE_F16}, {"bf16", GGML_TYPE_BF16}, {"q8_0", GGML_TYPE_Q8_0},
        {"q4_0", GGML_TYPE_Q4_0}, {"q4_1", GGML_TYPE_Q4_1}, {"iq4_nl", GGML_TYPE_IQ4_NL},
        {"q5_0", GGML_TYPE_Q5_0}, {"q5_1", GGML_TYPE_Q5_1}};
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) if (!strcmp(s, T[i].n)) return T[i].t;
    die("cache type '%s' is not one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1", s);
    return GGML_TYPE_F16;
}

static long parse_long(const char * s, const char * what, long lo, long hi) {
    char * end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) die("%s: '%s' is not a whole number in %ld .. %ld", what, s, lo, hi);
    return v;
}

static void json_str(buf_t * b, const char * s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char) *s;
        if (c == '"' || c == '\\') { buf_put(b, "\\", 1); buf_put(b, s, 1); }
        else if (c < 0x20) { char e[8]; snprintf(e, sizeof e, "\\u%04x", c); buf_str(b, e); }
        else buf_put(b, s, 1);
    }
    buf_put(b, "\"", 1);
}

static void usage(void) {
    fputs("usage: llama_trace MODEL.gguf OUT.npz (--tokens 1,2,3 | --prompt TEXT) [--split N] [--threads N]\n"
          "                   [--flash-attn on|off] [--cache-type-k T] [--cache-type-v T]\n"
          "                   [--tensors PAT1,PAT2] [--all] [--backend-dir DIR]\n", stderr);
    exit(2);
}

int main(int argc, char ** argv) {
    const char *model_path = NULL, *out_path = NULL, *tokens_arg = NULL, *prompt = NULL, *tensors = NULL;
    const char *backend_dir = NULL, *ctk = "f16", *ctv = "f16";
    long split = -1, threads = 2;
    int fa = 0, all = 0;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL() do { if (!v) die("%s needs a value", a); i++; } while (0)
        if (!strcmp(a, "--tokens")) { VAL(); tokens_arg = v; }
        else if (!strcmp(a, "--prompt")) { VAL(); prompt = v; }
        else if (!strcmp(a, "--split")) { VAL(); split = parse_long(v, "--split", 1, 1L << 30); }
        else if (!strcmp(a, "--threads")) { VAL(); threads = parse_long(v, "--threads", 1, 1024); }
        else if (!strcmp(a, "--flash-attn")) { VAL(); if (strcmp(v, "on") && strcmp(v, "off")) die("--flash-attn takes on or off, not '%s'", v); fa = !strcmp(v, "on"); }
        else if (!strcmp(a, "--cache-type-k")) { VAL(); ctk = v; }
        else if (!strcmp(a, "--cache-type-v")) { VAL(); ctv = v; }
        else if (!strcmp(a, "--tensors")) { VAL(); tensors = v; }
        else if (!strcmp(a, "--backend-dir")) { VAL(); backend_dir = v; }
        else if (!strcmp(a, "--all")) all = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage();
        else if (a[0] == '-' && a[1]) die("unknown option %s", a);
        else if (!model_path) model_path = a;
        else if (!out_path) out_path = a;
        else die("unexpected argument '%s'", a);
#undef VAL
    }
    if (!model_path || !out_path) usage();
    {   /* OUT checked before the work: a directory, device or FIFO is never replaced */
        struct stat st;
        if (stat(out_path, &st) == 0 && !S_ISREG(st.st_mode))
            die("%s: exists and is not a regular file (a directory, device or pipe); give the trace file to write",
                out_path);
    }
    if (!tokens_arg == !prompt) die("give --tokens IDS or --prompt TEXT (one of them)");
    enum ggml_type tk = cache_type(ctk), tv = cache_type(ctv);
    crc_init();

    if (backend_dir) ggml_backend_load_all_from_path(backend_dir); else ggml_backend_load_all();
    llama_backend_init();
    llama_log_set(quiet_log, NULL);
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) die("llama.cpp cannot load the model %s", model_path);
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    int32_t n_vocab = llama_vocab_n_tokens(vocab);

    /* the token ids */
    int32_t n_tok = 0;
    llama_token * toks = NULL;
    if (tokens_arg) {
        size_t cap = 16;
        toks = xmalloc(cap * sizeof *toks);
        const char * p = tokens_arg;
        while (*p) {
            char * end;
            long v = strtol(p, &end, 10);
            if (end == p || (*end && *end != ',')) die("--tokens: '%s' is not a comma-separated list of ids", tokens_arg);
            if (v < 0 || v >= n_vocab) die("--tokens: id %ld is outside the vocabulary (size %d)", v, n_vocab);
            if ((size_t) n_tok == cap) { cap *= 2; toks = realloc(toks, cap * sizeof *toks); if (!toks) die("out of memory"); }
            toks[n_tok++] = (llama_token) v;
            p = *end ? end + 1 : end;
        }
    } else {
        int32_t len = (int32_t) strlen(prompt);
        int32_t cap = len + 16;
        toks = xmalloc((size_t) cap * sizeof *toks);
        n_tok = llama_tokenize(vocab, prompt, len, toks, cap, true, false);
        if (n_tok < 0) die("the prompt gives more than %d tokens", cap);
    }
    if (n_tok < 1) die("no token ids to run");
    if (split > n_tok) split = -1;

    uint32_t n_ctx = 512;
    while (n_ctx < (uint32_t) n_tok) n_ctx += 256;
    int n_calls = split < 0 ? 1 : 1 + (n_tok - (int) split);
    int32_t * calls = xmalloc((size_t) n_calls * sizeof *calls);
    if (split < 0) calls[0] = n_tok;
    else { calls[0] = (int32_t) split; for (int i = 1; i < n_calls; i++) calls[i] = 1; }

    /* the container's header */
    /* a name of this run's own (OUT.XXXXXX.part): two runs never share one */
    size_t plen = strlen(out_path) + 13;
    char * part = xmalloc(plen);
    snprintf(part, plen, "%s.XXXXXX.part", out_path);
    zip_t z = {0};
    int fd = mkstemps(part, 5);
    if (fd < 0 || !(z.f = fdopen(fd, "wb"))) die("cannot write %s", part);
    part_path = part;
    npy_put_str(&z, "format", "strata-ref-trace 1");
    npy_put_str(&z, "producer", "tools/llama_trace.c");
    int64_t shp = n_tok;
    npy_put(&z, "tokens", "<i4", &shp, 1, toks, (size_t) n_tok * 4);
    shp = n_calls;
    npy_put(&z, "calls", "<i4", &shp, 1, calls, (size_t) n_calls * 4);
    char meta[1024];
    if (llama_model_meta_val_str(model, "general.architecture", meta, sizeof meta) < 0) meta[0] = 0;
    npy_put_str(&z, "model.arch", meta);
    if (llama_model_meta_val_str(model, "general.name", meta, sizeof meta) < 0) meta[0] = 0;
    npy_put_str(&z, "model.name", meta);
    npy_put_i64(&z, "model.n_params", (int64_t) llama_model_n_params(model));
    npy_put_i64(&z, "model.size", (int64_t) llama_model_size(model));
    npy_put_i64(&z, "model.n_vocab", n_vocab);
    npy_put_i64(&z, "model.n_embd", llama_model_n_embd(model));
    npy_put_i64(&z, "model.n_layer", llama_model_n_layer(model));
    buf_t opt = {0};
    char num[64];
    buf_str(&opt, "{\"flash_attn\": ");
    buf_str(&opt, fa ? "true" : "false");
    snprintf(num, sizeof num, ", \"n_ctx\": %u, \"n_threads\": %ld, \"system_info\": ", n_ctx, threads);
    buf_str(&opt, num);
    json_str(&opt, llama_print_system_info());
    buf_str(&opt, ", \"type_k\": ");
    json_str(&opt, ctk);
    buf_str(&opt, ", \"type_v\": ");
    json_str(&opt, ctv);
    buf_str(&opt, "}");
    buf_put(&opt, "", 1);
    npy_put_str(&z, "options", (char *) opt.p);
    free(opt.p);

    state_t st = {&z, 0, 0, all, NULL, 0, 0};
    if (tensors) {
        char * s = xstrdup(tensors);
        for (char * tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
            st.pats = realloc(st.pats, (size_t) (st.npats + 1) * sizeof *st.pats);
            if (!st.pats) die("out of memory");
            st.pats[st.npats++] = tok;
        }
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_ctx;
    cp.n_ubatch = 512;
    cp.n_threads = (int32_t) threads;
    cp.n_threads_batch = (int32_t) threads;
    cp.type_k = tk;
    cp.type_v = tv;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb_eval;
    cp.cb_eval_user_data = &st;
    cp.no_perf = true;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("llama.cpp refused the context (flash attention %s, cache types %s / %s)", fa ? "on" : "off", ctk, ctv);

    int pos = 0;
    for (int c = 0; c < n_calls; c++) {
        int n = calls[c];
        struct llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = toks[pos + i];
            batch.pos[i] = pos + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        st.call = c;
        names_clear();
        if (llama_decode(ctx, batch) != 0) die("llama_decode failed in call %d", c);
        llama_batch_free(batch);
        pos += n;
    }
    npy_put_i64(&z, "n_tensors", st.seq);
    zip_close(&z);
    if (rename(part, out_path) != 0) die("cannot rename %s to %s", part, out_path);
    part_path = NULL;
    printf("%s: %ld tensors, %d tokens, %d calls\n", out_path, st.seq, n_tok, n_calls);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

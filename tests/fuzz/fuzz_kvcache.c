/*
 * Targeted cases of the kv-cache operation (fmha_kvcache_*) and of fmha_merge_attention_states.
 *
 * A kv-cache case builds one of a few valid calls (CSR, block table, contiguous slots, fp8 with
 * per-page descales, split-KV) in guard-paged buffers — the traits and args structs, tensors, pools,
 * tables, descales and workspace — then runs the launcher chain create → workspace_size →
 * prepare_async → check → run → synchronize (or the one-shot fmha_kvcache_fwd) and changes ONE thing
 * right before the judged call. A merge case does the same with one merge call. Valid calls are
 * checked against a float64 reference after NaN-poisoning the outputs.
 *
 * fuzz_cases.c appends these cases to its table (kv_case_count, kv_case_info) and runs them as custom
 * cases (kv_case_run).
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the problems -------------------------------------------------------------------------------- */

enum kv_base {
    KB_CSR,    /* group, PAGE_CSR, page 4, bf16, heads 2/1, d 16, q 2+3 rows, k 7 and 8 tokens, causal */
    KB_BT,     /* batch, BLOCK_TABLE (stride 4, 3 used; the rest garbage), page 4, HND, q 3, k 7 and 5 */
    KB_CONTIG, /* batch, CONTIGUOUS slots of 16 (cache_batch_idx 2, 0), q 2, k 9 and 16, no mask */
    KB_FP8,    /* KB_CSR in fp8 e4m3fn, bf16 output, per-page K/V descales, per (seq, kv head) Q descales */
    KB_SPLIT,  /* decode: batch, BLOCK_TABLE, page 16, heads 4/2, q 1, k 300 and 270, max_splits 8, 64 CUs */
    KB_MERGE,  /* merge: 3 bf16 states, 4 rows, 2 heads, d 16, natural LSE, lse_out written */
};

enum kv_stage { KS_UPPER, KS_CREATE, KS_SIZE, KS_PREPARE, KS_CHECK, KS_RUN, KS_SYNC, KS_FWD, KS_MERGE, KS_HANDLE };
enum kv_target { KT_NONE, KT_TRAITS, KT_ARGS, KT_MERGE };

#define MAXB 4
#define MAXP 24

typedef struct {
    int base, kind, group, dtype, hnd, page_scale, mask, wl, wr;
    int page, batch, hq, hk, d, sq; /* sq: batch mode rows per sequence */
    int lens_q[MAXB], lens_k[MAXB];
    int pages[MAXB][MAXP], npages[MAXB];
    int num_pages, mpps, bt_stride, num_idx;
    int total_q;
    int k_ds_one, no_lse; /* valid variants: k_descale.data NULL (1), has_lse 0 */
    int kv_tensor_scale;  /* fp8: one K and one V descale (kvds[0], kvds[1]) instead of per page */
    /* buffers */
    fmha_kvcache_traits *t;
    fmha_kvcache_args *a;
    unsigned char *q, *k, *v, *o;
    float *lse, *qds, *kvds;
    int32_t *ssq, *seqlen_k, *bt, *indptr, *pidx, *lpl, *cbi;
    size_t q_bytes, o_bytes, lse_bytes, pool_bytes;
    fmha_kvcache_launcher *launcher;
    void *ws;
    size_t ws_size;
    /* merge */
    fmha_merge_args *m;
    unsigned char *o_in, *o_out;
    float *lse_in, *lse_out;
    size_t o_in_bytes, lse_in_bytes, o_out_bytes, lse_out_bytes;
} kv;

static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double fp8_value(uint8_t c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return (c & 0x80) ? -v : v;
}

/* P as the fp8 kernels take it for P·V: times 2^8, rounded to e4m3 (3 mantissa bits, to nearest
 * even; subnormal quantum 2^-9), divided again (src/problem/fp8.rs, round_probability). */
static double round_probability(double p) {
    double x = p * 256.0, quantum;
    int e;
    if (x == 0) return 0;
    frexp(x, &e); /* x = f * 2^e, f in [0.5, 1) */
    quantum = e - 1 < -6 ? ldexp(1.0, -9) : ldexp(1.0, e - 1 - 3);
    return nearbyint(x / quantum) * quantum / 256.0;
}

static int esz(const kv *s) { return s->dtype == FMHA_DTYPE_BF16 ? 2 : 1; }

static double in_value(const kv *s, const unsigned char *buf, size_t element) {
    if (s->dtype == FMHA_DTYPE_BF16) {
        uint16_t b;
        memcpy(&b, buf + 2 * element, 2);
        return from_bf16(b);
    }
    return fp8_value(buf[element]);
}

static void fill_inputs(const kv *s, unsigned char *buf, size_t elements, uint64_t *rng) {
    size_t i;
    for (i = 0; i < elements; ++i) {
        if (s->dtype == FMHA_DTYPE_BF16) {
            uint16_t b = to_bf16((float)rng_int(rng, -1000, 1000) / 1000.0f);
            memcpy(buf + 2 * i, &b, 2);
        } else {
            /* exponents 4..8: |x| in [0.125, 3.75], never NaN */
            buf[i] = (unsigned char)((rng_int(rng, 0, 1) << 7) | (rng_int(rng, 4, 8) << 3) | rng_int(rng, 0, 7));
        }
    }
}

static int32_t *i32_array(const int32_t *values, int n, const char *name) {
    int32_t *p = gp_alloc((size_t)n * 4, 4, name);
    memcpy(p, values, (size_t)n * 4);
    return p;
}

static void kv_default(kv *s, int base) {
    int b, j;
    memset(s, 0, sizeof *s);
    s->base = base;
    s->dtype = FMHA_DTYPE_BF16;
    s->wl = -1;
    s->wr = 0;
    s->mask = FMHA_MASK_BOTTOM_RIGHT;
    switch (base) {
    case KB_CSR:
    case KB_FP8: {
        static const int pages[2][2] = {{3, 1}, {0, 5}};
        s->kind = FMHA_KV_PAGE_CSR;
        s->group = 1;
        s->page = 4;
        s->batch = 2;
        s->hq = 2, s->hk = 1, s->d = 16;
        s->lens_q[0] = 2, s->lens_q[1] = 3;
        s->lens_k[0] = 7, s->lens_k[1] = 8;
        s->num_pages = 6;
        for (b = 0; b < 2; ++b)
            for (j = 0; j < 2; ++j) s->pages[b][j] = pages[b][j];
        if (base == KB_FP8) {
            s->dtype = FMHA_DTYPE_FP8_E4M3FN;
            s->page_scale = 1;
        }
        break;
    }
    case KB_BT: {
        static const int pages[2][2] = {{2, 4}, {0, 3}};
        s->kind = FMHA_KV_BLOCK_TABLE;
        s->hnd = 1;
        s->page = 4;
        s->batch = 2;
        s->hq = 2, s->hk = 2, s->d = 16;
        s->sq = 3;
        s->lens_k[0] = 7, s->lens_k[1] = 5;
        s->num_pages = 5;
        s->mpps = 3;
        s->bt_stride = 4;
        for (b = 0; b < 2; ++b)
            for (j = 0; j < 2; ++j) s->pages[b][j] = pages[b][j];
        break;
    }
    case KB_CONTIG:
        s->kind = FMHA_KV_CONTIGUOUS;
        s->mask = FMHA_MASK_NONE;
        s->wl = s->wr = -1;
        s->page = 16;
        s->batch = 2;
        s->hq = 4, s->hk = 2, s->d = 16;
        s->sq = 2;
        s->lens_k[0] = 9, s->lens_k[1] = 16;
        s->num_pages = 3;
        s->pages[0][0] = 2, s->pages[1][0] = 0;
        break;
    case KB_SPLIT:
        s->kind = FMHA_KV_BLOCK_TABLE;
        s->page = 16;
        s->batch = 2;
        s->hq = 4, s->hk = 2, s->d = 16;
        s->sq = 1;
        s->lens_k[0] = 300, s->lens_k[1] = 270;
        s->num_pages = 40;
        s->mpps = 19;
        s->bt_stride = 19;
        /* sequence 0 on the even pages from the top, 1 on odd ones */
        for (j = 0; j < 19; ++j) s->pages[0][j] = 38 - 2 * j;
        for (j = 0; j < 17; ++j) s->pages[1][j] = 2 * j + 1;
        break;
    default: break;
    }
}

/* Pool element index of (page, kv head g, token row u, column e). */
static size_t pool_at(const kv *s, int page, int g, int u, int e) {
    if (s->hnd) return (((size_t)page * s->hk + g) * s->page + u) * s->d + e;
    return (((size_t)page * s->page + u) * s->hk + g) * s->d + e;
}

/* q/o element index of (sequence b, head h, row i, column e). */
static size_t rows_at(const kv *s, int b, int h, int i, int e) {
    size_t row = s->group ? (size_t)s->ssq[b] + (size_t)i : (size_t)b * s->sq + (size_t)i;
    return (row * s->hq + h) * s->d + e;
}

static size_t lse_at(const kv *s, int b, int h, int i) {
    if (s->group) return (size_t)h * s->total_q + (size_t)s->ssq[b] + (size_t)i;
    return ((size_t)b * s->hq + h) * s->sq + (size_t)i;
}

/* Allocates and fills everything the valid call uses (s from kv_default, maybe changed since). */
static void kv_alloc(kv *s, uint64_t *rng) {
    fmha_kvcache_traits *t;
    fmha_kvcache_args *a;
    size_t rows, pool_elems;
    int b, j, max_q = 0, max_k = 0;
    int32_t ssq[MAXB + 1], lens[MAXB], indptr[MAXB + 1], pidx[MAXB * MAXP], lpl[MAXB], cbi[MAXB];
    int32_t bt[MAXB * (MAXP + 2)]; /* rows of up to MAXP pages, 2 entries of padding */
    s->total_q = 0;
    for (b = 0; b < s->batch; ++b) {
        if (!s->group) s->lens_q[b] = s->sq;
        s->total_q += s->lens_q[b];
        s->npages[b] = s->kind == FMHA_KV_CONTIGUOUS ? 1 : (s->lens_k[b] + s->page - 1) / s->page;
        if (s->lens_q[b] > max_q) max_q = s->lens_q[b];
        if (s->lens_k[b] > max_k) max_k = s->lens_k[b];
    }
    rows = (size_t)s->total_q;
    s->q_bytes = rows * s->hq * s->d * esz(s);
    s->o_bytes = rows * s->hq * s->d * 2;
    s->lse_bytes = rows * s->hq * 4;
    pool_elems = (size_t)s->num_pages * s->page * s->hk * s->d;
    s->pool_bytes = pool_elems * esz(s);
    s->q = gp_alloc(s->q_bytes, 16, "q");
    s->k = gp_alloc(s->pool_bytes, 16, "k pool");
    s->v = gp_alloc(s->pool_bytes, 16, "v pool");
    s->o = gp_alloc_fill(s->o_bytes, 16, "o", 0xff);
    s->lse = gp_alloc_fill(s->lse_bytes, 16, "lse", 0xff);
    fill_inputs(s, s->q, rows * s->hq * s->d, rng);
    fill_inputs(s, s->k, pool_elems, rng);
    fill_inputs(s, s->v, pool_elems, rng);
    ssq[0] = 0;
    indptr[0] = 0;
    for (b = 0; b < s->batch; ++b) {
        ssq[b + 1] = ssq[b] + s->lens_q[b];
        lens[b] = s->lens_k[b];
        indptr[b + 1] = indptr[b] + s->npages[b];
        for (j = 0; j < s->npages[b]; ++j) pidx[indptr[b] + j] = s->pages[b][j];
        lpl[b] = s->lens_k[b] == 0 ? 0 : s->lens_k[b] - (s->npages[b] - 1) * s->page;
        cbi[b] = s->pages[b][0];
        /* block-table entries past a sequence's pages are never read: garbage */
        for (j = 0; j < s->bt_stride; ++j)
            bt[b * s->bt_stride + j] = j < s->npages[b] ? s->pages[b][j] : (j & 1) ? INT32_MIN : 0x7ffffff0;
    }
    s->num_idx = indptr[s->batch];
    s->ssq = i32_array(ssq, s->batch + 1, "seqstart_q");
    if (s->kind == FMHA_KV_PAGE_CSR) {
        s->indptr = i32_array(indptr, s->batch + 1, "kv_indptr");
        s->pidx = i32_array(pidx, s->num_idx, "page_indices");
        s->lpl = i32_array(lpl, s->batch, "last_page_len");
    } else {
        s->seqlen_k = i32_array(lens, s->batch, "seqlen_k");
        if (s->kind == FMHA_KV_BLOCK_TABLE) s->bt = i32_array(bt, s->batch * s->bt_stride, "block_table");
        else s->cbi = i32_array(cbi, s->batch, "cache_batch_idx");
    }
    if (s->dtype != FMHA_DTYPE_BF16) {
        /* q: [batch][h_k]; k/v: aiter's packed [num_pages][h_k][2]; all in [1.25, 2) */
        size_t nq = (size_t)s->batch * s->hk, nkv = (size_t)s->num_pages * s->hk * 2, i;
        s->qds = gp_alloc(nq * 4, 4, "q_descale");
        s->kvds = gp_alloc(nkv * 4, 4, "k/v descales");
        for (i = 0; i < nq; ++i) s->qds[i] = 1.25f + (float)rng_int(rng, 0, 750) / 1000.0f;
        for (i = 0; i < nkv; ++i) s->kvds[i] = 1.25f + (float)rng_int(rng, 0, 750) / 1000.0f;
    }

    t = s->t = gp_alloc(sizeof *t, 8, "fmha_kvcache_traits");
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->dtype = s->dtype;
    t->o_dtype = FMHA_DTYPE_BF16;
    t->hdim_q = t->hdim_v = s->d;
    t->nhead_q = s->hq;
    t->nhead_k = s->hk;
    t->is_group_mode = s->group;
    t->mask_type = s->mask;
    t->has_lse = 1;
    t->kv_table_kind = s->kind;
    t->kv_layout = FMHA_KV_LAYOUT_STRIDED;
    t->kv_scale_granularity = s->page_scale ? FMHA_KV_SCALE_PAGE : FMHA_KV_SCALE_TENSOR;
    t->page_size = s->page;
    t->batch = s->batch;
    t->total_q = s->total_q;
    t->max_seqlen_q = max_q;
    t->max_seqlen_k = max_k;
    t->max_splits = s->base == KB_SPLIT ? 8 : 0;
    t->check_tables = 1;

    a = s->a = gp_alloc(sizeof *a, 8, "fmha_kvcache_args");
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->q = (fmha_tensor){s->q, (int64_t)s->sq * s->hq * s->d, s->d, (int64_t)s->hq * s->d};
    a->o = (fmha_tensor){s->o, (int64_t)s->sq * s->hq * s->d, s->d, (int64_t)s->hq * s->d};
    if (s->group) a->q.batch_stride = a->o.batch_stride = 0;
    a->k.data = s->k;
    a->v.data = s->v;
    a->k.batch_stride = (int64_t)s->page * s->hk * s->d;
    a->k.head_stride = s->hnd ? (int64_t)s->page * s->d : s->d;
    a->k.row_stride = s->hnd ? s->d : (int64_t)s->hk * s->d;
    a->v.batch_stride = a->k.batch_stride;
    a->v.head_stride = a->k.head_stride;
    a->v.row_stride = a->k.row_stride;
    a->lse = s->group ? (fmha_tensor){s->lse, 0, s->total_q, 1} : (fmha_tensor){s->lse, (int64_t)s->hq * s->sq, s->sq, 1};
    a->seqstart_q = s->group ? s->ssq : NULL;
    a->batch = s->batch;
    a->seqlen_q = s->group ? s->total_q : s->sq;
    a->num_pages = s->num_pages;
    a->max_pages_per_seq = s->kind == FMHA_KV_BLOCK_TABLE ? s->mpps : 0;
    a->num_page_indices = s->kind == FMHA_KV_PAGE_CSR ? s->num_idx : 0;
    a->seqlen_k = s->seqlen_k;
    a->block_table = s->bt;
    a->block_table_stride = s->kind == FMHA_KV_BLOCK_TABLE ? s->bt_stride : 0;
    a->kv_indptr = s->indptr;
    a->page_indices = s->pidx;
    a->last_page_len = s->lpl;
    a->cache_batch_idx = s->cbi;
    a->window_size_left = s->wl;
    a->window_size_right = s->wr;
    if (s->qds) {
        a->q_descale = (fmha_scale){s->qds, s->hk, 1, 0};
        a->k_descale = (fmha_scale){s->kvds, 0, 2, 2 * (int64_t)s->hk};
        a->v_descale = (fmha_scale){s->kvds + 1, 0, 2, 2 * (int64_t)s->hk};
    }
}

/* The K (v = 0) or V (v = 1) descale of kv head g on `page`. */
static double kv_descale(const kv *s, int page, int g, int v) {
    if (!s->kvds || (!v && s->k_ds_one)) return 1.0;
    if (s->kv_tensor_scale) return s->kvds[v];
    return s->kvds[(page * s->hk + g) * 2 + v];
}

/* The float64 reference: O and LSE of every (sequence, head, row); compares with s->o and s->lse
 * (bf16 and fp32). Returns 1 if they match, 0 (note) otherwise. */
static int kv_check(const kv *s, char *note, size_t note_size) {
    int b, h, i, j, e, bad = 0;
    double scale = s->a->scale != 0 ? s->a->scale : 1.0 / sqrt((double)s->d);
    double *p = malloc(sizeof(double) * 512), *acc = malloc(sizeof(double) * (size_t)s->d);
    for (b = 0; b < s->batch; ++b) {
        int nq = s->lens_q[b], nk = s->lens_k[b];
        for (h = 0; h < s->hq; ++h) {
            int g = h / (s->hq / s->hk);
            double dq = s->qds ? s->qds[b * s->hk + g] : 1.0;
            for (i = 0; i < nq; ++i) {
                double m = -INFINITY, sum = 0, lse, got_lse;
                for (e = 0; e < s->d; ++e) acc[e] = 0;
                for (j = 0; j < nk; ++j) {
                    int diag = i + nk - nq, page = s->kind == FMHA_KV_CONTIGUOUS ? s->pages[b][0] : s->pages[b][j / s->page];
                    int u = s->kind == FMHA_KV_CONTIGUOUS ? j : j % s->page;
                    double dk = kv_descale(s, page, g, 0), x = 0;
                    p[j] = -INFINITY;
                    if (s->mask == FMHA_MASK_BOTTOM_RIGHT &&
                        ((s->wr >= 0 && j > diag + s->wr) || (s->wl >= 0 && j < diag - s->wl)))
                        continue;
                    for (e = 0; e < s->d; ++e)
                        x += in_value(s, s->q, rows_at(s, b, h, i, e)) * in_value(s, s->k, pool_at(s, page, g, u, e));
                    p[j] = x * scale * dq * dk;
                    if (p[j] > m) m = p[j];
                }
                for (j = 0; j < nk; ++j) {
                    int page = s->kind == FMHA_KV_CONTIGUOUS ? s->pages[b][0] : s->pages[b][j / s->page];
                    int u = s->kind == FMHA_KV_CONTIGUOUS ? j : j % s->page;
                    double dv = kv_descale(s, page, g, 1), w;
                    if (p[j] == -INFINITY) continue;
                    w = exp(p[j] - m);
                    sum += w;
                    if (s->dtype != FMHA_DTYPE_BF16) w = round_probability(w);
                    for (e = 0; e < s->d; ++e) acc[e] += w * dv * in_value(s, s->v, pool_at(s, page, g, u, e));
                }
                lse = sum > 0 ? m + log(sum) : -INFINITY;
                got_lse = s->no_lse ? lse : s->lse[lse_at(s, b, h, i)];
                if (!(lse == got_lse || fabs(lse - got_lse) <= 1e-3 * (1 + fabs(lse)))) {
                    if (!bad++) appendf(note, note_size, "lse[b %d h %d row %d] = %g, reference %g; ", b, h, i, got_lse, lse);
                }
                for (e = 0; e < s->d; ++e) {
                    uint16_t bits;
                    double want = sum > 0 ? acc[e] / sum : 0, got;
                    memcpy(&bits, s->o + 2 * rows_at(s, b, h, i, e), 2);
                    got = from_bf16(bits);
                    if (!(fabs(got - want) <= 2e-2 * (1 + fabs(want)))) {
                        if (!bad++) appendf(note, note_size, "o[b %d h %d row %d col %d] = %g, reference %g; ", b, h, i, e, got, want);
                    }
                }
            }
        }
    }
    free(p);
    free(acc);
    if (bad) appendf(note, note_size, "%d values wrong; ", bad);
    return bad == 0;
}

/* ---- merge --------------------------------------------------------------------------------------- */

enum { MS = 3, MR = 4, MH = 2, MD = 16 };

static void merge_alloc(kv *s, int states, uint64_t *rng) {
    fmha_merge_args *m;
    size_t n_o = (size_t)states * MH * MR * MD, n_l = (size_t)states * MH * MR, i;
    s->o_in_bytes = n_o * 2;
    s->lse_in_bytes = n_l * 4;
    s->o_out_bytes = (size_t)MH * MR * MD * 2;
    s->lse_out_bytes = (size_t)MH * MR * 4;
    s->o_in = gp_alloc(s->o_in_bytes, 16, "o_in");
    s->lse_in = gp_alloc(s->lse_in_bytes, 16, "lse_in");
    s->o_out = gp_alloc_fill(s->o_out_bytes, 16, "o_out", 0xff);
    s->lse_out = gp_alloc_fill(s->lse_out_bytes, 16, "lse_out", 0xff);
    for (i = 0; i < n_o; ++i) {
        uint16_t b = to_bf16((float)rng_int(rng, -1000, 1000) / 1000.0f);
        memcpy(s->o_in + 2 * i, &b, 2);
    }
    for (i = 0; i < n_l; ++i) s->lse_in[i] = (float)rng_int(rng, -3000, 3000) / 1000.0f;
    m = s->m = gp_alloc(sizeof *m, 8, "fmha_merge_args");
    memset(m, 0, sizeof *m);
    m->struct_size = sizeof *m;
    m->num_states = states;
    m->num_rows = MR;
    m->nhead = MH;
    m->hdim = MD;
    m->in_dtype = m->out_dtype = FMHA_DTYPE_BF16;
    m->lse_base = FMHA_LSE_NATURAL;
    m->o_in = (fmha_tensor){s->o_in, MH * MR * MD, MR * MD, MD};
    m->lse_in = (fmha_tensor){s->lse_in, MH * MR, MR, 1};
    m->o_out = (fmha_tensor){s->o_out, 0, MR * MD, MD};
    m->lse_out = (fmha_tensor){s->lse_out, 0, MR, 1};
}

/* The float64 merge of m's states against o_out (and lse_out if check_lse). In place, state 0 was
 * overwritten: `o0`/`l0` are its saved copy (else NULL). */
static int merge_check(const kv *s, const unsigned char *o0, const float *l0, int check_lse, char *note, size_t note_size) {
    const fmha_merge_args *m = s->m;
    int h, r, st, e, bad = 0;
    double ln2 = m->lse_base == FMHA_LSE_BASE2 ? log(2.0) : 1.0;
    for (h = 0; h < MH; ++h)
        for (r = 0; r < MR; ++r) {
            double mx = -INFINITY, sum = 0, acc[MD] = {0}, lse, got_lse;
            for (st = 0; st < m->num_states; ++st) {
                size_t li = (size_t)st * MH * MR + (size_t)h * MR + r;
                double l = (st == 0 && l0 ? l0[(size_t)h * MR + r] : s->lse_in[li]) * ln2;
                if (isfinite(l) && l > mx) mx = l;
            }
            for (st = 0; st < m->num_states; ++st) {
                size_t li = (size_t)st * MH * MR + (size_t)h * MR + r;
                double l = (st == 0 && l0 ? l0[(size_t)h * MR + r] : s->lse_in[li]) * ln2, w;
                if (!isfinite(l)) continue;
                w = exp(l - mx);
                sum += w;
                for (e = 0; e < MD; ++e) {
                    uint16_t b;
                    size_t oi = (((size_t)st * MH + h) * MR + r) * MD + e;
                    memcpy(&b, (st == 0 && o0 ? o0 : s->o_in) + 2 * oi, 2);
                    acc[e] += w * from_bf16(b);
                }
            }
            lse = sum > 0 ? (mx + log(sum)) / ln2 : -INFINITY;
            got_lse = check_lse ? s->lse_out[(size_t)h * MR + r] : lse;
            if (!(lse == got_lse || fabs(lse - got_lse) <= 1e-4 * (1 + fabs(lse))))
                if (!bad++) appendf(note, note_size, "lse_out[h %d row %d] = %g, reference %g; ", h, r, got_lse, lse);
            for (e = 0; e < MD; ++e) {
                uint16_t b;
                double want = sum > 0 ? acc[e] / sum : 0, got;
                memcpy(&b, s->o_out + 2 * (((size_t)h * MR + r) * MD + e), 2);
                got = from_bf16(b);
                if (!(fabs(got - want) <= 1e-2 * (1 + fabs(want))))
                    if (!bad++) appendf(note, note_size, "o_out[h %d row %d col %d] = %g, reference %g; ", h, r, e, got, want);
            }
        }
    if (bad) appendf(note, note_size, "%d values wrong; ", bad);
    return bad == 0;
}

/* ---- the table ----------------------------------------------------------------------------------- */

/* Mutations that are not a plain field value (op of a case). */
enum kv_op {
    OP_FIELD,          /* width bytes at offset of the target struct = value */
    OP_NULL_TRAITS,    /* the judged call gets NULL traits */
    OP_NULL_ARGS,      /* ... NULL args */
    OP_NULL_OUT,       /* ... NULL out-pointer (launcher or bytes) */
    OP_NULL_LAUNCHER,  /* ... NULL launcher */
    OP_DESTROYED,      /* ... a destroyed launcher */
    OP_GARBAGE,        /* ... a launcher handle that no create returned */
    OP_FOREIGN,        /* ... a backward launcher's handle */
    OP_DOUBLE_DESTROY, /* destroy twice */
    OP_DATA_NULL,      /* tensor `value` (enum kv_tensor) data = NULL */
    OP_DATA_MISALIGN,  /* tensor `value` data + 1 byte (+ 2 for fp32 and int32 arrays) */
    OP_DATA_WRAP,      /* tensor `value` data = 2^64 - 16 */
    OP_ARRAY,          /* device array `value` (enum kv_array) entry `index` = `entry` */
    OP_ARRAY_NULL,     /* array `value` = NULL */
    OP_ARRAY_MISALIGN, /* array `value` + 2 bytes */
    OP_ARRAY_INTO,     /* array `value` = tensor `index`.data (an input inside an output) */
    OP_OVERLAP,        /* tensor `value`.data = tensor `index`.data (merge: `entry` picks a variant) */
    OP_WS,             /* workspace: `value` 0 NULL, 1 + 8 bytes, 2 zeros (never prepared), 3 random bytes, 4 size 16 */
    OP_SCALE,          /* args.scale = `value` 0 NaN, 1 inf */
    OP_BATCH_SSQ,      /* batch mode: seqstart_q = a valid [batch + 1] array */
    OP_VALID,          /* valid variant `value` of the base call (kv_variant_shape, kv_variant_args) */
};

enum kv_tensor { KT_Q, KT_K, KT_V, KT_O, KT_LSE, KT_QDS, KT_KDS, KT_VDS, KT_O_IN, KT_LSE_IN, KT_O_OUT, KT_LSE_OUT };
static const char *const kv_tensor_names[] = {"q", "k", "v", "o", "lse", "q_descale", "k_descale", "v_descale",
                                              "o_in", "lse_in", "o_out", "lse_out"};
enum kv_array { KA_SSQ, KA_SEQLEN_K, KA_BT, KA_INDPTR, KA_PIDX, KA_LPL, KA_CBI };
static const char *const kv_array_names[] = {"seqstart_q", "seqlen_k", "block_table", "kv_indptr", "page_indices", "last_page_len",
                                             "cache_batch_idx"};

#define K_NO_CHECK 1u  /* the chain skips fmha_kvcache_launcher_check */
#define K_SAMPLE 2u    /* always in a --sample */
#define K_NO_TABLES 4u /* traits.check_tables = 0 */
#define K_NO_LSE 8u    /* traits.has_lse = 0 (lse.data still set) */

typedef struct {
    char desc[200];
    char fields[80];
    int expect, base, stage, target, op;
    size_t offset, width;
    int64_t value;
    int index, entry;
    uint32_t statuses;
    unsigned flags;
} kvcase;

#define KV_MAX_CASES 600
static kvcase kvt[KV_MAX_CASES];
static int kvt_size = -1;

#define INV STATUS_BIT(FMHA_ERR_INVALID_ARGUMENT)
#define NULLP STATUS_BIT(FMHA_ERR_NULL_POINTER)
#define UNSUP STATUS_BIT(FMHA_ERR_UNSUPPORTED)
#define ASYNC STATUS_BIT(FMHA_ERR_ASYNC_FAILURE)

static const char *const base_names[] = {"kv csr", "kv block table", "kv contiguous", "kv fp8 csr", "kv split", "merge"};
static const char *const stage_names[] = {"upper_bound", "create", "workspace_size", "prepare_async", "check", "run",
                                          "run+sync", "fmha_kvcache_fwd", "merge", "handle"};

static kvcase *kadd(int expect, int base, int stage, int op, const char *fields, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

static kvcase *kadd(int expect, int base, int stage, int op, const char *fields, const char *fmt, ...) {
    kvcase *c;
    va_list ap;
    if (kvt_size >= KV_MAX_CASES) {
        fprintf(stderr, "fuzz: too many kv-cache cases\n");
        abort();
    }
    c = &kvt[kvt_size++];
    memset(c, 0, sizeof *c);
    c->expect = expect;
    c->base = base;
    c->stage = stage;
    c->op = op;
    snprintf(c->fields, sizeof c->fields, "%s", fields);
    snprintf(c->desc, sizeof c->desc, "%s [%s]: ", base_names[base], stage_names[stage]);
    va_start(ap, fmt);
    vsnprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), fmt, ap);
    va_end(ap);
    return c;
}

static kvcase *kmut(int base, int stage, int target, size_t offset, size_t width, int64_t value, const char *fields,
                    const char *what, uint32_t statuses) {
    static const char *const struct_of[] = {"", "traits", "args", "merge_args"};
    kvcase *c = kadd(EXPECT_ERROR, base, stage, OP_FIELD, fields, "%s.%s = %lld", struct_of[target], what, (long long)value);
    c->target = target;
    c->offset = offset;
    c->width = width;
    c->value = value;
    c->statuses = statuses;
    return c;
}

#define MSIZE(type, member) sizeof(((type *)0)->member)
#define KT(base, member, value, fields, st) \
    kmut(base, KS_CREATE, KT_TRAITS, offsetof(fmha_kvcache_traits, member), MSIZE(fmha_kvcache_traits, member), (int64_t)(value), fields, #member, st)
#define KA(base, stage, member, value, fields, st) \
    kmut(base, stage, KT_ARGS, offsetof(fmha_kvcache_args, member), MSIZE(fmha_kvcache_args, member), (int64_t)(value), fields, #member, st)
#define KM(member, value, fields, st) \
    kmut(KB_MERGE, KS_MERGE, KT_MERGE, offsetof(fmha_merge_args, member), MSIZE(fmha_merge_args, member), (int64_t)(value), fields, #member, st)

static kvcase *kop(int expect, int base, int stage, int op, int64_t value, int index, int entry, const char *fields, uint32_t statuses,
                   const char *desc) {
    kvcase *c = kadd(expect, base, stage, op, fields, "%s", desc);
    c->value = value;
    c->index = index;
    c->entry = entry;
    c->statuses = statuses;
    return c;
}

/* A tensor field of the args: offset of member `t` (enum kv_tensor) within fmha_kvcache_args or
 * fmha_merge_args. */
static size_t tensor_offset(int t) {
    switch (t) {
    case KT_Q: return offsetof(fmha_kvcache_args, q);
    case KT_K: return offsetof(fmha_kvcache_args, k);
    case KT_V: return offsetof(fmha_kvcache_args, v);
    case KT_O: return offsetof(fmha_kvcache_args, o);
    case KT_LSE: return offsetof(fmha_kvcache_args, lse);
    case KT_QDS: return offsetof(fmha_kvcache_args, q_descale);
    case KT_KDS: return offsetof(fmha_kvcache_args, k_descale);
    case KT_VDS: return offsetof(fmha_kvcache_args, v_descale);
    case KT_O_IN: return offsetof(fmha_merge_args, o_in);
    case KT_LSE_IN: return offsetof(fmha_merge_args, lse_in);
    case KT_O_OUT: return offsetof(fmha_merge_args, o_out);
    default: return offsetof(fmha_merge_args, lse_out);
    }
}

static void build_kv(void) {
    static const int64_t deltas[] = {-8, -1, 8};
    static const int stages_args[] = {KS_PREPARE, KS_RUN, KS_FWD};
    static const char *const strides[] = {"batch_stride", "head_stride", "row_stride"};
    char fields[80], desc[200];
    size_t i;
    int t, st, k;
    if (kvt_size >= 0) return;
    kvt_size = 0;

    /* ---- traits (judged at create; a few at upper_bound and at the one-shot call) ---- */
    KT(KB_CSR, struct_size, 0, "struct_size|traits", INV);
    for (i = 0; i < 3; ++i) KT(KB_CSR, struct_size, (int64_t)sizeof(fmha_kvcache_traits) + deltas[i], "struct_size|traits", INV);
    KT(KB_CSR, struct_size, (int64_t)1 << 40, "struct_size|traits", INV);
    KT(KB_CSR, dtype, FMHA_DTYPE_FP32, "dtype", INV);
    KT(KB_CSR, dtype, 5, "dtype", INV);
    KT(KB_CSR, dtype, -1, "dtype", INV);
    KT(KB_CSR, dtype, INT32_MAX, "dtype", INV);
    KT(KB_FP8, o_dtype, FMHA_DTYPE_FP32, "o_dtype", UNSUP);
    KT(KB_FP8, o_dtype, FMHA_DTYPE_FP16, "o_dtype", INV);
    KT(KB_FP8, o_dtype, 7, "o_dtype", INV);
    KT(KB_FP8, o_dtype, -1, "o_dtype", INV);
    KT(KB_CSR, hdim_q, 0, "hdim_q", 0);
    KT(KB_CSR, hdim_q, -1, "hdim_q", 0);
    KT(KB_CSR, hdim_q, 257, "hdim_q", 0);
    KT(KB_CSR, hdim_q, INT32_MAX, "hdim_q", 0);
    KT(KB_CSR, hdim_v, 0, "hdim_v", 0);
    KT(KB_CSR, hdim_v, -16, "hdim_v", 0);
    KT(KB_CSR, hdim_v, 272, "hdim_v", 0);
    KT(KB_CSR, nhead_q, 0, "nhead_q", 0);
    KT(KB_CSR, nhead_q, -2, "nhead_q", 0);
    KT(KB_CSR, nhead_k, 0, "nhead_k", 0);
    KT(KB_CSR, nhead_k, -1, "nhead_k", 0);
    KT(KB_BT, nhead_k, 3, "nhead_k|nhead_q", 0);
    KT(KB_CONTIG, nhead_k, 8, "nhead_k|nhead_q", 0);
    KT(KB_CSR, is_group_mode, 2, "is_group_mode", INV);
    KT(KB_CSR, is_group_mode, -1, "is_group_mode", INV);
    KT(KB_CSR, mask_type, FMHA_MASK_TOP_LEFT, "mask_type", UNSUP | INV);
    KT(KB_CSR, mask_type, 3, "mask_type", UNSUP | INV);
    KT(KB_CSR, mask_type, 4, "mask_type", INV);
    KT(KB_CSR, mask_type, -1, "mask_type", INV);
    KT(KB_CSR, has_lse, 2, "has_lse", INV);
    KT(KB_CSR, has_lse, -1, "has_lse", INV);
    KT(KB_CSR, kv_table_kind, 3, "kv_table_kind", INV);
    KT(KB_CSR, kv_table_kind, -1, "kv_table_kind", INV);
    KT(KB_CSR, kv_table_kind, INT32_MIN, "kv_table_kind", INV);
    KT(KB_CSR, kv_layout, 2, "kv_layout", INV);
    KT(KB_CSR, kv_layout, -1, "kv_layout", INV);
    KT(KB_CSR, kv_scale_granularity, 2, "kv_scale_granularity", INV);
    KT(KB_CSR, kv_scale_granularity, -1, "kv_scale_granularity", INV);
    KT(KB_CSR, kv_scale_granularity, FMHA_KV_SCALE_PAGE, "kv_scale_granularity", INV); /* bf16: fp8 only */
    KT(KB_CONTIG, kv_scale_granularity, FMHA_KV_SCALE_PAGE, "kv_scale_granularity", INV);
    KT(KB_CSR, page_size, 0, "page_size", 0);
    KT(KB_CSR, page_size, -1, "page_size", 0);
    KT(KB_CSR, page_size, INT32_MIN, "page_size", 0);
    KT(KB_CONTIG, page_size, 0, "page_size", 0);
    KT(KB_CSR, batch, -1, "batch", 0);
    KT(KB_CSR, total_q, -1, "total_q", 0);
    KT(KB_CSR, max_seqlen_q, -1, "max_seqlen_q", 0);
    KT(KB_CSR, max_seqlen_k, -1, "max_seqlen_k", 0);
    KT(KB_SPLIT, max_splits, -1, "max_splits", 0);
    KT(KB_SPLIT, max_splits, 257, "max_splits", 0);
    KT(KB_SPLIT, max_splits, INT32_MAX, "max_splits", 0);
    KT(KB_SPLIT, kv_split_tokens, -1, "kv_split_tokens", 0);
    KT(KB_CSR, check_tables, 2, "check_tables", INV);
    KT(KB_CSR, check_tables, -1, "check_tables", INV);
    /* the one-shot call and upper_bound read the same traits */
    for (st = 0; st < 2; ++st) {
        int stage = st ? KS_FWD : KS_UPPER;
        kmut(KB_CSR, stage, KT_TRAITS, 0, 8, 0, "struct_size|traits", "struct_size", INV);
        kmut(KB_CSR, stage, KT_TRAITS, offsetof(fmha_kvcache_traits, dtype), 4, 9, "dtype", "dtype", INV);
        kmut(KB_CSR, stage, KT_TRAITS, offsetof(fmha_kvcache_traits, kv_table_kind), 4, 7, "kv_table_kind", "kv_table_kind", INV);
        kmut(KB_CSR, stage, KT_TRAITS, offsetof(fmha_kvcache_traits, page_size), 4, 0, "page_size", "page_size", 0);
        kmut(KB_CSR, stage, KT_TRAITS, offsetof(fmha_kvcache_traits, nhead_k), 4, 0, "nhead_k", "nhead_k", 0);
        kmut(KB_SPLIT, stage, KT_TRAITS, offsetof(fmha_kvcache_traits, max_splits), 4, 300, "max_splits", "max_splits", 0);
        kop(EXPECT_ERROR, KB_CSR, stage, OP_NULL_TRAITS, 0, 0, 0, "traits", NULLP, "NULL traits");
    }
    kop(EXPECT_ERROR, KB_CSR, KS_UPPER, OP_NULL_OUT, 0, 0, 0, "bytes", NULLP, "NULL bytes");
    kop(EXPECT_ERROR, KB_CSR, KS_FWD, OP_NULL_ARGS, 0, 0, 0, "args", NULLP, "NULL args");
    kop(EXPECT_ERROR, KB_CSR, KS_CREATE, OP_NULL_TRAITS, 0, 0, 0, "traits", NULLP, "NULL traits");
    kop(EXPECT_ERROR, KB_CSR, KS_CREATE, OP_NULL_OUT, 0, 0, 0, "launcher", NULLP, "NULL launcher out-pointer");

    /* ---- launcher handles ---- */
    {
        static const int stages[] = {KS_SIZE, KS_PREPARE, KS_CHECK, KS_RUN};
        for (i = 0; i < 4; ++i) {
            kop(EXPECT_ERROR, KB_CSR, stages[i], OP_NULL_LAUNCHER, 0, 0, 0, "launcher", NULLP, "NULL launcher");
            kop(EXPECT_ERROR, KB_CSR, stages[i], OP_DESTROYED, 0, 0, 0, "launcher", INV, "a destroyed launcher")->flags |= K_SAMPLE;
            kop(EXPECT_ERROR, KB_CSR, stages[i], OP_GARBAGE, 0, 0, 0, "launcher", INV, "a garbage launcher handle");
            kop(EXPECT_ERROR, KB_CSR, stages[i], OP_FOREIGN, 0, 0, 0, "launcher", INV, "a backward launcher's handle");
        }
        kop(EXPECT_ERROR, KB_CSR, KS_SIZE, OP_NULL_OUT, 0, 0, 0, "bytes", NULLP, "NULL bytes");
        kop(EXPECT_ERROR, KB_CSR, KS_PREPARE, OP_NULL_ARGS, 0, 0, 0, "args", NULLP, "NULL args");
        kop(EXPECT_ERROR, KB_CSR, KS_RUN, OP_NULL_ARGS, 0, 0, 0, "args", NULLP, "NULL args");
        kop(EXPECT_ERROR, KB_CSR, KS_HANDLE, OP_DOUBLE_DESTROY, 0, 0, 0, "launcher", INV, "destroy twice")->flags |= K_SAMPLE;
        kop(EXPECT_ERROR, KB_CSR, KS_HANDLE, OP_GARBAGE, 0, 0, 0, "launcher", INV, "destroy a garbage handle");
        kop(EXPECT_ERROR, KB_CSR, KS_HANDLE, OP_FOREIGN, 0, 0, 0, "launcher", INV, "destroy a backward launcher's handle as a kv-cache one");
    }

    /* ---- args: each judged at the prepare, at the run (after a valid prepare) and at the one-shot call ---- */
    for (k = 0; k < 3; ++k) {
        int s = stages_args[k];
        KA(KB_CSR, s, struct_size, 0, "struct_size|args", INV);
        for (i = 0; i < 3; ++i) KA(KB_CSR, s, struct_size, (int64_t)sizeof(fmha_kvcache_args) + deltas[i], "struct_size|args", INV);
        KA(KB_CSR, s, struct_size, (int64_t)1 << 40, "struct_size|args", INV);
        KA(KB_CSR, s, batch, -1, "batch", 0);
        KA(KB_CSR, s, batch, 3, "batch", 0);
        KA(KB_CSR, s, batch, INT32_MIN, "batch", 0);
        KA(KB_CSR, s, seqlen_q, -1, "seqlen_q", 0);
        KA(KB_CSR, s, seqlen_q, 6, "seqlen_q|total_q", 0);
        KA(KB_BT, s, seqlen_q, 4, "seqlen_q|max_seqlen_q", 0);
        KA(KB_CSR, s, num_pages, 0, "num_pages", 0);
        KA(KB_CSR, s, num_pages, -1, "num_pages", 0);
        KA(KB_CSR, s, num_page_indices, -1, "num_page_indices", 0);
        KA(KB_BT, s, max_pages_per_seq, -1, "max_pages_per_seq", 0);
        KA(KB_BT, s, max_pages_per_seq, 5, "max_pages_per_seq|block_table_stride", 0);
        KA(KB_BT, s, block_table_stride, 2, "block_table_stride|max_pages_per_seq", 0);
        KA(KB_BT, s, block_table_stride, -4, "block_table_stride", 0);
        KA(KB_BT, s, block_table_stride, INT64_MAX, "block_table_stride|block_table", 0);
        KA(KB_CSR, s, window_size_left, -2, "window_size_left", 0);
        KA(KB_CSR, s, window_size_right, -2, "window_size_right", 0);
        kop(EXPECT_ERROR, KB_CSR, s, OP_SCALE, 0, 0, 0, "scale", 0, "args.scale = NaN");
        kop(EXPECT_ERROR, KB_CSR, s, OP_SCALE, 1, 0, 0, "scale", 0, "args.scale = inf");
        for (t = KT_Q; t <= KT_LSE; ++t) {
            snprintf(fields, sizeof fields, "%s", kv_tensor_names[t]);
            snprintf(desc, sizeof desc, "%s.data = NULL", kv_tensor_names[t]);
            kop(EXPECT_ERROR, KB_CSR, s, OP_DATA_NULL, t, 0, 0, fields, 0, desc);
            snprintf(desc, sizeof desc, "%s.data misaligned", kv_tensor_names[t]);
            kop(EXPECT_ERROR, KB_CSR, s, OP_DATA_MISALIGN, t, 0, 0, fields, INV, desc);
            snprintf(desc, sizeof desc, "%s.data = 2^64 - 16 (the extent wraps)", kv_tensor_names[t]);
            kop(EXPECT_ERROR, KB_CSR, s, OP_DATA_WRAP, t, 0, 0, fields, INV, desc);
            for (i = 0; i < 3; ++i) {
                size_t off = tensor_offset(t) + offsetof(fmha_tensor, batch_stride) + 8 * i;
                snprintf(fields, sizeof fields, "%s", kv_tensor_names[t]);
                snprintf(desc, sizeof desc, "%s.%s", kv_tensor_names[t], strides[i]);
                kmut(KB_BT, s, KT_ARGS, off, 8, -1, fields, desc, INV);
                kmut(KB_BT, s, KT_ARGS, off, 8, (int64_t)1 << 62, fields, desc, INV);
            }
        }
        KA(KB_CSR, s, lse.row_stride, 2, "lse", 0);
        /* o overlapping an input or lse; o overlapping itself */
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_O, KT_Q, 0, "o|q", INV, "o.data = q.data");
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_O, KT_K, 0, "o|k", INV, "o.data = k.data (the pool)");
        kop(EXPECT_ERROR, KB_BT, s, OP_OVERLAP, KT_O, KT_V, 0, "o|v", INV, "o.data = v.data (the pool)");
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_LSE, KT_O, 0, "lse|o", INV, "lse.data = o.data");
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_LSE, KT_Q, 0, "lse|q", INV, "lse.data = q.data");
        kop(EXPECT_ERROR, KB_FP8, s, OP_OVERLAP, KT_KDS, KT_O, 0, "o|k_descale", INV, "k_descale.data = o.data (an input inside the output)");
        /* the device arrays and descales are inputs too */
        kop(EXPECT_ERROR, KB_CSR, s, OP_ARRAY_INTO, KA_INDPTR, KT_O, 0, "o|kv_indptr", INV, "kv_indptr inside o");
        kop(EXPECT_ERROR, KB_CSR, s, OP_ARRAY_INTO, KA_PIDX, KT_LSE, 0, "lse|page_indices", INV, "page_indices inside lse");
        kop(EXPECT_ERROR, KB_CSR, s, OP_ARRAY_INTO, KA_LPL, KT_O, 0, "o|last_page_len", INV, "last_page_len inside o");
        kop(EXPECT_ERROR, KB_CSR, s, OP_ARRAY_INTO, KA_SSQ, KT_LSE, 0, "lse|seqstart_q", INV, "seqstart_q inside lse");
        kop(EXPECT_ERROR, KB_BT, s, OP_ARRAY_INTO, KA_BT, KT_O, 0, "o|block_table", INV, "block_table inside o");
        kop(EXPECT_ERROR, KB_BT, s, OP_ARRAY_INTO, KA_SEQLEN_K, KT_LSE, 0, "lse|seqlen_k", INV, "seqlen_k inside lse");
        kop(EXPECT_ERROR, KB_CONTIG, s, OP_ARRAY_INTO, KA_CBI, KT_O, 0, "o|cache_batch_idx", INV, "cache_batch_idx inside o");
        kop(EXPECT_ERROR, KB_FP8, s, OP_OVERLAP, KT_QDS, KT_LSE, 0, "lse|q_descale", INV, "q_descale.data = lse.data");
        kop(EXPECT_ERROR, KB_FP8, s, OP_OVERLAP, KT_VDS, KT_O, 0, "o|v_descale", INV, "v_descale.data = o.data");
        KA(KB_CSR, s, o.row_stride, 0, "o", INV);
        KA(KB_CSR, s, o.head_stride, 8, "o", INV);
        /* tables */
        for (t = KA_SSQ; t <= KA_CBI; ++t) {
            int base = t == KA_SSQ || t == KA_INDPTR || t == KA_PIDX || t == KA_LPL ? KB_CSR : t == KA_CBI ? KB_CONTIG : KB_BT;
            if (t == KA_CBI) continue; /* optional: NULL is valid (below) */
            snprintf(desc, sizeof desc, "%s = NULL", kv_array_names[t]);
            kop(EXPECT_ERROR, base, s, OP_ARRAY_NULL, t, 0, 0, kv_array_names[t], 0, desc);
        }
        for (t = KA_SSQ; t <= KA_CBI; ++t) {
            int base = t == KA_SSQ || t == KA_INDPTR || t == KA_PIDX || t == KA_LPL ? KB_CSR : t == KA_CBI ? KB_CONTIG : KB_BT;
            snprintf(desc, sizeof desc, "%s + 2 bytes (misaligned int32)", kv_array_names[t]);
            kop(EXPECT_ERROR, base, s, OP_ARRAY_MISALIGN, t, 0, 0, kv_array_names[t], INV, desc);
        }
        kop(EXPECT_ERROR, KB_BT, s, OP_BATCH_SSQ, 0, 0, 0, "seqstart_q", 0, "batch mode with seqstart_q set (NULL in batch mode)");
        /* descales */
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_QDS, KT_LSE, 0, "q_descale", 0, "bf16 with q_descale.data set");
        kop(EXPECT_ERROR, KB_CSR, s, OP_OVERLAP, KT_KDS, KT_LSE, 0, "k_descale", 0, "bf16 with k_descale.data set");
        KA(KB_FP8, s, q_descale.page_stride, 1, "q_descale", 0);
        KA(KB_FP8, s, k_descale.batch_stride, 1, "k_descale", 0);
        KA(KB_FP8, s, v_descale.batch_stride, 2, "v_descale", 0);
        KA(KB_FP8, s, k_descale.head_stride, -2, "k_descale", INV);
        KA(KB_FP8, s, v_descale.page_stride, -2, "v_descale", INV);
        KA(KB_FP8, s, q_descale.batch_stride, (int64_t)1 << 62, "q_descale", INV);
        kop(EXPECT_ERROR, KB_FP8, s, OP_DATA_MISALIGN, KT_KDS, 0, 0, "k_descale", INV, "k_descale.data misaligned");
        kop(EXPECT_ERROR, KB_FP8, s, OP_DATA_WRAP, KT_VDS, 0, 0, "v_descale", INV, "v_descale.data = 2^64 - 16");
    }
    /* lse given although has_lse = 0 ("data NULL unless traits.has_lse") */
    for (k = 0; k < 3; k += 2)
        kop(EXPECT_ERROR, KB_CSR, stages_args[k], OP_FIELD, 0, 0, 0, "lse|has_lse", 0, "has_lse 0, lse.data set")->flags |= K_NO_LSE;
    /* workspace */
    KA(KB_CSR, KS_PREPARE, workspace_size, 16, "workspace_size|workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL));
    KA(KB_CSR, KS_RUN, workspace_size, 16, "workspace_size|workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL));
    KA(KB_SPLIT, KS_RUN, workspace_size, 16, "workspace_size|workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL));
    KA(KB_SPLIT, KS_FWD, workspace_size, 16, "workspace_size|workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL));
    kop(EXPECT_ERROR, KB_CSR, KS_PREPARE, OP_WS, 0, 0, 0, "workspace", 0, "workspace = NULL");
    kop(EXPECT_ERROR, KB_SPLIT, KS_RUN, OP_WS, 0, 0, 0, "workspace", 0, "a splitting launcher's run without a workspace");
    kop(EXPECT_ERROR, KB_CSR, KS_PREPARE, OP_WS, 1, 0, 0, "workspace", INV, "workspace + 8 bytes (not 16-byte aligned)");
    kop(EXPECT_ERROR, KB_SPLIT, KS_RUN, OP_WS, 1, 0, 0, "workspace", INV, "workspace + 8 bytes (not 16-byte aligned)");
    kop(EXPECT_ERROR, KB_CSR, KS_CHECK, OP_WS, 1, 0, 0, "workspace", INV, "workspace + 8 bytes (not 16-byte aligned)");
    kop(EXPECT_ERROR, KB_CSR, KS_CHECK, OP_WS, 0, 0, 0, "workspace", 0, "workspace = NULL");
    kop(EXPECT_ERROR, KB_CSR, KS_CHECK, OP_WS, 2, 0, 0, "workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_NOT_PREPARED),
        "a workspace never prepared (zeros)");
    kop(EXPECT_ERROR, KB_CSR, KS_CHECK, OP_WS, 3, 0, 0, "workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_NOT_PREPARED),
        "a workspace never prepared (random bytes)");
    kop(EXPECT_ERROR, KB_CSR, KS_CHECK, OP_WS, 4, 0, 0, "workspace_size|workspace", STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL),
        "check with workspace_size 16");

    /* ---- device values: recorded by the prepare (check: ASYNC_FAILURE) and failing the host run ---- */
    {
        static const struct {
            int base, array, index, entry;
            const char *fields;
        } dv[] = {
            {KB_CSR, KA_PIDX, 3, 6, "page_indices"},        /* = num_pages */
            {KB_CSR, KA_PIDX, 0, -1, "page_indices"},
            {KB_CSR, KA_PIDX, 2, INT32_MIN, "page_indices"},
            {KB_CSR, KA_INDPTR, 1, -1, "kv_indptr"},        /* decreasing */
            {KB_CSR, KA_INDPTR, 2, 5, "kv_indptr|num_page_indices"}, /* past page_indices */
            {KB_CSR, KA_INDPTR, 1, 3, "kv_indptr|traits.max_seqlen_k"},      /* sequence 0: 11 tokens > 8 */
            {KB_CSR, KA_LPL, 0, 0, "last_page_len"},
            {KB_CSR, KA_LPL, 1, 5, "last_page_len"},        /* > page_size */
            {KB_CSR, KA_LPL, 0, -1, "last_page_len"},
            {KB_CSR, KA_LPL, 1, INT32_MAX, "last_page_len"},
            {KB_CSR, KA_SSQ, 1, -1, "seqstart_q"},
            {KB_CSR, KA_SSQ, 2, 6, "seqstart_q"},           /* past the rows of q */
            {KB_CSR, KA_SSQ, 1, 0, "seqstart_q|traits.max_seqlen_q"}, /* sequence 1: 5 rows > 3 */
            {KB_FP8, KA_PIDX, 1, 6, "page_indices"},
            {KB_BT, KA_SEQLEN_K, 0, -1, "seqlen_k"},
            {KB_BT, KA_SEQLEN_K, 1, INT32_MIN, "seqlen_k"},
            {KB_BT, KA_SEQLEN_K, 0, 13, "seqlen_k|traits.max_seqlen_k|max_pages_per_seq"}, /* > 3 pages of 4 */
            {KB_BT, KA_SEQLEN_K, 1, 8, "seqlen_k|traits.max_seqlen_k"},
            {KB_BT, KA_BT, 1, 5, "block_table"},            /* = num_pages */
            {KB_BT, KA_BT, 4, -1, "block_table"},
            {KB_SPLIT, KA_BT, 19 + 16, 40, "block_table"},
            {KB_SPLIT, KA_SEQLEN_K, 0, 305, "seqlen_k|traits.max_seqlen_k"},
            {KB_CONTIG, KA_CBI, 0, 3, "cache_batch_idx"},   /* = num_pages (slots) */
            {KB_CONTIG, KA_CBI, 1, -1, "cache_batch_idx"},
            {KB_CONTIG, KA_SEQLEN_K, 0, 17, "seqlen_k|page_size|traits.max_seqlen_k"}, /* > the slot capacity */
            {KB_CONTIG, KA_SEQLEN_K, 1, -5, "seqlen_k"},
        };
        for (i = 0; i < sizeof dv / sizeof dv[0]; ++i) {
            snprintf(desc, sizeof desc, "device %s[%d] = %d", kv_array_names[dv[i].array], dv[i].index, dv[i].entry);
            kop(EXPECT_ERROR, dv[i].base, KS_CHECK, OP_ARRAY, dv[i].array, dv[i].index, dv[i].entry, dv[i].fields, ASYNC, desc);
            kop(EXPECT_ERROR, dv[i].base, KS_SYNC, OP_ARRAY, dv[i].array, dv[i].index, dv[i].entry, dv[i].fields, 0, desc)->flags |= K_NO_CHECK;
            if (i % 3 == 0)
                kop(EXPECT_ERROR, dv[i].base, KS_FWD, OP_ARRAY, dv[i].array, dv[i].index, dv[i].entry, dv[i].fields, 0, desc);
        }
        /* without check_tables the prepare does not look at page ids: the run finds them */
        kop(EXPECT_ERROR, KB_CSR, KS_SYNC, OP_ARRAY, KA_PIDX, 3, -2, "page_indices", 0, "check_tables 0: device page_indices[3] = -2")->flags |=
            K_NO_TABLES;
        kop(EXPECT_ERROR, KB_BT, KS_SYNC, OP_ARRAY, KA_BT, 0, 99, "block_table", 0, "check_tables 0: device block_table[0] = 99")->flags |=
            K_NO_TABLES;
    }

    /* ---- valid calls whose results are checked ---- */
    {
        static const int bases[] = {KB_CSR, KB_BT, KB_CONTIG, KB_FP8, KB_SPLIT};
        for (i = 0; i < 5; ++i) {
            kop(EXPECT_OK, bases[i], KS_SYNC, OP_VALID, 0, 0, 0, "", 0, "valid: the launcher chain");
            kop(EXPECT_OK, bases[i], KS_FWD, OP_VALID, 0, 0, 0, "", 0, "valid: fmha_kvcache_fwd with a workspace");
        }
        kop(EXPECT_OK, KB_CSR, KS_FWD, OP_WS, 0, 0, 0, "", 0, "valid: fmha_kvcache_fwd without a workspace (unsplit)");
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_WS, 0, 0, 0, "", 0, "valid: an unsplit launcher's run without a workspace")->flags |= K_NO_CHECK;
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_WS, 2, 0, 0, "", 0, "valid: a run with a workspace no prepare wrote (zeros)")->flags |= K_NO_CHECK;
        kop(EXPECT_OK, KB_SPLIT, KS_SYNC, OP_WS, 2, 0, 0, "", 0, "valid: a splitting run with a workspace no prepare wrote (zeros)")->flags |=
            K_NO_CHECK;
        kop(EXPECT_OK, KB_SPLIT, KS_SYNC, OP_WS, 3, 0, 0, "", 0, "valid: a splitting run with a workspace no prepare wrote (random bytes)")
            ->flags |= K_NO_CHECK;
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_VALID, 1, 0, 0, "", 0, "valid: HND pools");
        kop(EXPECT_OK, KB_BT, KS_SYNC, OP_VALID, 1, 0, 0, "", 0, "valid: NHD pools");
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_VALID, 2, 0, 0, "", 0, "valid: page_size 1, last_page_len NULL");
        kop(EXPECT_OK, KB_BT, KS_SYNC, OP_VALID, 3, 0, 0, "", 0, "valid: one page per sequence (page_size = max_seqlen_k: dense)");
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_VALID, 4, 0, 0, "",
            0, "valid: an empty sequence (kv_indptr equal) with a garbage last_page_len: o = 0, lse = -inf");
        kop(EXPECT_OK, KB_CONTIG, KS_SYNC, OP_VALID, 5, 0, 0, "", 0, "valid: cache_batch_idx NULL (slot b)");
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_VALID, 6, 0, 0, "", 0, "valid: args.batch 1 < traits.batch 2");
        kop(EXPECT_OK, KB_BT, KS_SYNC, OP_VALID, 7, 0, 0, "", 0, "valid: window_size_left 2 (bottom-right sliding window)");
        kop(EXPECT_OK, KB_FP8, KS_SYNC, OP_VALID, 8, 0, 0, "", 0, "valid: fp8 with k_descale.data NULL (descale 1)");
        kop(EXPECT_OK, KB_CSR, KS_SYNC, OP_VALID, 9, 0, 0, "", 0, "valid: has_lse 0 with lse NULL");
    }

    /* ---- merge ---- */
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_NULL_ARGS, 0, 0, 0, "args", NULLP, "NULL args");
    KM(struct_size, 0, "struct_size|args", INV);
    for (i = 0; i < 3; ++i) KM(struct_size, (int64_t)sizeof(fmha_merge_args) + deltas[i], "struct_size|args", INV);
    KM(struct_size, (int64_t)1 << 40, "struct_size|args", INV);
    KM(num_states, -1, "num_states", INV);
    KM(num_states, INT32_MIN, "num_states", INV);
    KM(num_rows, -1, "num_rows", INV);
    KM(nhead, -1, "nhead", INV);
    KM(hdim, 0, "hdim", INV);
    KM(hdim, -16, "hdim", INV);
    KM(in_dtype, FMHA_DTYPE_FP8_E4M3FN, "in_dtype", INV);
    KM(in_dtype, FMHA_DTYPE_FP8_E4M3FNUZ, "in_dtype", INV);
    KM(in_dtype, -1, "in_dtype", INV);
    KM(in_dtype, 99, "in_dtype", INV);
    KM(out_dtype, FMHA_DTYPE_FP8_E4M3FN, "out_dtype", INV);
    KM(out_dtype, -1, "out_dtype", INV);
    KM(lse_base, 2, "lse_base", INV);
    KM(lse_base, -1, "lse_base", INV);
    KM(lse_base, INT32_MAX, "lse_base", INV);
    for (t = KT_O_IN; t <= KT_LSE_OUT; ++t) {
        if (t != KT_LSE_OUT) {
            snprintf(desc, sizeof desc, "%s.data = NULL", kv_tensor_names[t]);
            kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_DATA_NULL, t, 0, 0, kv_tensor_names[t], NULLP, desc);
        }
        snprintf(desc, sizeof desc, "%s.data misaligned", kv_tensor_names[t]);
        kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_DATA_MISALIGN, t, 0, 0, kv_tensor_names[t], INV, desc);
        snprintf(desc, sizeof desc, "%s.data = 2^64 - 16 (the extent wraps)", kv_tensor_names[t]);
        kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_DATA_WRAP, t, 0, 0, kv_tensor_names[t], INV, desc);
        for (i = 0; i < 3; ++i) {
            size_t off = tensor_offset(t) + offsetof(fmha_tensor, batch_stride) + 8 * i;
            if (i == 0 && t >= KT_O_OUT) continue; /* unused */
            snprintf(desc, sizeof desc, "%s.%s", kv_tensor_names[t], strides[i]);
            kmut(KB_MERGE, KS_MERGE, KT_MERGE, off, 8, -1, kv_tensor_names[t], desc, INV);
            kmut(KB_MERGE, KS_MERGE, KT_MERGE, off, 8, (int64_t)1 << 62, kv_tensor_names[t], desc, INV);
        }
    }
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_O_OUT, KT_O_IN, 1, "o_out|o_in", INV, "o_out = state 1 of o_in");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_LSE_OUT, KT_LSE_IN, 2, "lse_out|lse_in", INV, "lse_out = state 2 of lse_in");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_LSE_OUT, KT_O_OUT, 0, "lse_out|o_out", INV, "lse_out.data = o_out.data");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_O_OUT, KT_LSE_IN, 0, "o_out|lse_in", INV, "o_out.data = lse_in.data");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_LSE_OUT, KT_O_IN, 3, "lse_out|o_in", INV, "lse_out inside state 2 of o_in");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_O_OUT, KT_O_IN, 4, "o_out|o_in", INV,
        "o_out = state 0 of o_in but out_dtype fp32 (in place needs the same type)");
    kop(EXPECT_ERROR, KB_MERGE, KS_MERGE, OP_OVERLAP, KT_O_OUT, KT_O_IN, 5, "o_out|o_in", INV,
        "o_out = state 0 of o_in with another row stride");
    KM(o_out.row_stride, 8, "o_out", INV);
    KM(lse_out.row_stride, 0, "lse_out", INV);
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 0, 0, 0, "", 0, "valid: 3 states");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 1, 0, 0, "", 0, "valid: one state (the merge is that state)");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 2, 0, 0, "", 0, "valid: in place (o_out, lse_out = state 0)");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 3, 0, 0, "", 0, "valid: base-2 LSEs");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 4, 0, 0, "", 0, "valid: empty states (LSE -inf and +inf) and an all-empty row");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 5, 0, 0, "", 0, "valid: num_states 0, o_in and lse_in NULL: o = 0, lse = -inf");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 6, 0, 0, "", 0, "valid: lse_out NULL (not written)");
    kop(EXPECT_OK, KB_MERGE, KS_MERGE, OP_VALID, 7, 0, 0, "", 0, "valid: num_rows 0 with every pointer NULL");
}

/* ---- running a case ------------------------------------------------------------------------------ */

typedef struct {
    kv s;
    const kvcase *c;
    case_record *rec;
    uint64_t rng;
    int judged;
} kv_run;

static void k_judged(kv_run *r, const char *call, fmha_status st) {
    r->judged = 1;
    r->rec->status = st;
    last_message(r->rec->message, sizeof r->rec->message);
    appendf(r->rec->note, sizeof r->rec->note, "judged: %s; ", call);
    r->rec->phase = 1;
    report(r->rec);
}

/* One call of the chain: judged if it is the case's stage, else it must succeed. Returns 1 to go on. */
static int k_step(kv_run *r, int stage, const char *call, fmha_status st) {
    char msg[600];
    if (stage == r->c->stage) {
        k_judged(r, call, st);
        return st == FMHA_OK && r->c->expect != EXPECT_ERROR;
    }
    if (st == FMHA_OK) return 1;
    last_message(msg, sizeof msg);
    appendf(r->rec->note, sizeof r->rec->note, "valid step %s failed: %s (%d): %s; ", call, fmha_status_string(st), (int)st, msg);
    r->rec->correct = 0;
    return 0;
}

static void *tensor_field(kv_run *r, int t) {
    unsigned char *base = t >= KT_O_IN ? (unsigned char *)r->s.m : (unsigned char *)r->s.a;
    return base + tensor_offset(t);
}

static void *tensor_data(kv_run *r, int t) {
    void *p;
    memcpy(&p, tensor_field(r, t), sizeof p);
    return p;
}

static void set_tensor_data(kv_run *r, int t, uintptr_t data) {
    void *p = (void *)data;
    memcpy(tensor_field(r, t), &p, sizeof p);
}

static const int32_t **array_field(kv_run *r, int i) {
    fmha_kvcache_args *a = r->s.a;
    switch (i) {
    case KA_SSQ: return &a->seqstart_q;
    case KA_SEQLEN_K: return &a->seqlen_k;
    case KA_BT: return &a->block_table;
    case KA_INDPTR: return &a->kv_indptr;
    case KA_PIDX: return &a->page_indices;
    case KA_LPL: return &a->last_page_len;
    default: return &a->cache_batch_idx;
    }
}

/* The handles the judged call gets, after the case's op. */
typedef struct {
    const fmha_kvcache_traits *traits;
    const fmha_kvcache_args *args;
    fmha_kvcache_launcher *launcher;
    fmha_kvcache_launcher **out_launcher;
    size_t *out_bytes;
    void *ws;
    size_t ws_size;
} kv_call;

static fmha_kvcache_launcher *destroyed_launcher(kv_run *r) {
    fmha_kvcache_launcher *l = NULL;
    if (fmha_kvcache_launcher_create(r->s.t, &l) != FMHA_OK) return NULL;
    fmha_kvcache_launcher_destroy(l);
    return l;
}

static fmha_kvcache_launcher *foreign_launcher(void) {
    /* a valid backward launcher: batch 1, 8/8 rows, 1 head, d 16 */
    fmha_bwd_traits t;
    fmha_bwd_launcher *l = NULL;
    memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.seqlen_q = t.seqlen_k = 8;
    t.batch = 1;
    t.hdim_q = t.hdim_v = 16;
    t.nhead_q = t.nhead_k = 1;
    t.dtype = FMHA_DTYPE_BF16;
    if (fmha_bwd_launcher_create(&t, &l) != FMHA_OK) return NULL;
    return (fmha_kvcache_launcher *)l;
}

/* The case's change, right before its judged call. */
static void apply(kv_run *r, kv_call *k) {
    const kvcase *c = r->c;
    kv *s = &r->s;
    switch (c->op) {
    case OP_FIELD: {
        unsigned char *base = c->target == KT_TRAITS ? (unsigned char *)s->t : c->target == KT_ARGS ? (unsigned char *)s->a
                                                                                                     : (unsigned char *)s->m;
        if (c->width == 4) {
            int32_t v = (int32_t)c->value;
            memcpy(base + c->offset, &v, 4);
        } else if (c->width == 8) {
            memcpy(base + c->offset, &c->value, 8);
        }
        break;
    }
    case OP_NULL_TRAITS: k->traits = NULL; break;
    case OP_NULL_ARGS: k->args = NULL; break;
    case OP_NULL_OUT: k->out_launcher = NULL, k->out_bytes = NULL; break;
    case OP_NULL_LAUNCHER: k->launcher = NULL; break;
    case OP_DESTROYED: k->launcher = destroyed_launcher(r); break;
    case OP_GARBAGE: k->launcher = (fmha_kvcache_launcher *)(uintptr_t)0x5eed5eed0ull; break;
    case OP_FOREIGN: k->launcher = foreign_launcher(); break;
    case OP_DATA_NULL: set_tensor_data(r, (int)c->value, 0); break;
    case OP_DATA_MISALIGN: {
        int four = c->value == KT_LSE || c->value == KT_LSE_IN || c->value == KT_LSE_OUT || c->value >= KT_QDS;
        set_tensor_data(r, (int)c->value, (uintptr_t)tensor_data(r, (int)c->value) + (four && c->value != KT_O_IN && c->value != KT_O_OUT ? 2 : 1));
        break;
    }
    case OP_DATA_WRAP: set_tensor_data(r, (int)c->value, UINTPTR_MAX - 15); break;
    case OP_ARRAY: {
        int32_t *p = (int32_t *)(uintptr_t)*array_field(r, (int)c->value);
        p[c->index] = c->entry;
        break;
    }
    case OP_ARRAY_NULL: *array_field(r, (int)c->value) = NULL; break;
    case OP_ARRAY_MISALIGN: {
        const int32_t **f = array_field(r, (int)c->value);
        *f = (const int32_t *)(uintptr_t)((uintptr_t)*f + 2);
        break;
    }
    case OP_ARRAY_INTO: *array_field(r, (int)c->value) = tensor_data(r, c->index); break;
    case OP_OVERLAP: {
        fmha_merge_args *m = s->m;
        switch (c->entry) {
        case 1: m->o_out.data = s->o_in + 2 * (size_t)m->o_in.batch_stride; break;
        case 2: m->lse_out.data = s->lse_in + 2 * (size_t)m->lse_in.batch_stride; break;
        case 3: m->lse_out.data = s->o_in + 2 * 2 * (size_t)m->o_in.batch_stride; break;
        case 4:
            m->o_out.data = s->o_in;
            m->out_dtype = FMHA_DTYPE_FP32;
            break;
        case 5:
            m->o_out = m->o_in;
            m->o_out.row_stride = 2 * MD;
            m->o_out.head_stride = MR * MD;
            break;
        default: set_tensor_data(r, (int)c->value, (uintptr_t)tensor_data(r, c->index)); break;
        }
        break;
    }
    case OP_WS:
        switch (c->value) {
        case 0: k->ws = NULL, k->ws_size = 0; break;
        case 1: k->ws = (unsigned char *)k->ws + 8, k->ws_size -= 8; break;
        case 2: memset(k->ws, 0, k->ws_size); break;
        case 3: {
            size_t i;
            for (i = 0; i < k->ws_size; ++i) ((unsigned char *)k->ws)[i] = (unsigned char)rng_next(&r->rng);
            break;
        }
        default: k->ws_size = 16; break;
        }
        s->a->workspace = k->ws;
        s->a->workspace_size = k->ws_size;
        break;
    case OP_SCALE: s->a->scale = c->value == 0 ? NAN : INFINITY; break;
    case OP_BATCH_SSQ: s->a->seqstart_q = s->ssq; break;
    default: break;
    }
}

/* Valid variants (OP_VALID) before allocation. */
static void kv_variant_shape(kv_run *r) {
    kv *s = &r->s;
    int j;
    if (r->c->op != OP_VALID) return;
    switch (r->c->value) {
    case 1: s->hnd = !s->hnd; break;
    case 2: /* page 1: 15 pages in a shuffled order, one spare */
        s->page = 1;
        s->num_pages = 16;
        for (j = 0; j < 7; ++j) s->pages[0][j] = 15 - 2 * j;
        for (j = 0; j < 8; ++j) s->pages[1][j] = (2 * j + 2) % 16;
        break;
    case 3:
        s->page = 8;
        s->pages[0][0] = 2, s->pages[1][0] = 0;
        break;
    case 4: s->lens_k[0] = 0; s->pages[1][0] = 3; break;
    case 5: s->pages[0][0] = 0, s->pages[1][0] = 1; break;
    case 7: s->wl = 2; break;
    default: break;
    }
}

/* Valid variants after allocation. */
static void kv_variant_args(kv_run *r) {
    kv *s = &r->s;
    if (r->c->op != OP_VALID) return;
    switch (r->c->value) {
    case 2: s->a->last_page_len = NULL; break;
    case 4: s->lpl[0] = -7; break; /* not read: the sequence has no page */
    case 5: s->a->cache_batch_idx = NULL; break;
    case 6: s->a->batch = 1, s->batch = 1; break;
    case 8: s->a->k_descale.data = NULL, s->k_ds_one = 1; break;
    case 9:
        s->t->has_lse = 0;
        s->a->lse = (fmha_tensor){NULL, 0, 0, 0};
        s->no_lse = 1;
        break;
    default: break;
    }
}

static void kv_results(kv_run *r) {
    if (r->c->expect == EXPECT_ERROR || r->rec->forbidden == 1 || r->rec->status != FMHA_OK || r->rec->correct == 0) return;
    r->rec->correct = kv_check(&r->s, r->rec->note, sizeof r->rec->note);
}

/* The calls of a case whose call r->s describes. */
static void kv_calls(kv_run *r) {
    kv *s = &r->s;
    const kvcase *c = r->c;
    kv_call k;
    fmha_status st;
    fmha_stream_t stream = NULL;
    size_t bytes = 0;
    memset(&k, 0, sizeof k);
    k.traits = s->t;
    k.args = s->a;
    k.out_bytes = &bytes;

    if (c->stage == KS_UPPER || c->stage == KS_FWD) {
        if (c->stage == KS_UPPER) apply(r, &k);
        st = fmha_kvcache_workspace_size_upper_bound(k.traits, k.out_bytes);
        if (!k_step(r, KS_UPPER, "fmha_kvcache_workspace_size_upper_bound", st)) return;
        k.ws = gp_alloc(bytes, 16, "workspace");
        k.ws_size = bytes;
        s->a->workspace = k.ws;
        s->a->workspace_size = bytes;
        apply(r, &k);
        st = fmha_kvcache_fwd(k.traits, k.args, stream);
        if (st == FMHA_OK) st = fmha_stream_synchronize(stream);
        if (k_step(r, KS_FWD, "fmha_kvcache_fwd + synchronize", st)) kv_results(r);
        return;
    }
    k.out_launcher = &s->launcher;
    if (c->stage == KS_CREATE) apply(r, &k);
    st = fmha_kvcache_launcher_create(k.traits, k.out_launcher);
    if (!k_step(r, KS_CREATE, "fmha_kvcache_launcher_create", st)) return;
    k.launcher = s->launcher;
    if (c->stage == KS_HANDLE) {
        fmha_kvcache_launcher *l = s->launcher;
        if (c->op == OP_DOUBLE_DESTROY) fmha_kvcache_launcher_destroy(l);
        else apply(r, &k), l = k.launcher;
        k_judged(r, "fmha_kvcache_launcher_destroy", fmha_kvcache_launcher_destroy(l));
        if (c->op != OP_DOUBLE_DESTROY) fmha_kvcache_launcher_destroy(s->launcher);
        return;
    }
    if (c->stage == KS_SIZE) apply(r, &k);
    st = fmha_kvcache_launcher_workspace_size(k.launcher, k.out_bytes);
    if (!k_step(r, KS_SIZE, "fmha_kvcache_launcher_workspace_size", st)) goto out;
    k.launcher = s->launcher;
    k.ws = s->ws = gp_alloc(bytes, 16, "workspace");
    k.ws_size = s->ws_size = bytes;
    s->a->workspace = k.ws;
    s->a->workspace_size = bytes;
    /* device values are read when the stream runs the prepare: changed before it is queued */
    if (c->stage == KS_PREPARE || c->op == OP_ARRAY) apply(r, &k);
    if (!(c->op == OP_WS && (c->value == 2 || c->value == 3))) { /* those use a workspace no prepare wrote */
        st = fmha_kvcache_launcher_prepare_async(k.launcher, k.args, stream);
        if (!k_step(r, KS_PREPARE, "fmha_kvcache_launcher_prepare_async", st)) goto out;
    }
    k.launcher = s->launcher;
    k.args = s->a;
    if (!(c->flags & K_NO_CHECK)) {
        if (c->stage == KS_CHECK && c->op != OP_ARRAY) apply(r, &k);
        st = fmha_kvcache_launcher_check(k.launcher, k.ws, k.ws_size, stream);
        if (!k_step(r, KS_CHECK, "fmha_kvcache_launcher_check", st)) goto out;
    }
    k.launcher = s->launcher;
    if ((c->stage == KS_RUN || c->stage == KS_SYNC) && c->op != OP_ARRAY) apply(r, &k);
    st = fmha_kvcache_launcher_run(k.launcher, k.args, stream);
    if (c->stage == KS_RUN && !k_step(r, KS_RUN, "fmha_kvcache_launcher_run", st)) {
        fmha_device_synchronize();
        goto out;
    }
    /* device values are the run's to find: its status or the synchronize's */
    if (st == FMHA_OK) st = fmha_stream_synchronize(stream);
    if (!k_step(r, KS_SYNC, "fmha_kvcache_launcher_run + synchronize", st)) goto out;
    kv_results(r);
out:
    st = fmha_kvcache_launcher_destroy(s->launcher);
    if (st != FMHA_OK) appendf(r->rec->note, sizeof r->rec->note, "destroy of the case's launcher: %d; ", (int)st);
}

static void merge_chain(kv_run *r) {
    kv *s = &r->s;
    const kvcase *c = r->c;
    fmha_merge_args *m;
    const fmha_merge_args *arg;
    unsigned char o0[MH * MR * MD * 2];
    float l0[MH * MR];
    const unsigned char *saved_o = NULL;
    const float *saved_l = NULL;
    fmha_status st;
    int h, row;
    merge_alloc(s, c->op == OP_VALID && c->value == 1 ? 1 : MS, &r->rng);
    m = s->m;
    arg = m;
    if (c->op == OP_VALID) {
        switch (c->value) {
        case 2: /* in place: state 0 is the output */
            memcpy(o0, s->o_in, sizeof o0);
            memcpy(l0, s->lse_in, sizeof l0);
            saved_o = o0, saved_l = l0;
            m->o_out = m->o_in;
            m->lse_out = m->lse_in;
            s->o_out = s->o_in;
            s->lse_out = s->lse_in;
            break;
        case 3: m->lse_base = FMHA_LSE_BASE2; break;
        case 4: /* row 0 of head 0: states 0 and 2 empty; row 1 of head 1: every state empty */
            s->lse_in[0] = -INFINITY;
            s->lse_in[2 * MH * MR] = INFINITY;
            for (h = 0; h < MS; ++h) s->lse_in[(size_t)h * MH * MR + MR + 1] = h == 1 ? INFINITY : -INFINITY;
            break;
        case 5:
            m->num_states = 0;
            m->o_in.data = NULL;
            m->lse_in.data = NULL;
            break;
        case 6: m->lse_out.data = NULL; break;
        case 7:
            m->num_rows = 0;
            m->o_in.data = m->lse_in.data = m->o_out.data = m->lse_out.data = NULL;
            break;
        default: break;
        }
    } else if (c->op == OP_NULL_ARGS) {
        arg = NULL;
    } else {
        kv_call k;
        memset(&k, 0, sizeof k);
        apply(r, &k);
    }
    st = fmha_merge_attention_states(arg, NULL);
    if (st == FMHA_OK) st = fmha_stream_synchronize(NULL);
    k_judged(r, "fmha_merge_attention_states + synchronize", st);
    if (c->expect != EXPECT_OK || st != FMHA_OK) return;
    if (m->num_rows == 0) {
        /* no rows: nothing to compare */
        r->rec->correct = 1;
        return;
    }
    if (m->lse_out.data == NULL) {
        /* not written: must keep its NaN poison */
        for (h = 0; h < MH; ++h)
            for (row = 0; row < MR; ++row)
                if (!isnan(s->lse_out[h * MR + row])) {
                    appendf(r->rec->note, sizeof r->rec->note, "lse_out written although its data was NULL; ");
                    r->rec->correct = 0;
                    return;
                }
    }
    r->rec->correct = merge_check(s, saved_o, saved_l, m->lse_out.data != NULL, r->rec->note, sizeof r->rec->note);
}

static void kv_chain(kv_run *r) {
    kv *s = &r->s;
    kv_default(s, r->c->base);
    kv_variant_shape(r);
    kv_alloc(s, &r->rng);
    kv_variant_args(r);
    if (r->c->flags & K_NO_TABLES) s->t->check_tables = 0;
    if (r->c->flags & K_NO_LSE) s->t->has_lse = 0;
    if (s->base == KB_SPLIT && fmha_host_set_cu_count(64) != FMHA_OK) appendf(r->rec->note, sizeof r->rec->note, "set_cu_count failed; ");
    kv_calls(r);
}

/* ---- random kv-cache calls ----------------------------------------------------------------------- */

/* A random valid call: table kind, mode, page size, GQA, layout, mask and window, bf16 or fp8 (per-page
 * or per-tensor descales), split bounds and the CU count; pages drawn from a shuffled pool with spares,
 * unused block-table entries garbage. */
static void kv_random_shape(kv *s, uint64_t *rng) {
    static const int pages[] = {1, 2, 3, 4, 8, 16};
    static const int heads[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {4, 1}};
    int order[MAXB * MAXP + 8], n = 0, b, j, i, max_k = 0;
    const int *h = heads[rng_int(rng, 0, 4)];
    memset(s, 0, sizeof *s);
    s->base = -1;
    s->kind = rng_int(rng, FMHA_KV_CONTIGUOUS, FMHA_KV_PAGE_CSR);
    s->group = rng_int(rng, 0, 1);
    s->dtype = rng_chance(rng, 25) ? FMHA_DTYPE_FP8_E4M3FN : FMHA_DTYPE_BF16;
    s->page_scale = s->dtype != FMHA_DTYPE_BF16 && s->kind != FMHA_KV_CONTIGUOUS && rng_chance(rng, 50);
    s->hnd = rng_int(rng, 0, 1);
    s->mask = rng_chance(rng, 30) ? FMHA_MASK_NONE : FMHA_MASK_BOTTOM_RIGHT;
    s->wl = s->mask == FMHA_MASK_NONE || rng_chance(rng, 60) ? -1 : rng_int(rng, 0, 6);
    s->wr = s->mask == FMHA_MASK_NONE ? -1 : rng_chance(rng, 70) ? 0 : rng_int(rng, -1, 3);
    s->page = pages[rng_int(rng, 0, 5)];
    s->batch = rng_int(rng, 1, MAXB);
    s->hq = h[0], s->hk = h[1];
    s->d = rng_chance(rng, 50) ? 16 : 32;
    s->sq = rng_int(rng, 0, 4);
    for (b = 0; b < s->batch; ++b) {
        s->lens_q[b] = s->group ? rng_int(rng, 0, 5) : s->sq;
        s->lens_k[b] = rng_int(rng, 0, s->kind == FMHA_KV_CONTIGUOUS ? 40 : s->page * MAXP < 40 ? s->page * MAXP : 40);
        if (s->lens_k[b] > max_k) max_k = s->lens_k[b];
    }
    if (s->kind == FMHA_KV_CONTIGUOUS) {
        s->page = max_k + rng_int(rng, 0, 3); /* the slot capacity, >= 1 */
        if (s->page == 0) s->page = 1;
        s->num_pages = s->batch + rng_int(rng, 0, 2);
    } else {
        for (b = 0; b < s->batch; ++b) n += (s->lens_k[b] + s->page - 1) / s->page;
        s->num_pages = n + rng_int(rng, 1, 3);
    }
    for (i = 0; i < s->num_pages; ++i) order[i] = i;
    for (i = s->num_pages - 1; i > 0; --i) {
        int k = rng_int(rng, 0, i), t = order[i];
        order[i] = order[k], order[k] = t;
    }
    for (b = 0, n = 0; b < s->batch; ++b) {
        int np = s->kind == FMHA_KV_CONTIGUOUS ? 1 : (s->lens_k[b] + s->page - 1) / s->page;
        for (j = 0; j < np; ++j) s->pages[b][j] = order[n++];
        if (np > s->mpps) s->mpps = np;
    }
    if (s->mpps == 0) s->mpps = 1;
    s->bt_stride = s->mpps + rng_int(rng, 0, 2);
}

/* Random cases of fuzz_random.c: a random valid kv-cache call through the launcher or the one-shot
 * call, its results checked; in about half of them one device value of a sequence with query rows and
 * keys is spoiled (a page id of its last page, a negative length, a last_page_len outside the page, a
 * slot past the pool), which the run must refuse. */
void kv_random_run(uint64_t seed, case_record *rec) {
    static kv_run run;
    static kvcase c;
    kv *s = &run.s;
    int b, spoil = -1;
    memset(&run, 0, sizeof run);
    memset(&c, 0, sizeof c);
    run.c = &c;
    run.rec = rec;
    run.rng = seed;
    kv_random_shape(s, &run.rng);
    kv_alloc(s, &run.rng);
    if (s->dtype != FMHA_DTYPE_BF16 && !s->page_scale) {
        /* per-tensor K and V descales */
        s->a->k_descale = (fmha_scale){s->kvds, 0, 0, 0};
        s->a->v_descale = (fmha_scale){s->kvds + 1, 0, 0, 0};
        s->kv_tensor_scale = 1;
    }
    s->t->max_seqlen_k += rng_chance(&run.rng, 30) ? rng_int(&run.rng, 0, 50) : 0;
    s->t->max_splits = rng_chance(&run.rng, 50) ? 0 : rng_int(&run.rng, 1, 8);
    s->t->check_tables = rng_int(&run.rng, 0, 1);
    if (fmha_host_set_cu_count(rng_chance(&run.rng, 50) ? 64 : rng_int(&run.rng, 1, 16)) != FMHA_OK)
        appendf(rec->note, sizeof rec->note, "set_cu_count failed; ");
    c.expect = EXPECT_ANY;
    c.stage = rng_chance(&run.rng, 25) ? KS_FWD : KS_SYNC;
    c.op = OP_VALID;
    /* a device value the run reads: a sequence with query rows and keys */
    for (b = 0; b < s->batch && !fuzz_no_mutate; ++b)
        if (s->lens_q[b] > 0 && s->lens_k[b] > 0 && rng_chance(&run.rng, 33)) spoil = b;
    if (spoil >= 0) {
        int last = s->npages[spoil] - 1;
        c.op = OP_ARRAY;
        c.flags = K_NO_CHECK;
        c.index = spoil;
        if (s->kind == FMHA_KV_CONTIGUOUS) {
            c.value = rng_int(&run.rng, 0, 1) ? KA_CBI : KA_SEQLEN_K;
            c.entry = c.value == KA_CBI ? s->num_pages : -1;
        } else if (s->kind == FMHA_KV_BLOCK_TABLE) {
            c.value = rng_int(&run.rng, 0, 1) ? KA_BT : KA_SEQLEN_K;
            c.index = c.value == KA_BT ? spoil * s->bt_stride + last : spoil;
            c.entry = c.value == KA_BT ? (rng_int(&run.rng, 0, 1) ? s->num_pages : -1) : -1;
        } else if (rng_int(&run.rng, 0, 1)) {
            c.value = KA_PIDX;
            c.index = s->indptr[spoil] + last;
            c.entry = rng_int(&run.rng, 0, 1) ? s->num_pages : INT32_MIN;
        } else {
            c.value = KA_LPL;
            c.entry = rng_int(&run.rng, 0, 1) ? s->page + 1 : 0;
        }
        snprintf(c.fields, sizeof c.fields, "%s", kv_array_names[c.value]);
        rec->forbidden = 1;
    } else {
        rec->forbidden = 0;
    }
    snprintf(rec->desc, sizeof rec->desc, "random kv-cache [%s]: %s %s, page %d, batch %d, heads %d/%d, d %d, %s%s, mask %d (%d, %d)",
             stage_names[c.stage], s->kind == FMHA_KV_CONTIGUOUS ? "contiguous" : s->kind == FMHA_KV_BLOCK_TABLE ? "block table" : "csr",
             s->group ? "group" : "batch", s->page, s->batch, s->hq, s->hk, s->d, s->dtype == FMHA_DTYPE_BF16 ? "bf16" : "fp8",
             s->page_scale ? " per-page" : "", s->mask, s->wl, s->wr);
    appendf(rec->desc, sizeof rec->desc, ", lengths q");
    for (b = 0; b < s->batch; ++b) appendf(rec->desc, sizeof rec->desc, "%s%d", b ? "," : " ", s->lens_q[b]);
    appendf(rec->desc, sizeof rec->desc, " k");
    for (b = 0; b < s->batch; ++b) appendf(rec->desc, sizeof rec->desc, "%s%d", b ? "," : " ", s->lens_k[b]);
    if (spoil >= 0) appendf(rec->desc, sizeof rec->desc, "; device %s[%d] = %d", kv_array_names[c.value], c.index, c.entry);
    snprintf(rec->fields, sizeof rec->fields, "%s", c.fields);
    rec->expect = EXPECT_ANY;
    rec->correct = -1;
    rec->phase = 0;
    report(rec);
    kv_calls(&run);
    if (!run.judged && rec->correct != 0) {
        appendf(rec->note, sizeof rec->note, "the judged call was never made; ");
        rec->correct = 0;
    }
    rec->phase = 2;
    report(rec);
}

/* ---- the interface to fuzz_cases.c --------------------------------------------------------------- */

int kv_case_count(void) {
    build_kv();
    return kvt_size;
}

void kv_case_info(int i, int *expect, uint32_t *statuses, int *sampled, const char **fields, const char **desc) {
    build_kv();
    *expect = kvt[i].expect;
    *statuses = kvt[i].statuses;
    *sampled = (kvt[i].flags & K_SAMPLE) != 0;
    *fields = kvt[i].fields;
    *desc = kvt[i].desc;
}

void kv_case_run(int i, uint64_t rng, case_record *rec) {
    static kv_run run;
    build_kv();
    memset(&run, 0, sizeof run);
    run.c = &kvt[i];
    run.rec = rec;
    run.rng = rng;
    if (run.c->base == KB_MERGE) merge_chain(&run);
    else kv_chain(&run);
    if (!run.judged && rec->correct != 0) {
        appendf(rec->note, sizeof rec->note, "the judged call was never made; ");
        rec->correct = 0;
    }
}

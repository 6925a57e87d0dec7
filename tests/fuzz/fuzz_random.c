/*
 * Random cases: a random valid problem (mode, shapes, GQA, masks and windows, dtype, deterministic,
 * random strides with padding, broadcast and aliasing inputs, packed qkv / dqkv) in guard-paged
 * buffers sized exactly to the tensors, then, in most cases, one or two fields of ONE call set to
 * random or extreme values (a mixture of valid and invalid ones).
 *
 * A cheap classifier decides from the header's rules whether the mutated call is allowed, forbidden
 * or undecided. Mutations that would make an allowed call describe memory outside the buffers (the
 * caller's fault, which no library can detect) are undone, so that any out-of-bounds access is the
 * library's. OK for a forbidden call is a silent accept; a valid unmutated problem must also give
 * correct results.
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { CL_ALLOWED, CL_UNKNOWN, CL_FORBIDDEN, CL_UNSAFE };

typedef struct {
    int level;
    int deferred; /* the deciding reason is the content of device arrays: a later call may report it */
    char field[64];
    char why[160];
} cls;

static void mark(cls *c, int level, const char *field, const char *why) {
    if (level > c->level) {
        c->level = level;
        c->deferred = 0;
        snprintf(c->field, sizeof c->field, "%s", field);
        snprintf(c->why, sizeof c->why, "%s", why);
    }
}

/* A reason found in device arrays (read while the work runs). */
static void mark_dev(cls *c, int level, const char *field, const char *why) {
    int before = c->level;
    mark(c, level, field, why);
    if (c->level > before && level == CL_FORBIDDEN) c->deferred = 1;
}

enum { SR_FWD, SR_CREATE, SR_PREPARE, SR_RUN };

/* int32 arrays the calls may point at (seqstarts, logical lengths) */
typedef struct {
    const int32_t *ptr;
    int len;
} known_array;

typedef struct {
    setup s;
    uint64_t rng;
    int stage;           /* the mutated (and judged) call */
    int mutations;
    char what[300];      /* the mutations, for the description */
    known_array arrays[8];
    int narrays;
    /* backward chain state */
    size_t ws_size, ws_alloc;
    unsigned char *ws;
    int32_t *host_ssq, *host_ssk; /* what prepare gets in group mode (copies) */
    /* prepare call */
    int p_async;
    int32_t p_method;
    void *p_ws;
    size_t p_size;
    const int32_t *p_ssq, *p_ssk;
    int p_null_launcher;
    fmha_stream_t stream;
    int bt_extra_q, bt_extra_k; /* group traits bounds above the call's */
} rctx;

static int array_len(const rctx *r, const int32_t *p) {
    int i;
    for (i = 0; i < r->narrays; ++i)
        if (r->arrays[i].ptr == p) return r->arrays[i].len;
    return -1;
}

static void add_array(rctx *r, const int32_t *p, int len) {
    if (r->narrays < 8) {
        r->arrays[r->narrays].ptr = p;
        r->arrays[r->narrays].len = len;
        r->narrays++;
    }
}

/* ---- tensors ------------------------------------------------------------------------------------- */

typedef struct {
    fmha_tensor t;
    const char *name;
    int64_t heads, rows, cols;
    int eb, output;
    /* after the check */
    int buf;
    uint64_t bytes;
    int checked;
} tview;

static void check_tensor(const rctx *r, int group, int64_t batch, tview *v, cls *c) {
    const setup *s = &r->s;
    char f[64];
    static const char *const stride_names[3] = {"batch_stride", "head_stride", "row_stride"};
    int64_t strides[3];
    int k, b;
    uintptr_t data = (uintptr_t)v->t.data;
    __extension__ typedef __int128 wide;
    wide elems, count;
    strides[0] = v->t.batch_stride;
    strides[1] = v->t.head_stride;
    strides[2] = v->t.row_stride;
    v->checked = 0;
    v->buf = -1;
    for (k = group ? 1 : 0; k < 3; ++k) /* group mode ignores batch_stride: any value is valid */
        if (strides[k] < 0) {
            snprintf(f, sizeof f, "%s.%s", v->name, stride_names[k]);
            mark(c, CL_FORBIDDEN, f, "negative stride");
            return;
        }
    if (batch <= 0 || v->heads <= 0 || v->rows <= 0 || v->cols <= 0) {
        v->bytes = 0;
        return;
    }
    if (data == 0) {
        snprintf(f, sizeof f, "%s.data", v->name);
        mark(c, CL_FORBIDDEN, f, "null data with a non-zero extent");
        return;
    }
    elems = (group ? 0 : (wide)(batch - 1) * strides[0]) + (wide)(v->heads - 1) * strides[1] + (wide)(v->rows - 1) * strides[2] +
            v->cols;
    elems *= v->eb;
    if (elems >= ((wide)1 << 63)) {
        snprintf(f, sizeof f, "%s", v->name);
        mark(c, CL_FORBIDDEN, f, "extent >= 2^63 bytes");
        return;
    }
    if ((wide)data + elems > (wide)UINTPTR_MAX) {
        snprintf(f, sizeof f, "%s.data", v->name);
        mark(c, CL_FORBIDDEN, f, "data + extent wraps the address space");
        return;
    }
    v->bytes = (uint64_t)elems;
    if (data % (uintptr_t)v->eb != 0) {
        snprintf(f, sizeof f, "%s.data|%s", v->name, v->name);
        mark(c, CL_FORBIDDEN, f, "data not aligned to the element size");
        return;
    }
    for (b = 0; b < s->nbuf; ++b) {
        uintptr_t lo = (uintptr_t)s->bufs[b], hi = lo + s->buf_bytes[b];
        if (s->bufs[b] == NULL) continue;
        if (data >= lo && data < hi) break;
    }
    if (b == s->nbuf || data + v->bytes > (uintptr_t)s->bufs[b] + s->buf_bytes[b]) {
        snprintf(f, sizeof f, "%s", v->name);
        mark(c, CL_UNSAFE, f, "outside the buffers");
        return;
    }
    count = (wide)(group ? 1 : batch) * v->heads * v->rows * v->cols;
    if (count > (wide)(4 << 20)) {
        mark(c, CL_UNSAFE, v->name, "too many elements to check");
        return;
    }
    v->buf = b;
    v->checked = 1;
    if (v->output) {
        if ((v->heads > 1 && strides[1] == 0) || (v->rows > 1 && strides[2] == 0) || (!group && batch > 1 && strides[0] == 0)) {
            mark(c, CL_FORBIDDEN, v->name, "an output overlaps itself: zero stride");
            v->checked = 0;
        }
    }
}

/* Outputs overlapping each other or an input (byte maps per buffer). */
static void check_overlaps(const rctx *r, int group, int64_t batch, tview *v, int n, cls *c) {
    const setup *s = &r->s;
    unsigned char *maps[MAX_BUFFERS] = {0};
    int i, pass, b;
    if (c->level >= CL_FORBIDDEN) return;
    for (i = 0; i < n; ++i)
        if (v[i].checked && maps[v[i].buf] == NULL) maps[v[i].buf] = (unsigned char *)calloc(s->buf_bytes[v[i].buf] + 1, 1);
    for (pass = 0; pass < 2 && c->level < CL_FORBIDDEN; ++pass) {
        for (i = 0; i < n && c->level < CL_FORBIDDEN; ++i) {
            const tview *t = &v[i];
            int64_t bb, h, row, col, nb = group ? 1 : batch;
            unsigned char *map;
            if (!t->checked || t->output != (pass == 0)) continue;
            map = maps[t->buf];
            for (bb = 0; bb < nb && c->level < CL_FORBIDDEN; ++bb)
                for (h = 0; h < t->heads && c->level < CL_FORBIDDEN; ++h)
                    for (row = 0; row < t->rows && c->level < CL_FORBIDDEN; ++row)
                        for (col = 0; col < t->cols; ++col) {
                            size_t at = (size_t)((uintptr_t)t->t.data - (uintptr_t)s->bufs[t->buf]) +
                                        (size_t)((bb * t->t.batch_stride + h * t->t.head_stride + row * t->t.row_stride + col) * t->eb);
                            int e;
                            for (e = 0; e < t->eb; ++e) {
                                unsigned char owner = map[at + (size_t)e];
                                if (pass == 0) {
                                    if (owner) {
                                        char f[64];
                                        snprintf(f, sizeof f, "%s|%s", t->name, v[owner - 1].name);
                                        mark(c, CL_FORBIDDEN, f, "outputs overlap");
                                        break;
                                    }
                                    map[at + (size_t)e] = (unsigned char)(i + 1);
                                } else if (owner) {
                                    char f[64];
                                    snprintf(f, sizeof f, "%s|%s", v[owner - 1].name, t->name);
                                    mark(c, CL_FORBIDDEN, f, "an output overlaps an input");
                                    break;
                                }
                            }
                            if (c->level >= CL_FORBIDDEN) break;
                        }
        }
    }
    for (b = 0; b < MAX_BUFFERS; ++b) free(maps[b]);
}

/* ---- shapes -------------------------------------------------------------------------------------- */

static int ok_enum(int32_t v, int n) {
    return v >= 0 && v < n;
}

static void check_common_traits(cls *c, int32_t dtype, int32_t hq, int32_t hv, int32_t group, int32_t mask, int32_t bias) {
    if (!ok_enum(dtype, 2)) mark(c, CL_FORBIDDEN, "dtype", "not a dtype");
    if (hq < 1 || hq > 256) mark(c, CL_FORBIDDEN, "hdim_q", "outside 1..256");
    if (hv < 1 || hv > 256) mark(c, CL_FORBIDDEN, "hdim_v", "outside 1..256");
    if (!ok_enum(group, 2)) mark(c, CL_FORBIDDEN, "is_group_mode", "not 0 or 1");
    if (!ok_enum(mask, 3)) mark(c, CL_FORBIDDEN, "mask_type", "not a mask type");
    if (bias != 0) mark(c, CL_FORBIDDEN, "bias_type", "bias not supported / not a bias type");
}

static void check_shape(cls *c, int group, int32_t batch, int32_t hq, int32_t hk, int32_t sq, int32_t sk, int32_t msq,
                        int32_t msk, float scale, int32_t mask, int32_t wl, int32_t wr) {
    if (batch < 1) mark(c, CL_FORBIDDEN, "batch", "< 1");
    if (hq < 1) mark(c, CL_FORBIDDEN, "nhead_q", "< 1");
    if (hk < 1) mark(c, CL_FORBIDDEN, "nhead_k", "< 1");
    if (hq >= 1 && hk >= 1 && hq % hk != 0) mark(c, CL_FORBIDDEN, "nhead_q|nhead_k", "not a multiple");
    if (sq < 0) mark(c, CL_FORBIDDEN, "seqlen_q", "negative");
    if (sk < 0) mark(c, CL_FORBIDDEN, "seqlen_k", "negative");
    if (msq < 0) mark(c, CL_FORBIDDEN, "max_seqlen_q", "negative");
    if (msk < 0) mark(c, CL_FORBIDDEN, "max_seqlen_k", "negative");
    if (!group && msq != 0 && msq != sq) mark(c, CL_FORBIDDEN, "max_seqlen_q", "batch mode: not 0 or seqlen_q");
    if (!group && msk != 0 && msk != sk) mark(c, CL_FORBIDDEN, "max_seqlen_k", "batch mode: not 0 or seqlen_k");
    if (!isfinite(scale)) mark(c, CL_FORBIDDEN, "scale", "not finite");
    else if (scale < 0) mark(c, CL_UNKNOWN, "scale", "negative");
    if (wl < -1) mark(c, CL_FORBIDDEN, "window_size_left", "< -1");
    if (wr < -1) mark(c, CL_FORBIDDEN, "window_size_right", "< -1");
    if (mask == FMHA_MASK_NONE && (wl != -1 || wr != -1)) mark(c, CL_UNKNOWN, "window_size_left", "a window without a mask");
}

/* Device seqstarts / logical lengths of group mode, as the kernels will read them. `arrays_only`:
 * only whether they are readable (UNSAFE otherwise). */
static void check_device_arrays(const rctx *r, cls *c, int32_t batch, const int32_t *ssq, const int32_t *ssk,
                                const int32_t *lq, const int32_t *lk, int32_t total_q, int32_t total_k, int32_t max_q,
                                int32_t max_k) {
    const int32_t *starts[2] = {ssq, ssk}, *lens[2] = {lq, lk};
    const int32_t totals[2] = {total_q, total_k}, maxes[2] = {max_q, max_k};
    static const char *const sname[2] = {"seqstart_q", "seqstart_k"}, *const lname[2] = {"seqlen_q_ptr", "seqlen_k_ptr"},
                             *const mname[2] = {"max_seqlen_q", "max_seqlen_k"};
    int side, b;
    if (batch < 1) return;
    for (side = 0; side < 2; ++side) {
        const int32_t *st = starts[side];
        if (st == NULL) {
            mark(c, CL_FORBIDDEN, sname[side], "null in group mode");
            continue;
        }
        if (array_len(r, st) < batch + 1) {
            mark(c, CL_UNSAFE, sname[side], "shorter than batch + 1");
            continue;
        }
        if (lens[side] != NULL && array_len(r, lens[side]) < batch) {
            mark(c, CL_UNSAFE, lname[side], "shorter than batch");
            continue;
        }
        for (b = 0; b < batch; ++b) {
            int64_t lo = st[b], hi = st[b + 1];
            if (lo < 0 || hi < lo || hi > totals[side]) {
                mark_dev(c, CL_FORBIDDEN, sname[side], "not monotone within 0..total");
                break;
            }
            if (hi - lo > maxes[side]) {
                mark_dev(c, CL_FORBIDDEN, mname[side], "a batch is longer");
                break;
            }
            if (lens[side] != NULL && (lens[side][b] < 0 || lens[side][b] > hi - lo)) {
                mark_dev(c, CL_FORBIDDEN, lname[side], "outside 0..physical length");
                break;
            }
        }
    }
}

static void fill_views(const setup *s, tview *v, const fmha_tensor *const *t, const int *ids, int n, int32_t hq, int32_t hk,
                       int32_t sq, int32_t sk, int32_t dq, int32_t dv, int backward) {
    int i;
    for (i = 0; i < n; ++i) {
        int id = ids[i];
        v[i].t = *t[i];
        v[i].name = tensor_names[id];
        v[i].heads = (id == TK || id == TV || id == TDK || id == TDV) ? hk : hq;
        v[i].rows = (id == TK || id == TV || id == TDK || id == TDV) ? sk : sq;
        v[i].cols = (id == TQ || id == TK || id == TDQ || id == TDK) ? dq : (id == TLSE || id == TD) ? 1 : dv;
        v[i].eb = (id == TLSE || id == TD) ? 4 : 2;
        v[i].output = backward ? (id == TD || id == TDQ || id == TDK || id == TDV) : (id == TO || id == TLSE);
    }
    (void)s;
}

static cls classify_fwd(const rctx *r) {
    const fmha_fwd_traits *ft = r->s.ft;
    const fmha_fwd_args *fa = r->s.fa;
    cls c;
    tview v[5];
    const fmha_tensor *t[5];
    int ids[5] = {TQ, TK, TV, TO, TLSE}, n = 4, i, group;
    memset(&c, 0, sizeof c);
    if (ft->struct_size != sizeof *ft) mark(&c, CL_FORBIDDEN, "struct_size|traits", "struct_size");
    if (fa->struct_size != sizeof *fa) mark(&c, CL_FORBIDDEN, "struct_size|args", "struct_size");
    check_common_traits(&c, ft->dtype, ft->hdim_q, ft->hdim_v, ft->is_group_mode, ft->mask_type, ft->bias_type);
    if (ft->has_dropout != 0) mark(&c, CL_FORBIDDEN, "has_dropout", ft->has_dropout == 1 ? "dropout not supported" : "not 0 or 1");
    group = ft->is_group_mode == 1;
    check_shape(&c, group, fa->batch, fa->nhead_q, fa->nhead_k, fa->seqlen_q, fa->seqlen_k, fa->max_seqlen_q, fa->max_seqlen_k,
                fa->scale, ft->mask_type, fa->window_size_left, fa->window_size_right);
    if (c.level >= CL_FORBIDDEN) return c;
    if (!group && (fa->seqstart_q || fa->seqstart_k || fa->seqlen_q_ptr || fa->seqlen_k_ptr))
        mark(&c, CL_UNKNOWN, "seqstart_q", "batch mode with sequence arrays");
    t[0] = &fa->q;
    t[1] = &fa->k;
    t[2] = &fa->v;
    t[3] = &fa->o;
    t[4] = &fa->lse;
    if (fa->lse.data != NULL) {
        n = 5;
        if (fa->lse.row_stride != 1) mark(&c, CL_FORBIDDEN, "lse.row_stride", "not 1");
    }
    fill_views(&r->s, v, t, ids, n, fa->nhead_q, fa->nhead_k, fa->seqlen_q, fa->seqlen_k, ft->hdim_q, ft->hdim_v, 0);
    for (i = 0; i < n; ++i) check_tensor(r, group, fa->batch, &v[i], &c);
    if (group && c.level < CL_UNSAFE)
        check_device_arrays(r, &c, fa->batch, fa->seqstart_q, fa->seqstart_k, fa->seqlen_q_ptr, fa->seqlen_k_ptr, fa->seqlen_q,
                            fa->seqlen_k, fa->max_seqlen_q, fa->max_seqlen_k);
    if (c.level < CL_FORBIDDEN) check_overlaps(r, group, fa->batch, v, n, &c);
    return c;
}

static cls classify_create(const rctx *r) {
    const fmha_bwd_traits *bt = r->s.bt;
    cls c;
    memset(&c, 0, sizeof c);
    /* 0.1's struct (up to is_deterministic) or this header's */
    if (bt->struct_size != sizeof *bt && bt->struct_size != offsetof(fmha_bwd_traits, dq_scheme))
        mark(&c, CL_FORBIDDEN, "struct_size|traits", "struct_size");
    check_common_traits(&c, bt->dtype, bt->hdim_q, bt->hdim_v, bt->is_group_mode, bt->mask_type, bt->bias_type);
    /* flags are 0 or 1 (1: unsupported features) */
    if (bt->has_dbias) mark(&c, CL_FORBIDDEN, "has_dbias", bt->has_dbias == 1 ? "not supported" : "not 0 or 1");
    if (bt->has_dropout) mark(&c, CL_FORBIDDEN, "has_dropout", bt->has_dropout == 1 ? "not supported" : "not 0 or 1");
    if (bt->is_store_randval) mark(&c, CL_FORBIDDEN, "is_store_randval", bt->is_store_randval == 1 ? "not supported" : "not 0 or 1");
    if (!ok_enum(bt->is_deterministic, 2)) mark(&c, CL_FORBIDDEN, "is_deterministic", "not 0 or 1");
    if (bt->struct_size == sizeof *bt && (bt->dq_scheme < 0 || bt->dq_scheme > 2)) mark(&c, CL_FORBIDDEN, "dq_scheme", "not a dQ scheme");
    check_shape(&c, bt->is_group_mode == 1, bt->batch, bt->nhead_q, bt->nhead_k, bt->seqlen_q, bt->seqlen_k, bt->max_seqlen_q,
                bt->max_seqlen_k, 0.0f, bt->mask_type, -1, bt->mask_type == FMHA_MASK_NONE ? -1 : 0);
    /* sizes far beyond anything allocatable: the library must answer an error, but what it answers
     * for a valid huge problem is not decided here */
    if (c.level == CL_ALLOWED && ((int64_t)bt->batch * bt->nhead_q > (1 << 20) || bt->seqlen_q > (1 << 24) || bt->seqlen_k > (1 << 24)))
        mark(&c, CL_UNKNOWN, "batch", "huge");
    return c;
}

static cls classify_prepare(const rctx *r) {
    const fmha_bwd_traits *bt = r->s.bt;
    void (*content)(cls *, int, const char *, const char *) = r->p_async ? mark_dev : mark;
    cls c;
    int group = bt->is_group_mode == 1, side, b;
    memset(&c, 0, sizeof c);
    if (r->p_null_launcher) mark(&c, CL_FORBIDDEN, "launcher", "null");
    if (r->p_ws == NULL) mark(&c, CL_FORBIDDEN, "workspace", "null");
    if (r->p_size < r->ws_size) mark(&c, CL_FORBIDDEN, "workspace", "too small");
    if (((uintptr_t)r->p_ws) % 16 != 0) mark(&c, CL_FORBIDDEN, "workspace", "not 16-byte aligned");
    if (r->p_ws != NULL && ((unsigned char *)r->p_ws < r->ws || (unsigned char *)r->p_ws + r->p_size > r->ws + r->ws_alloc))
        mark(&c, CL_UNSAFE, "workspace", "outside the buffer");
    if (r->p_async && !ok_enum(r->p_method, 3)) mark(&c, CL_FORBIDDEN, "method", "not a method");
    if (!group) {
        if (r->p_ssq) mark(&c, CL_FORBIDDEN, "seqstart_q", "non-null in batch mode");
        if (r->p_ssk) mark(&c, CL_FORBIDDEN, "seqstart_k", "non-null in batch mode");
        return c;
    }
    for (side = 0; side < 2; ++side) {
        const int32_t *st = side == 0 ? r->p_ssq : r->p_ssk;
        const char *name = side == 0 ? "seqstart_q" : "seqstart_k";
        int32_t total = side == 0 ? bt->seqlen_q : bt->seqlen_k;
        if (st == NULL) {
            mark(&c, CL_FORBIDDEN, name, "null in group mode");
            continue;
        }
        if (array_len(r, st) < bt->batch + 1) {
            mark(&c, CL_UNSAFE, name, "short array");
            continue;
        }
        if (st[0] != 0) content(&c, CL_FORBIDDEN, name, "[0] != 0");
        for (b = 0; b < bt->batch; ++b) {
            if (st[b + 1] < st[b]) {
                content(&c, CL_FORBIDDEN, name, "decreasing");
                break;
            }
            if (side == 1 && (int64_t)st[b + 1] - st[b] > bt->max_seqlen_k) {
                content(&c, CL_FORBIDDEN, "seqstart_k|max_seqlen_k", "a batch longer than max_seqlen_k");
                break;
            }
            if (side == 0 && (int64_t)st[b + 1] - st[b] > bt->max_seqlen_q) mark(&c, CL_UNKNOWN, "max_seqlen_q", "q batch longer");
        }
        if (st[bt->batch] > total) content(&c, CL_FORBIDDEN, name, "past the total");
    }
    return c;
}

static cls classify_run(const rctx *r) {
    const fmha_bwd_traits *bt = r->s.bt;
    const fmha_bwd_args *ba = r->s.ba;
    cls c;
    tview v[10];
    const fmha_tensor *t[10];
    int ids[10] = {TQ, TK, TV, TO, TLSE, TDO, TD, TDQ, TDK, TDV}, i, group = bt->is_group_mode == 1;
    size_t v01 = offsetof(fmha_bwd_args, workspace_size), ws_claim;
    memset(&c, 0, sizeof c);
    /* 0.1's struct (416 bytes) up to this header's; sizes ending inside workspace_size are undecided */
    if (ba->struct_size < v01 || ba->struct_size > sizeof *ba) mark(&c, CL_FORBIDDEN, "struct_size|args", "struct_size");
    else if (ba->struct_size != v01 && ba->struct_size != sizeof *ba) mark(&c, CL_UNKNOWN, "struct_size|args", "ends inside workspace_size");
    /* workspace_size (0.2): 0, and a struct that ends before it, skip the check */
    ws_claim = ba->struct_size >= sizeof *ba ? ba->workspace_size : 0;
    if (ws_claim != 0 && ws_claim < r->ws_size) mark(&c, CL_FORBIDDEN, "workspace_size", "smaller than the launcher's workspace_size");
    if (ws_claim != 0 && ba->workspace != NULL &&
        ((unsigned char *)ba->workspace < r->ws || ws_claim > (size_t)(r->ws + r->ws_alloc - (unsigned char *)ba->workspace)))
        mark(&c, CL_UNSAFE, "workspace_size", "more bytes than the buffer has");
    if (ba->batch != bt->batch) mark(&c, CL_FORBIDDEN, "batch", "differs from the traits");
    if (ba->nhead_q != bt->nhead_q) mark(&c, CL_FORBIDDEN, "nhead_q", "differs from the traits");
    if (ba->nhead_k != bt->nhead_k) mark(&c, CL_FORBIDDEN, "nhead_k", "differs from the traits");
    if (ba->hdim_q != bt->hdim_q) mark(&c, CL_FORBIDDEN, "hdim_q", "differs from the traits");
    if (ba->hdim_v != bt->hdim_v) mark(&c, CL_FORBIDDEN, "hdim_v", "differs from the traits");
    if (!group) {
        if (ba->seqlen_q != bt->seqlen_q) mark(&c, CL_FORBIDDEN, "seqlen_q", "differs from the traits");
        if (ba->seqlen_k != bt->seqlen_k) mark(&c, CL_FORBIDDEN, "seqlen_k", "differs from the traits");
        if (ba->max_seqlen_q != bt->max_seqlen_q) mark(&c, CL_FORBIDDEN, "max_seqlen_q", "differs from the traits");
        if (ba->max_seqlen_k != bt->max_seqlen_k) mark(&c, CL_FORBIDDEN, "max_seqlen_k", "differs from the traits");
    } else {
        if (ba->seqlen_q > bt->seqlen_q) mark(&c, CL_FORBIDDEN, "seqlen_q", "above the traits' bound");
        if (ba->seqlen_k > bt->seqlen_k) mark(&c, CL_FORBIDDEN, "seqlen_k", "above the traits' bound");
        if (ba->max_seqlen_q > bt->max_seqlen_q) mark(&c, CL_FORBIDDEN, "max_seqlen_q", "above the traits' bound");
        if (ba->max_seqlen_k > bt->max_seqlen_k) mark(&c, CL_FORBIDDEN, "max_seqlen_k", "above the traits' bound");
    }
    check_shape(&c, group, ba->batch, ba->nhead_q, ba->nhead_k, ba->seqlen_q, ba->seqlen_k, ba->max_seqlen_q, ba->max_seqlen_k,
                ba->scale, bt->mask_type, ba->window_size_left, ba->window_size_right);
    /* a workspace not prepared for this run: OK, and its synchronize reports WORKSPACE_NOT_PREPARED */
    if (ba->workspace != r->p_ws) mark_dev(&c, CL_FORBIDDEN, "workspace", "not the prepared workspace");
    if (c.level >= CL_FORBIDDEN) return c;
    if (!group && (ba->seqstart_q || ba->seqstart_k || ba->seqlen_q_ptr || ba->seqlen_k_ptr))
        mark(&c, CL_UNKNOWN, "seqstart_q", "batch mode with sequence arrays");
    if (ba->lse.row_stride != 1) mark(&c, CL_FORBIDDEN, "lse.row_stride", "not 1");
    if (ba->d.row_stride != 1) mark(&c, CL_FORBIDDEN, "d.row_stride", "not 1");
    t[0] = &ba->q;
    t[1] = &ba->k;
    t[2] = &ba->v;
    t[3] = &ba->o;
    t[4] = &ba->lse;
    t[5] = &ba->d_o;
    t[6] = &ba->d;
    t[7] = &ba->dq;
    t[8] = &ba->dk;
    t[9] = &ba->dv;
    fill_views(&r->s, v, t, ids, 10, ba->nhead_q, ba->nhead_k, ba->seqlen_q, ba->seqlen_k, ba->hdim_q, ba->hdim_v, 1);
    for (i = 0; i < 10; ++i) check_tensor(r, group, ba->batch, &v[i], &c);
    if (group && c.level < CL_UNSAFE) {
        int b;
        check_device_arrays(r, &c, ba->batch, ba->seqstart_q, ba->seqstart_k, ba->seqlen_q_ptr, ba->seqlen_k_ptr, ba->seqlen_q,
                            ba->seqlen_k, ba->max_seqlen_q, ba->max_seqlen_k);
        /* the device seqstarts must be the ones prepared */
        if (c.level < CL_UNSAFE && ba->seqstart_q && ba->seqstart_k)
            for (b = 0; b <= ba->batch; ++b)
                if (ba->seqstart_q[b] != r->host_ssq[b] || ba->seqstart_k[b] != r->host_ssk[b]) {
                    mark_dev(&c, CL_FORBIDDEN, "seqstart_q|seqstart_k|workspace", "differ from the prepared ones");
                    break;
                }
    }
    if (c.level < CL_FORBIDDEN) check_overlaps(r, group, ba->batch, v, 10, &c);
    return c;
}

/* ---- a random valid problem ---------------------------------------------------------------------- */

static int pick(uint64_t *rng, const int *values, int n) {
    return values[rng_next(rng) % (uint64_t)n];
}

static void random_plan(setup *s, uint64_t *rng) {
    int i;
    setup_default_layout(s);
    for (i = 0; i < NT; ++i) {
        tensor_plan *p = &s->plan[i];
        int64_t h = tensor_heads(s, i), rows = tensor_rows(s, i), c = tensor_cols(s, i);
        if (p->buf < 0) continue;
        if (i == TLSE || i == TD) {
            p->row_stride = 1;
            p->head_stride = rows + (rng_chance(rng, 25) ? rng_int(rng, 1, 9) : 0);
            p->batch_stride = h * p->head_stride + (rng_chance(rng, 25) ? rng_int(rng, 1, 9) : 0);
        } else if (rng_chance(rng, 30)) { /* [b][h][s][d] */
            p->row_stride = c + (rng_chance(rng, 30) ? rng_int(rng, 1, 8) : 0);
            p->head_stride = rows * p->row_stride + (rng_chance(rng, 25) ? rng_int(rng, 1, 8) : 0);
            p->batch_stride = h * p->head_stride + (rng_chance(rng, 25) ? rng_int(rng, 1, 8) : 0);
        } else { /* [b][s][h][d] */
            p->head_stride = c + (rng_chance(rng, 25) ? rng_int(rng, 1, 8) : 0);
            p->row_stride = h * p->head_stride + (rng_chance(rng, 30) ? rng_int(rng, 1, 8) : 0);
            p->batch_stride = rows * p->row_stride + (rng_chance(rng, 25) ? rng_int(rng, 1, 8) : 0);
        }
        if (s->group) { /* ignored in group mode: any value */
            static const int64_t any[] = {0, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 62, 12345};
            p->batch_stride = rng_chance(rng, 30) ? (rng_chance(rng, 50) ? rng_int(rng, 0, 1000000) : any[rng_int(rng, 0, 5)]) : 0;
        }
    }
    /* inputs may broadcast and alias */
    if (rng_chance(rng, 10)) s->plan[TQ].head_stride = 0;
    if (!s->group && rng_chance(rng, 10)) s->plan[TK].batch_stride = s->plan[TV].batch_stride = 0;
    if (s->dq == s->dv && rng_chance(rng, 8)) s->plan[TV] = s->plan[TK];
    if (s->op_bwd && rng_chance(rng, 8)) s->plan[TDO] = s->plan[TO];
    /* packed qkv / dqkv: [b][s][3][h][d] */
    if (s->hq == s->hk && s->dq == s->dv && s->sq == s->sk && (!s->group || memcmp(s->lens_q, s->lens_k, sizeof s->lens_q) == 0)) {
        int which;
        for (which = 0; which < 2; ++which) {
            int base = which == 0 ? TQ : TDQ, k;
            if ((which == 1 && !s->op_bwd) || !rng_chance(rng, 30)) continue;
            for (k = 0; k < 3; ++k) {
                tensor_plan *p = &s->plan[base + (which == 0 ? k : k)];
                int id = which == 0 ? (k == 0 ? TQ : k == 1 ? TK : TV) : (k == 0 ? TDQ : k == 1 ? TDK : TDV);
                p = &s->plan[id];
                p->buf = base;
                p->offset = (size_t)k * (size_t)(s->hq * s->dq) * 2;
                p->row_stride = 3 * s->hq * s->dq;
                p->head_stride = s->dq;
                p->batch_stride = s->group ? 0 : (int64_t)s->sq * 3 * s->hq * s->dq;
            }
        }
    }
    /* empty sides may pass NULL */
    if (s->sq == 0 && rng_chance(rng, 50)) {
        s->plan[TQ].buf = s->plan[TO].buf = s->plan[TLSE].buf = BUF_NULL;
        if (s->op_bwd) s->plan[TDO].buf = s->plan[TD].buf = s->plan[TDQ].buf = BUF_NULL;
    }
    if (s->sk == 0 && rng_chance(rng, 50)) {
        s->plan[TK].buf = s->plan[TV].buf = BUF_NULL;
        if (s->op_bwd) s->plan[TDK].buf = s->plan[TDV].buf = BUF_NULL;
    }
    if (!s->op_bwd && rng_chance(rng, 15)) s->plan[TLSE].buf = BUF_NULL; /* the forward may skip the LSE */
}

static void random_problem(rctx *r) {
    setup *s = &r->s;
    uint64_t *rng = &r->rng;
    static const int dims[] = {8, 16, 16, 24, 32, 32, 32, 40, 64, 64, 72, 128};
    int b;
    memset(s, 0, sizeof *s);
    s->op_bwd = rng_chance(rng, 55);
    s->group = rng_chance(rng, 45);
    s->dtype = rng_chance(rng, 50) ? FMHA_DTYPE_BF16 : FMHA_DTYPE_FP16;
    if (s->op_bwd) {
        s->det = rng_chance(rng, 50); /* 0 or 1: other values are invalid */
    }
    s->hk = rng_int(rng, 1, 2);
    s->hq = s->hk * rng_int(rng, 1, 3);
    s->dq = pick(rng, dims, 12);
    s->dv = rng_chance(rng, 75) ? s->dq : pick(rng, dims, 12);
    s->mask = rng_int(rng, 0, 2);
    if (s->mask == FMHA_MASK_NONE) s->wl = s->wr = -1;
    else if (rng_chance(rng, 50)) s->wl = -1, s->wr = 0;
    else {
        s->wl = rng_chance(rng, 30) ? -1 : rng_int(rng, 0, 12);
        s->wr = rng_chance(rng, 30) ? -1 : rng_int(rng, 0, 12);
    }
    s->scale = rng_chance(rng, 70) ? 0.0f : (float)rng_int(rng, 5, 100) / 100.0f;
    if (!s->group) {
        s->batch = rng_int(rng, 1, 3);
        s->sq = rng_chance(rng, 8) ? 0 : rng_int(rng, 1, 40);
        s->sk = rng_chance(rng, 5) ? 0 : rng_chance(rng, 30) ? s->sq : rng_int(rng, 1, 40);
        s->max_sq = s->sq;
        s->max_sk = s->sk;
    } else {
        int same = rng_chance(rng, 25);
        s->batch = rng_int(rng, 1, 5);
        s->sq = s->sk = s->max_sq = s->max_sk = 0;
        for (b = 0; b < s->batch; ++b) {
            s->lens_q[b] = rng_chance(rng, 12) ? 0 : rng_int(rng, 1, 24);
            s->lens_k[b] = same ? s->lens_q[b] : rng_chance(rng, 8) ? 0 : rng_int(rng, 1, 24);
            s->sq += s->lens_q[b];
            s->sk += s->lens_k[b];
            if (s->lens_q[b] > s->max_sq) s->max_sq = s->lens_q[b];
            if (s->lens_k[b] > s->max_sk) s->max_sk = s->lens_k[b];
        }
        if (rng_chance(rng, 30)) s->max_sq += rng_int(rng, 0, 6);
        if (rng_chance(rng, 30)) s->max_sk += rng_int(rng, 0, 6);
    }
    random_plan(s, rng);
}

/* ---- mutations ----------------------------------------------------------------------------------- */

static int32_t int_palette(uint64_t *rng, int32_t v) {
    switch (rng_int(rng, 0, 11)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return -1;
    case 3: return -2;
    case 4: return INT32_MIN;
    case 5: return INT32_MAX;
    case 6: return v - 1;
    case 7: return v + 1;
    case 8: return v / 2;
    case 9: return v > INT32_MAX / 2 ? v : v * 2;
    case 10: return rng_int(rng, 0, 300);
    default: return rng_int(rng, -1000, 1000);
    }
}

static int64_t stride_palette(uint64_t *rng, int64_t v) {
    switch (rng_int(rng, 0, 13)) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 1;
    case 3: return v / 2;
    case 4: return v * 2;
    case 5: return v + 1;
    case 6: return v - 1;
    case 7: return (int64_t)1 << 62;
    case 8: return (int64_t)1 << 61;
    case 9: return (int64_t)1 << 59;
    case 10: return INT64_MAX;
    case 11: return INT64_MIN;
    case 12: return rng_int(rng, 0, 5000);
    default: return v + 8;
    }
}

static size_t size_palette(uint64_t *rng, size_t size) {
    switch (rng_int(rng, 0, 6)) {
    case 0: return 0;
    case 1: return size - 8;
    case 2: return size - 4;
    case 3: return size + 8;
    case 4: return size + 1;
    case 5: return 1 << 20;
    default: return SIZE_MAX;
    }
}

static float float_palette(uint64_t *rng) {
    switch (rng_int(rng, 0, 6)) {
    case 0: return NAN;
    case 1: return INFINITY;
    case 2: return -INFINITY;
    case 3: return -1.0f;
    case 4: return 0.0f;
    case 5: return 1e30f;
    default: return 1e-30f;
    }
}

/* A saved copy of a region, to undo a mutation. */
typedef struct {
    void *at;
    unsigned char old[64];
    size_t n;
} undo;

static void save(undo *u, void *at, size_t n) {
    u->at = at;
    u->n = n;
    memcpy(u->old, at, n);
}

static void restore(const undo *u) {
    if (u->at) memcpy(u->at, u->old, u->n);
}

static fmha_tensor *args_tensor(rctx *r, int id) {
    if (r->stage == SR_FWD) {
        fmha_fwd_args *a = r->s.fa;
        switch (id) {
        case TQ: return &a->q;
        case TK: return &a->k;
        case TV: return &a->v;
        case TO: return &a->o;
        default: return &a->lse;
        }
    } else {
        fmha_bwd_args *a = r->s.ba;
        switch (id) {
        case TQ: return &a->q;
        case TK: return &a->k;
        case TV: return &a->v;
        case TO: return &a->o;
        case TLSE: return &a->lse;
        case TDO: return &a->d_o;
        case TD: return &a->d;
        case TDQ: return &a->dq;
        case TDK: return &a->dk;
        default: return &a->dv;
        }
    }
}

/* One mutation of the current stage's call; describes itself in r->what. */
static void mutate(rctx *r, undo *u) {
    setup *s = &r->s;
    uint64_t *rng = &r->rng;
    char d[120] = "";
    u->at = NULL;
    if (r->stage == SR_FWD || r->stage == SR_RUN) {
        int fwd = r->stage == SR_FWD, choice = rng_int(rng, 0, 99);
        if (!fwd && rng_chance(rng, 8)) {
            /* workspace_size (0.2): checked against the launcher's size unless 0 */
            size_t *field = &s->ba->workspace_size, v;
            save(u, field, sizeof *field);
            switch (rng_int(rng, 0, 5)) {
            case 0: v = 0; break;
            case 1: v = r->ws_size - 1; break;
            case 2: v = 1; break;
            case 3: v = r->ws_size; break;
            case 4: v = r->ws_size + 64; break;
            default: v = SIZE_MAX; break;
            }
            *field = v;
            snprintf(d, sizeof d, "bwd_args.workspace_size = %zu (needed %zu)", v, r->ws_size);
        } else if (fwd && choice < 18) {
            /* traits */
            fmha_fwd_traits *t = s->ft;
            int f = rng_int(rng, 0, 7);
            if (f == 0) {
                save(u, &t->struct_size, sizeof t->struct_size);
                t->struct_size = size_palette(rng, sizeof *t);
                snprintf(d, sizeof d, "fwd_traits.struct_size = %zu", t->struct_size);
            } else {
                int32_t *field = f == 1 ? &t->dtype : f == 2 ? &t->hdim_q : f == 3 ? &t->hdim_v : f == 4 ? &t->is_group_mode
                               : f == 5 ? &t->mask_type : f == 6 ? &t->bias_type : &t->has_dropout;
                static const char *const names[] = {"", "dtype", "hdim_q", "hdim_v", "is_group_mode", "mask_type", "bias_type",
                                                    "has_dropout"};
                save(u, field, 4);
                *field = (f == 1 || f >= 4) && rng_chance(rng, 50) ? rng_int(rng, -1, 4) : int_palette(rng, *field);
                snprintf(d, sizeof d, "fwd_traits.%s = %d", names[f], (int)*field);
            }
        } else if (choice < 40) {
            /* an integer of the args */
            static const char *const names[] = {"batch", "seqlen_q", "seqlen_k", "max_seqlen_q", "max_seqlen_k", "nhead_q",
                                                "nhead_k", "window_size_left", "window_size_right", "hdim_q", "hdim_v"};
            int f = rng_int(rng, 0, fwd ? 8 : 10);
            int32_t *field;
            if (fwd) {
                fmha_fwd_args *a = s->fa;
                int32_t *fs[] = {&a->batch, &a->seqlen_q, &a->seqlen_k, &a->max_seqlen_q, &a->max_seqlen_k, &a->nhead_q, &a->nhead_k,
                                 &a->window_size_left, &a->window_size_right};
                field = fs[f];
            } else {
                fmha_bwd_args *a = s->ba;
                int32_t *fs[] = {&a->batch, &a->seqlen_q, &a->seqlen_k, &a->max_seqlen_q, &a->max_seqlen_k, &a->nhead_q, &a->nhead_k,
                                 &a->window_size_left, &a->window_size_right, &a->hdim_q, &a->hdim_v};
                field = fs[f];
            }
            save(u, field, 4);
            *field = int_palette(rng, *field);
            snprintf(d, sizeof d, "%s.%s = %d", fwd ? "fwd_args" : "bwd_args", names[f], (int)*field);
        } else if (choice < 65) {
            /* a stride */
            int id = fwd ? rng_int(rng, TQ, TLSE) : rng_int(rng, TQ, TDV), k = rng_int(rng, 0, 2);
            fmha_tensor *t = args_tensor(r, id);
            int64_t *field = k == 0 ? &t->batch_stride : k == 1 ? &t->head_stride : &t->row_stride;
            save(u, field, 8);
            *field = stride_palette(rng, *field);
            snprintf(d, sizeof d, "%s.%s = %lld", tensor_names[id], k == 0 ? "batch_stride" : k == 1 ? "head_stride" : "row_stride",
                     (long long)*field);
        } else if (choice < 80) {
            /* a pointer */
            int id = fwd ? rng_int(rng, TQ, TLSE) : rng_int(rng, TQ, TDV), other = fwd ? rng_int(rng, TQ, TLSE) : rng_int(rng, TQ, TDV);
            fmha_tensor *t = args_tensor(r, id);
            save(u, &t->data, sizeof t->data);
            switch (rng_int(rng, 0, 4)) {
            case 0: t->data = NULL; snprintf(d, sizeof d, "%s.data = NULL", tensor_names[id]); break;
            case 1:
                t->data = (void *)(UINTPTR_MAX - 4095);
                snprintf(d, sizeof d, "%s.data = UINTPTR_MAX - 4095", tensor_names[id]);
                break;
            case 2:
                t->data = args_tensor(r, other)->data;
                snprintf(d, sizeof d, "%s.data = %s.data", tensor_names[id], tensor_names[other]);
                break;
            case 3:
                if (t->data) t->data = (unsigned char *)t->data + 4;
                snprintf(d, sizeof d, "%s.data += 4 bytes", tensor_names[id]);
                break;
            default:
                if (t->data) t->data = (unsigned char *)t->data + 1;
                snprintf(d, sizeof d, "%s.data += 1 byte", tensor_names[id]);
                break;
            }
        } else if (choice < 86) {
            float *scale = fwd ? &s->fa->scale : &s->ba->scale;
            save(u, scale, 4);
            *scale = float_palette(rng);
            snprintf(d, sizeof d, "scale = %g", (double)*scale);
        } else if (choice < 91) {
            size_t *size = fwd ? &s->fa->struct_size : &s->ba->struct_size;
            save(u, size, sizeof *size);
            *size = size_palette(rng, fwd ? sizeof *s->fa : sizeof *s->ba);
            snprintf(d, sizeof d, "%s.struct_size = %zu", fwd ? "fwd_args" : "bwd_args", *size);
        } else if (s->group && choice < 97) {
            /* a device seqstart entry */
            int32_t *arr = rng_chance(rng, 50) ? s->ssq : s->ssk;
            int at = rng_int(rng, 0, s->batch);
            save(u, &arr[at], 4);
            arr[at] = rng_chance(rng, 50) ? arr[at] + rng_int(rng, -3, 3) : int_palette(rng, arr[at]);
            snprintf(d, sizeof d, "device %s[%d] = %d", arr == s->ssq ? "seqstart_q" : "seqstart_k", at, (int)arr[at]);
        } else {
            /* sequence array pointers, logical lengths */
            const int32_t **field;
            int f = rng_int(rng, 0, 3);
            if (fwd) field = f == 0 ? &s->fa->seqstart_q : f == 1 ? &s->fa->seqstart_k : f == 2 ? &s->fa->seqlen_q_ptr : &s->fa->seqlen_k_ptr;
            else field = f == 0 ? &s->ba->seqstart_q : f == 1 ? &s->ba->seqstart_k : f == 2 ? &s->ba->seqlen_q_ptr : &s->ba->seqlen_k_ptr;
            save(u, (void *)field, sizeof *field);
            if (f >= 2) {
                /* logical lengths: physical ones, with a random change */
                int n = s->batch > 0 ? s->batch : 1, b;
                int32_t *lens = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)n, 4, f == 2 ? "seqlen_q_ptr" : "seqlen_k_ptr");
                for (b = 0; b < n; ++b) lens[b] = s->group ? (f == 2 ? s->lens_q[b] : s->lens_k[b]) : (f == 2 ? s->sq : s->sk);
                if (rng_chance(rng, 60)) lens[rng_int(rng, 0, n - 1)] += rng_int(rng, -2, 2);
                add_array(r, lens, n);
                *field = lens;
                snprintf(d, sizeof d, "%s = logical lengths", f == 2 ? "seqlen_q_ptr" : "seqlen_k_ptr");
            } else {
                int v = rng_int(rng, 0, 2);
                *field = v == 0 ? NULL : v == 1 ? s->ssq : s->ssk;
                snprintf(d, sizeof d, "%s = %s", f == 0 ? "seqstart_q" : "seqstart_k", v == 0 ? "NULL" : v == 1 ? "seqstart_q" : "seqstart_k");
            }
        }
    } else if (r->stage == SR_CREATE) {
        fmha_bwd_traits *t = s->bt;
        static const char *const names[] = {"seqlen_q", "seqlen_k", "batch", "max_seqlen_q", "max_seqlen_k", "hdim_q", "hdim_v",
                                            "nhead_q", "nhead_k", "dtype", "is_group_mode", "mask_type", "bias_type", "has_dbias",
                                            "has_dropout", "is_store_randval", "is_deterministic", "dq_scheme"};
        int f = rng_int(rng, 0, 18);
        static const size_t offs[] = {
            offsetof(fmha_bwd_traits, seqlen_q),      offsetof(fmha_bwd_traits, seqlen_k),
            offsetof(fmha_bwd_traits, batch),         offsetof(fmha_bwd_traits, max_seqlen_q),
            offsetof(fmha_bwd_traits, max_seqlen_k),  offsetof(fmha_bwd_traits, hdim_q),
            offsetof(fmha_bwd_traits, hdim_v),        offsetof(fmha_bwd_traits, nhead_q),
            offsetof(fmha_bwd_traits, nhead_k),       offsetof(fmha_bwd_traits, dtype),
            offsetof(fmha_bwd_traits, is_group_mode), offsetof(fmha_bwd_traits, mask_type),
            offsetof(fmha_bwd_traits, bias_type),     offsetof(fmha_bwd_traits, has_dbias),
            offsetof(fmha_bwd_traits, has_dropout),   offsetof(fmha_bwd_traits, is_store_randval),
            offsetof(fmha_bwd_traits, is_deterministic)};
        if (f == 18) {
            save(u, &t->struct_size, sizeof t->struct_size);
            t->struct_size = size_palette(rng, sizeof *t);
            snprintf(d, sizeof d, "bwd_traits.struct_size = %zu", t->struct_size);
        } else if (f == 17) { /* dq_scheme, 64 bits */
            save(u, &t->dq_scheme, sizeof t->dq_scheme);
            t->dq_scheme = rng_chance(rng, 50) ? rng_int(rng, -1, 4) : (rng_chance(rng, 50) ? INT64_MIN : ((int64_t)1 << 32) + 1);
            snprintf(d, sizeof d, "bwd_traits.%s = %lld", names[f], (long long)t->dq_scheme);
        } else {
            int32_t *field = (int32_t *)((unsigned char *)t + offs[f]);
            save(u, field, 4);
            *field = f >= 9 && rng_chance(rng, 50) ? rng_int(rng, -1, 4) : int_palette(rng, *field);
            snprintf(d, sizeof d, "bwd_traits.%s = %d", names[f], (int)*field);
        }
    } else {
        /* prepare */
        int f = rng_int(rng, 0, 7);
        switch (f) {
        case 0: {
            static const int offsets[] = {1, 2, 4, 8, 15, 16, 32};
            int off = offsets[rng_int(rng, 0, 6)];
            r->p_ws = r->ws + off;
            snprintf(d, sizeof d, "workspace += %d bytes", off);
            break;
        }
        case 1: {
            static const int deltas[] = {-1, -16, 16, 48};
            int delta = deltas[rng_int(rng, 0, 3)];
            r->p_size = r->ws_size + (size_t)(ptrdiff_t)delta;
            if (rng_chance(rng, 20)) r->p_size = 0, delta = -(int)r->ws_size;
            snprintf(d, sizeof d, "workspace_size = needed %+d", delta);
            break;
        }
        case 2: r->p_ws = NULL; snprintf(d, sizeof d, "workspace = NULL"); break;
        case 3:
            r->p_method = rng_chance(rng, 50) ? rng_int(rng, -1, 4) : int_palette(rng, 0);
            snprintf(d, sizeof d, "method = %d (async)", (int)r->p_method);
            r->p_async = 1;
            break;
        case 4: {
            int q = rng_chance(rng, 50);
            const int32_t **field = q ? &r->p_ssq : &r->p_ssk;
            *field = *field == NULL ? (q ? r->host_ssq : r->host_ssk) : NULL;
            snprintf(d, sizeof d, "prepare %s = %s", q ? "seqstart_q" : "seqstart_k", *field ? "non-null" : "NULL");
            break;
        }
        case 5:
        case 6:
            if (s->group) {
                int32_t *arr = rng_chance(rng, 50) ? r->host_ssq : r->host_ssk;
                int at = rng_int(rng, 0, s->batch);
                arr[at] = rng_chance(rng, 50) ? arr[at] + rng_int(rng, -3, 3) : int_palette(rng, arr[at]);
                snprintf(d, sizeof d, "host %s[%d] = %d", arr == r->host_ssq ? "seqstart_q" : "seqstart_k", at, (int)arr[at]);
                break;
            }
            /* fall through */
        default:
            r->p_null_launcher = 1;
            snprintf(d, sizeof d, "prepare launcher = NULL");
            break;
        }
    }
    appendf(r->what, sizeof r->what, "%s%s", r->mutations++ ? ", " : "", d);
}

static cls classify(rctx *r) {
    switch (r->stage) {
    case SR_FWD: return classify_fwd(r);
    case SR_CREATE: return classify_create(r);
    case SR_PREPARE: return classify_prepare(r);
    default: return classify_run(r);
    }
}

/* ---- the case ------------------------------------------------------------------------------------ */

static void note_status(case_record *rec, const char *call, fmha_status st) {
    char msg[400];
    if (st == FMHA_OK) return;
    last_message(msg, sizeof msg);
    appendf(rec->note, sizeof rec->note, "%s: %s (%d): %s; ", call, fmha_status_string(st), (int)st, msg);
}

static void set_judged(case_record *rec, fmha_status st, const char *call) {
    rec->status = st;
    last_message(rec->message, sizeof rec->message);
    appendf(rec->note, sizeof rec->note, "judged: %s; ", call);
    rec->phase = 1;
    report(rec);
}

void random_run(uint64_t seed, case_record *rec) {
    static rctx ctx;
    rctx *r = &ctx;
    setup *s = &r->s;
    cls c;
    int attempt, want, i, valid, deferred = 0, prepare_failed = 0;
    fmha_status st;
    fmha_bwd_launcher *launcher = NULL;
    memset(r, 0, sizeof *r);
    r->rng = seed;
    if (rng_int(&r->rng, 0, 7) == 0) {
        kv_random_run(rng_next(&r->rng), rec);
        return;
    }
    /* a valid problem (the classifier must agree) */
    for (attempt = 0;; ++attempt) {
        random_problem(r);
        r->narrays = 0;
        setup_alloc(s, &r->rng);
        add_array(r, s->ssq, s->batch + 1);
        add_array(r, s->ssk, s->batch + 1);
        r->stage = s->op_bwd ? SR_RUN : SR_FWD;
        if (s->op_bwd) {
            /* group traits may bound the call from above */
            if (s->group && rng_chance(&r->rng, 30)) {
                s->bt->seqlen_q += rng_int(&r->rng, 0, 9);
                s->bt->seqlen_k += rng_int(&r->rng, 0, 9);
                s->bt->max_seqlen_q += rng_int(&r->rng, 0, 5);
                s->bt->max_seqlen_k += rng_int(&r->rng, 0, 5);
            }
            if (!s->group && rng_chance(&r->rng, 30)) s->bt->max_seqlen_q = s->ba->max_seqlen_q = 0;
            r->host_ssq = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)(s->batch + 1), 4, "host seqstart_q");
            r->host_ssk = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)(s->batch + 1), 4, "host seqstart_k");
            memcpy(r->host_ssq, s->ssq, sizeof(int32_t) * (size_t)(s->batch + 1));
            memcpy(r->host_ssk, s->ssk, sizeof(int32_t) * (size_t)(s->batch + 1));
            add_array(r, r->host_ssq, s->batch + 1);
            add_array(r, r->host_ssk, s->batch + 1);
            r->p_ws = NULL; /* classify_run compares with the prepared workspace: checked after the prepare */
        }
        c = s->op_bwd ? classify_create(r) : classify_fwd(r);
        if (s->op_bwd && c.level == CL_ALLOWED) c = classify_run(r);
        if (c.level == CL_ALLOWED || attempt > 20) break;
        /* (a generator bug: report it through the note and go on with another problem) */
        appendf(rec->note, sizeof rec->note, "generator: invalid base (%s: %s) redrawn; ", c.field, c.why);
    }
    s->stream = NULL;
    if (rng_chance(&r->rng, 30) && fmha_stream_create(&s->stream) != FMHA_OK) s->stream = NULL;
    want = rng_chance(&r->rng, 65) ? rng_int(&r->rng, 1, 2) : 0;
    if (fuzz_no_mutate) want = 0;
    if (s->op_bwd) {
        static const int stages[] = {SR_CREATE, SR_PREPARE, SR_RUN, SR_RUN};
        r->stage = want ? stages[rng_int(&r->rng, 0, 3)] : SR_RUN;
    }
    snprintf(rec->desc, sizeof rec->desc,
             "random %s %s%s: batch %d, heads %d/%d, hdim %d/%d, seqlen %d/%d (max %d/%d), %s, mask %d window (%d,%d), det %d, %s",
             s->op_bwd ? "bwd" : "fwd", s->group ? "varlen" : "batch", s->op_bwd && s->det ? " det" : "", s->batch, s->hq, s->hk,
             s->dq, s->dv, s->sq, s->sk, s->max_sq, s->max_sk, s->dtype ? "bf16" : "fp16", s->mask, s->wl, s->wr, s->det,
             s->stream ? "private stream" : "default stream");
    if (s->group) {
        int b;
        appendf(rec->desc, sizeof rec->desc, ", lengths q");
        for (b = 0; b < s->batch; ++b) appendf(rec->desc, sizeof rec->desc, "%s%d", b ? "," : " ", (int)s->lens_q[b]);
        appendf(rec->desc, sizeof rec->desc, " k");
        for (b = 0; b < s->batch; ++b) appendf(rec->desc, sizeof rec->desc, "%s%d", b ? "," : " ", (int)s->lens_k[b]);
    }
    rec->expect = EXPECT_ANY;
    rec->correct = -1;
    rec->forbidden = -1;
    rec->phase = 0;
    report(rec);

    if (!s->op_bwd) {
        for (i = 0; i < want; ++i) {
            undo u;
            int tries;
            for (tries = 0; tries < 8; ++tries) {
                mutate(r, &u);
                c = classify(r);
                if (c.level != CL_UNSAFE) break;
                restore(&u);
                appendf(r->what, sizeof r->what, " (undone)");
            }
        }
        c = classify(r);
        if (c.level == CL_UNSAFE) {
            /* undo everything: back to the valid problem is not tracked per field; skip the call */
            appendf(rec->note, sizeof rec->note, "mutations left an unsafe call (%s): not run; ", c.field);
            rec->phase = 2;
            report(rec);
            return;
        }
        if (r->mutations) appendf(rec->desc, sizeof rec->desc, "; mutated: %s", r->what);
        rec->forbidden = c.level == CL_FORBIDDEN ? 1 : c.level == CL_ALLOWED ? 0 : -1;
        snprintf(rec->fields, sizeof rec->fields, "%s", c.field);
        if (c.level != CL_ALLOWED) appendf(rec->note, sizeof rec->note, "classifier: %s (%s); ", c.field, c.why);
        report(rec);
        setup_poison(s, 0);
        st = fmha_fwd(s->ft, s->fa, s->stream);
        set_judged(rec, st, "fmha_fwd");
        {
            fmha_status sync = fmha_stream_synchronize(s->stream);
            note_status(rec, "fmha_stream_synchronize", sync);
            /* device arrays are checked while the forward runs: a forbidden call is "accepted" only if
             * the synchronize did not report it either */
            if (st == FMHA_OK && sync != FMHA_OK && (c.deferred || c.level != CL_FORBIDDEN)) {
                rec->status = sync;
                last_message(rec->message, sizeof rec->message);
                appendf(rec->note, sizeof rec->note, "reported by the synchronize; ");
            }
            valid = st == FMHA_OK && sync == FMHA_OK && r->mutations == 0;
        }
        if (valid) rec->correct = setup_check(s, 0, rec->note, sizeof rec->note);
        goto done;
    }

    /* backward: a valid forward, then create → size → prepare → run */
    st = setup_run_forward(s);
    if (st != FMHA_OK) {
        note_status(rec, "the forward (valid)", st);
        rec->correct = 0;
        set_judged(rec, st, "the forward (valid setup step)");
        goto done;
    }
    setup_poison(s, 1);
    if (r->stage == SR_CREATE) {
        for (i = 0; i < want; ++i) {
            undo u;
            mutate(r, &u);
        }
        c = classify(r);
        if (c.level == CL_UNSAFE) c.level = CL_UNKNOWN;
        rec->forbidden = c.level == CL_FORBIDDEN ? 1 : c.level == CL_ALLOWED ? 0 : -1;
        snprintf(rec->fields, sizeof rec->fields, "%s", c.field);
        appendf(rec->desc, sizeof rec->desc, "; mutated: %s", r->what);
        if (c.level != CL_ALLOWED) appendf(rec->note, sizeof rec->note, "classifier: %s (%s); ", c.field, c.why);
        report(rec);
    }
    st = fmha_bwd_launcher_create(s->bt, &launcher);
    if (r->stage == SR_CREATE) set_judged(rec, st, "fmha_bwd_launcher_create");
    else if (st != FMHA_OK) {
        note_status(rec, "create (valid)", st);
        rec->correct = 0;
        set_judged(rec, st, "create (valid setup step)");
    }
    if (st != FMHA_OK || launcher == NULL) goto done;
    st = fmha_bwd_launcher_workspace_size(launcher, &r->ws_size);
    if (st != FMHA_OK) {
        note_status(rec, "workspace_size", st);
        if (r->stage != SR_CREATE) rec->correct = 0;
        goto done;
    }
    if (r->ws_size > ((size_t)256 << 20)) {
        appendf(rec->note, sizeof rec->note, "workspace_size %zu: not allocated; ", r->ws_size);
        goto done;
    }
    r->ws_alloc = r->ws_size + 64;
    r->ws = (unsigned char *)gp_alloc(r->ws_alloc, 16, "workspace");
    r->p_ws = r->ws;
    r->p_size = r->ws_size;
    r->p_ssq = s->group ? r->host_ssq : NULL;
    r->p_ssk = s->group ? r->host_ssk : NULL;
    r->p_async = rng_chance(&r->rng, 40);
    r->p_method = rng_int(&r->rng, 0, 2);
    if (r->stage == SR_PREPARE) {
        for (i = 0; i < want; ++i) {
            undo u;
            int tries;
            for (tries = 0; tries < 8; ++tries) {
                const void *ws0 = r->p_ws;
                size_t size0 = r->p_size;
                mutate(r, &u);
                c = classify(r);
                if (c.level != CL_UNSAFE) break;
                r->p_ws = (void *)ws0;
                r->p_size = size0;
                appendf(r->what, sizeof r->what, " (undone)");
            }
        }
        c = classify(r);
        if (c.level == CL_UNSAFE) {
            appendf(rec->note, sizeof rec->note, "mutations left an unsafe call (%s): not run; ", c.field);
            goto done;
        }
        rec->forbidden = c.level == CL_FORBIDDEN ? 1 : c.level == CL_ALLOWED ? 0 : -1;
        snprintf(rec->fields, sizeof rec->fields, "%s", c.field);
        appendf(rec->desc, sizeof rec->desc, "; mutated: %s", r->what);
        if (c.level != CL_ALLOWED) appendf(rec->note, sizeof rec->note, "classifier: %s (%s); ", c.field, c.why);
        deferred = c.deferred;
        report(rec);
    }
    if (r->stage != SR_PREPARE && classify_prepare(r).level == CL_UNSAFE) {
        appendf(rec->note, sizeof rec->note, "the prepare after the mutated call would be unsafe: stopped; ");
        goto done;
    }
    if (r->p_async) {
        /* device seqstarts for the async prepare: the device arrays (equal to the host copies unless a
         * mutation changed those) */
        const int32_t *dq = r->p_ssq == r->host_ssq ? s->ssq : r->p_ssq, *dk = r->p_ssk == r->host_ssk ? s->ssk : r->p_ssk;
        if (r->p_ssq == r->host_ssq) memcpy(s->ssq, r->host_ssq, sizeof(int32_t) * (size_t)(s->batch + 1));
        if (r->p_ssk == r->host_ssk) memcpy(s->ssk, r->host_ssk, sizeof(int32_t) * (size_t)(s->batch + 1));
        st = fmha_bwd_launcher_prepare_workspace_async(r->p_null_launcher ? NULL : launcher, r->p_ws, r->p_size, dq, dk, s->stream,
                                                       NULL, r->p_method);
    } else {
        st = fmha_bwd_launcher_prepare_workspace(r->p_null_launcher ? NULL : launcher, r->p_ws, r->p_size, r->p_ssq, r->p_ssk);
    }
    if (r->stage == SR_PREPARE) set_judged(rec, st, r->p_async ? "prepare_workspace_async" : "prepare_workspace");
    else if (st != FMHA_OK) {
        note_status(rec, "prepare (valid)", st);
        if (r->stage == SR_RUN) {
            rec->correct = 0;
            set_judged(rec, st, "prepare (valid setup step)");
        }
    }
    if (st != FMHA_OK) goto done;
    if (r->p_async) {
        /* invalid device seqstarts: the next synchronize of the stream reports them (host backend:
         * INVALID_ARGUMENT from the device kernel of DEVICE and AUTO, ASYNC_FAILURE from the host method) */
        fmha_status sync = fmha_stream_synchronize(s->stream);
        note_status(rec, "synchronize after the async prepare", sync);
        if (sync != FMHA_OK) {
            prepare_failed = 1;
            if (r->stage == SR_PREPARE && rec->status == FMHA_OK) {
                rec->status = sync;
                last_message(rec->message, sizeof rec->message);
                appendf(rec->note, sizeof rec->note, "reported by the synchronize after the prepare; ");
                if (deferred)
                    rec->statuses = STATUS_BIT(r->p_method == FMHA_PREPARE_HOST ? FMHA_ERR_ASYNC_FAILURE : FMHA_ERR_INVALID_ARGUMENT);
            } else if (r->stage == SR_RUN) {
                rec->correct = 0;
                set_judged(rec, sync, "the synchronize after the async prepare (valid setup step)");
                goto done;
            }
        }
    }
    s->ba->workspace = r->p_ws;
    {
        /* 0.2 callers pass the workspace's bytes (or 0: not checked) */
        size_t avail = (size_t)(r->ws + r->ws_alloc - (unsigned char *)r->p_ws);
        int w = rng_int(&r->rng, 0, 2);
        s->ba->workspace_size = w == 0 ? 0 : w == 1 ? r->ws_size : avail;
    }
    if (r->stage == SR_RUN) {
        for (i = 0; i < want; ++i) {
            undo u;
            int tries;
            for (tries = 0; tries < 8; ++tries) {
                mutate(r, &u);
                c = classify(r);
                if (c.level != CL_UNSAFE) break;
                restore(&u);
                appendf(r->what, sizeof r->what, " (undone)");
            }
        }
        c = classify(r);
        if (c.level == CL_UNSAFE) {
            appendf(rec->note, sizeof rec->note, "mutations left an unsafe call (%s): not run; ", c.field);
            goto done;
        }
        rec->forbidden = c.level == CL_FORBIDDEN ? 1 : c.level == CL_ALLOWED ? 0 : -1;
        snprintf(rec->fields, sizeof rec->fields, "%s", c.field);
        if (r->mutations) appendf(rec->desc, sizeof rec->desc, "; mutated: %s", r->what);
        if (c.level != CL_ALLOWED) appendf(rec->note, sizeof rec->note, "classifier: %s (%s); ", c.field, c.why);
        report(rec);
    }
    if (r->stage != SR_RUN && classify_run(r).level == CL_UNSAFE) {
        appendf(rec->note, sizeof rec->note, "the run after the mutated call would be unsafe: stopped; ");
        goto done;
    }
    setup_poison(s, 1);
    st = fmha_bwd_launcher_run(launcher, s->ba, s->stream);
    if (r->stage == SR_RUN) set_judged(rec, st, "fmha_bwd_launcher_run");
    else note_status(rec, "run", st);
    {
        fmha_status sync = fmha_stream_synchronize(s->stream);
        /* nothing may be computed with a workspace that is not prepared for the run: after a prepare that
         * failed on the stream, or with device seqstarts other than the prepared ones */
        int unprepared = prepare_failed;
        if (r->stage == SR_RUN && c.level == CL_FORBIDDEN && c.deferred && s->group && s->ba->seqstart_q && s->ba->seqstart_k &&
            s->ba->batch == s->batch &&
            (memcmp(s->ba->seqstart_q, r->host_ssq, sizeof(int32_t) * (size_t)(s->batch + 1)) != 0 ||
             memcmp(s->ba->seqstart_k, r->host_ssk, sizeof(int32_t) * (size_t)(s->batch + 1)) != 0))
            unprepared = 1;
        note_status(rec, "fmha_stream_synchronize", sync);
        if (unprepared && st == FMHA_OK) {
            static const int t[3] = {TDQ, TDK, TDV};
            int k;
            if (sync == FMHA_OK) {
                appendf(rec->note, sizeof rec->note, "the run with an unprepared workspace synchronized with FMHA_OK; ");
                rec->correct = 0;
            }
            for (k = 0; k < 3; ++k) {
                long written = setup_written(s, t[k]);
                if (written > 0) {
                    appendf(rec->note, sizeof rec->note, "%s: %ld bytes written by a run with an unprepared workspace; ",
                            tensor_names[t[k]], written);
                    rec->correct = 0;
                }
            }
        }
        if (((r->stage == SR_RUN && c.deferred) || (r->stage == SR_PREPARE && deferred)) && rec->status == FMHA_OK &&
            st == FMHA_OK && sync != FMHA_OK) {
            rec->status = sync;
            last_message(rec->message, sizeof rec->message);
            appendf(rec->note, sizeof rec->note, "reported by the synchronize; ");
        }
        valid = r->stage == SR_RUN && r->mutations == 0 && st == FMHA_OK && sync == FMHA_OK;
    }
    if (valid) rec->correct = setup_check(s, 1, rec->note, sizeof rec->note);
done:
    if (launcher) fmha_bwd_launcher_destroy(launcher);
    if (s->stream) fmha_stream_destroy(s->stream);
    rec->phase = 2;
    report(rec);
}

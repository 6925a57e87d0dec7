/*
 * A valid attention problem in guard-paged buffers, and its check against the float64 reference of
 * c_examples/attention_reference.h.
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_reference.h"

const char *const tensor_names[NT] = {"q", "k", "v", "o", "lse", "d_o", "d", "dq", "dk", "dv"};

void appendf(char *buf, size_t size, const char *fmt, ...) {
    size_t used = strlen(buf);
    va_list ap;
    if (used + 1 >= size) return;
    va_start(ap, fmt);
    vsnprintf(buf + used, size - used, fmt, ap);
    va_end(ap);
}

void last_message(char *buf, size_t size) {
    buf[0] = 0;
    fmha_last_error_message(buf, size);
}

/* ---- fp16 ---------------------------------------------------------------------------------------- */

static float from_fp16(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023, bits;
    float f;
    if (exponent == 0) {
        f = ldexpf((float)mantissa, -24);
        return sign ? -f : f;
    }
    if (exponent == 31) bits = sign | 0x7F800000u | (mantissa << 13);
    else bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t to_fp16(float x) {
    /* inputs are in [-1, 1): normal or subnormal halves, round to nearest even */
    uint32_t bits, sign, mantissa;
    int exponent;
    memcpy(&bits, &x, sizeof bits);
    sign = (bits >> 16) & 0x8000u;
    exponent = (int)((bits >> 23) & 255) - 127 + 15;
    mantissa = bits & 0x7FFFFFu;
    if (exponent <= 0) {
        /* subnormal (or zero) half */
        float a = fabsf(x) * 16777216.0f; /* 2^24 */
        uint32_t m = (uint32_t)lrintf(a);
        return (uint16_t)(sign | m);
    }
    if (exponent >= 31) return (uint16_t)(sign | 0x7C00u);
    {
        uint32_t half = sign | ((uint32_t)exponent << 10) | (mantissa >> 13);
        uint32_t rest = mantissa & 0x1FFFu;
        if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
        return (uint16_t)half;
    }
}

static float element_to_float(int dtype, uint16_t e) {
    return dtype == FMHA_DTYPE_BF16 ? from_bf16(e) : from_fp16(e);
}

static uint16_t float_to_element(int dtype, float x) {
    return dtype == FMHA_DTYPE_BF16 ? to_bf16(x) : to_fp16(x);
}

/* ---- tensor shapes ------------------------------------------------------------------------------- */

int tensor_elem_bytes(const setup *s, int i) {
    (void)s;
    return (i == TLSE || i == TD) ? 4 : 2;
}

int tensor_heads(const setup *s, int i) {
    switch (i) {
    case TK: case TV: case TDK: case TDV: return s->hk;
    default: return s->hq;
    }
}

int tensor_rows(const setup *s, int i) {
    switch (i) {
    case TK: case TV: case TDK: case TDV: return s->sk;
    default: return s->sq;
    }
}

int tensor_cols(const setup *s, int i) {
    switch (i) {
    case TQ: case TK: case TDQ: case TDK: return s->dq;
    case TLSE: case TD: return 1;
    default: return s->dv;
    }
}

int tensor_extent(const setup *s, int i, uint64_t *bytes) {
    const tensor_plan *p = &s->plan[i];
    __extension__ typedef __int128 wide;
    wide b = s->batch, h = tensor_heads(s, i), r = tensor_rows(s, i), c = tensor_cols(s, i), elems;
    /* group mode ignores batch_stride (any value is valid) */
    if ((!s->group && p->batch_stride < 0) || p->head_stride < 0 || p->row_stride < 0) return -1;
    if (b <= 0 || h <= 0 || r <= 0 || c <= 0) {
        *bytes = 0;
        return 0;
    }
    elems = (s->group ? 0 : (b - 1) * p->batch_stride) + (h - 1) * p->head_stride + (r - 1) * p->row_stride + c;
    elems *= tensor_elem_bytes(s, i);
    if (elems >= ((wide)1 << 63)) return -1;
    *bytes = (uint64_t)elems;
    return 0;
}

/* ---- a default problem --------------------------------------------------------------------------- */

void setup_default(setup *s, int op_bwd, int group, int det) {
    memset(s, 0, sizeof *s);
    s->op_bwd = op_bwd;
    s->group = group;
    s->det = det;
    s->dtype = FMHA_DTYPE_BF16;
    s->hq = 4;
    s->hk = 2;
    s->dq = s->dv = 32;
    s->wl = -1;
    s->wr = 0;
    if (!group) {
        s->batch = 2;
        s->sq = 16;
        s->sk = 24;
        s->max_sq = s->sq;
        s->max_sk = s->sk;
        s->mask = FMHA_MASK_TOP_LEFT;
    } else {
        static const int32_t lq[3] = {5, 0, 12}, lk[3] = {8, 12, 10};
        int b;
        s->batch = 3;
        s->sq = s->sk = 0;
        for (b = 0; b < 3; ++b) {
            s->lens_q[b] = lq[b];
            s->lens_k[b] = lk[b];
            s->sq += lq[b];
            s->sk += lk[b];
        }
        s->max_sq = 12;
        s->max_sk = 12;
        s->mask = FMHA_MASK_BOTTOM_RIGHT;
    }
}

void setup_default_layout(setup *s) {
    int i;
    for (i = 0; i < NT; ++i) {
        tensor_plan *p = &s->plan[i];
        int64_t h = tensor_heads(s, i), r = tensor_rows(s, i), c = tensor_cols(s, i);
        p->buf = i;
        p->offset = 0;
        p->raw = 0;
        if (i == TLSE || i == TD) {
            p->row_stride = 1;
            p->head_stride = r;
            p->batch_stride = s->group ? 0 : h * r;
        } else {
            p->row_stride = h * c;
            p->head_stride = c;
            p->batch_stride = s->group ? 0 : r * h * c;
        }
    }
    if (!s->op_bwd) {
        s->plan[TDO].buf = s->plan[TD].buf = s->plan[TDQ].buf = s->plan[TDK].buf = s->plan[TDV].buf = BUF_NULL;
    }
    s->nbuf = NT;
}

static int is_output(const setup *s, int i, int backward) {
    (void)s;
    if (backward) return i == TD || i == TDQ || i == TDK || i == TDV;
    return i == TO || i == TLSE;
}

/* Calls fn(s, tensor, element address, user) for every element (b, h, r, c) of tensor i (group mode:
 * every physical row of 0..total). */
static void for_each_element(const setup *s, int i, void (*fn)(const setup *, int, unsigned char *, void *), void *user) {
    const fmha_tensor *t = &s->t[i];
    const tensor_plan *p = &s->plan[i];
    int64_t b, h, r, c, eb = tensor_elem_bytes(s, i);
    int64_t nb = s->group ? 1 : s->batch;
    uint64_t bytes = 0;
    /* only tensors that lie inside their own buffer (a mutated plan may describe anything) */
    if (t->data == NULL || p->buf < 0 || tensor_extent(s, i, &bytes) != 0) return;
    if (p->offset + bytes > s->buf_bytes[p->buf]) return;
    for (b = 0; b < nb; ++b)
        for (h = 0; h < tensor_heads(s, i); ++h)
            for (r = 0; r < tensor_rows(s, i); ++r)
                for (c = 0; c < tensor_cols(s, i); ++c)
                    fn(s, i, (unsigned char *)t->data + (b * t->batch_stride + h * t->head_stride + r * t->row_stride + c) * eb,
                       user);
}

static void poison_element(const setup *s, int i, unsigned char *at, void *user) {
    (void)user;
    memset(at, 0xFF, (size_t)tensor_elem_bytes(s, i));
}

void setup_poison(setup *s, int backward) {
    int i;
    for (i = 0; i < NT; ++i)
        if (is_output(s, i, backward) && s->plan[i].buf >= 0) for_each_element(s, i, poison_element, NULL);
}

static void unwritten_element(const setup *s, int i, unsigned char *at, void *user) {
    int e;
    for (e = 0; e < tensor_elem_bytes(s, i); ++e)
        if (at[e] != 0xFF) ++*(long *)user;
}

long setup_written(const setup *s, int i) {
    long written = 0;
    if (s->plan[i].buf < 0) return 0;
    for_each_element(s, i, unwritten_element, &written);
    return written;
}

void setup_sync_tensors(setup *s) {
    int i;
    for (i = 0; i < NT; ++i) {
        const tensor_plan *p = &s->plan[i];
        fmha_tensor *t = &s->t[i];
        if (p->buf >= 0) t->data = s->bufs[p->buf] + p->offset;
        else if (p->buf == BUF_RAW) t->data = (void *)p->raw;
        else t->data = NULL;
        t->batch_stride = p->batch_stride;
        t->head_stride = p->head_stride;
        t->row_stride = p->row_stride;
    }
    if (s->fa) {
        s->fa->q = s->t[TQ];
        s->fa->k = s->t[TK];
        s->fa->v = s->t[TV];
        s->fa->o = s->t[TO];
        s->fa->lse = s->t[TLSE];
    }
    if (s->ba) {
        s->ba->q = s->t[TQ];
        s->ba->k = s->t[TK];
        s->ba->v = s->t[TV];
        s->ba->o = s->t[TO];
        s->ba->lse = s->t[TLSE];
        s->ba->d_o = s->t[TDO];
        s->ba->d = s->t[TD];
        s->ba->dq = s->t[TDQ];
        s->ba->dk = s->t[TDK];
        s->ba->dv = s->t[TDV];
    }
}

/* Largest buffer a plan may ask for: a plan whose extent is larger (a forbidden overflow) gets this. */
#define BUFFER_CAP ((uint64_t)64 << 20)

void setup_alloc(setup *s, uint64_t *rng) {
    uint64_t need[MAX_BUFFERS] = {0};
    size_t align[MAX_BUFFERS];
    int elem4[MAX_BUFFERS] = {0};
    int i, b;
    for (b = 0; b < MAX_BUFFERS; ++b) align[b] = 2;
    for (i = 0; i < NT; ++i) {
        const tensor_plan *p = &s->plan[i];
        uint64_t bytes = 0;
        if (p->buf < 0) continue;
        if (tensor_extent(s, i, &bytes) != 0 || bytes > BUFFER_CAP) bytes = 4096;
        if (p->offset + bytes > need[p->buf]) need[p->buf] = p->offset + bytes;
        if (tensor_elem_bytes(s, i) == 4) {
            align[p->buf] = 4;
            elem4[p->buf] = 1;
        }
    }
    for (b = 0; b < s->nbuf && b < MAX_BUFFERS; ++b) {
        char name[24];
        int first = -1;
        for (i = 0; i < NT; ++i)
            if (s->plan[i].buf == b) {
                first = i;
                break;
            }
        if (first < 0) {
            s->bufs[b] = NULL;
            s->buf_bytes[b] = 0;
            continue;
        }
        snprintf(name, sizeof name, "%s", tensor_names[first]);
        s->bufs[b] = (unsigned char *)gp_alloc((size_t)need[b], align[b], name);
        s->buf_bytes[b] = (size_t)need[b];
        /* inputs: random values in [-1, 1) of the element type */
        if (elem4[b]) {
            float *f = (float *)s->bufs[b];
            size_t n = (size_t)need[b] / 4, j;
            for (j = 0; j < n; ++j) f[j] = (float)((rng_next(rng) >> 40) / 16777216.0 * 2.0 - 1.0);
        } else {
            uint16_t *e = (uint16_t *)s->bufs[b];
            size_t n = (size_t)need[b] / 2, j;
            for (j = 0; j < n; ++j) e[j] = float_to_element(s->dtype, (float)((rng_next(rng) >> 40) / 16777216.0 * 2.0 - 1.0));
        }
    }
    /* seqstarts (also in batch mode, for the cases that pass them there) */
    {
        int nb = s->batch >= 0 && s->batch <= 16 ? s->batch : 0;
        s->ssq = (int32_t *)gp_alloc((size_t)(nb + 1) * 4, 4, "seqstart_q");
        s->ssk = (int32_t *)gp_alloc((size_t)(nb + 1) * 4, 4, "seqstart_k");
        s->ssq[0] = s->ssk[0] = 0;
        for (b = 0; b < nb; ++b) {
            int lq = s->group ? s->lens_q[b] : s->sq, lk = s->group ? s->lens_k[b] : s->sk;
            s->ssq[b + 1] = s->ssq[b] + lq;
            s->ssk[b + 1] = s->ssk[b] + lk;
        }
    }
    /* structs, each flush against a guard page */
    s->ft = (fmha_fwd_traits *)gp_alloc(sizeof *s->ft, 8, "fwd_traits");
    s->fa = (fmha_fwd_args *)gp_alloc(sizeof *s->fa, 8, "fwd_args");
    s->bt = (fmha_bwd_traits *)gp_alloc(sizeof *s->bt, 8, "bwd_traits");
    s->ba = (fmha_bwd_args *)gp_alloc(sizeof *s->ba, 8, "bwd_args");
    memset(s->ft, 0, sizeof *s->ft);
    memset(s->fa, 0, sizeof *s->fa);
    memset(s->bt, 0, sizeof *s->bt);
    memset(s->ba, 0, sizeof *s->ba);
    s->ft->struct_size = sizeof *s->ft;
    s->ft->dtype = s->dtype;
    s->ft->hdim_q = s->dq;
    s->ft->hdim_v = s->dv;
    s->ft->is_group_mode = s->group;
    s->ft->mask_type = s->mask;
    s->fa->struct_size = sizeof *s->fa;
    s->fa->seqstart_q = s->group ? s->ssq : NULL;
    s->fa->seqstart_k = s->group ? s->ssk : NULL;
    s->fa->batch = s->batch;
    s->fa->seqlen_q = s->sq;
    s->fa->seqlen_k = s->sk;
    s->fa->max_seqlen_q = s->group ? s->max_sq : s->sq;
    s->fa->max_seqlen_k = s->group ? s->max_sk : s->sk;
    s->fa->nhead_q = s->hq;
    s->fa->nhead_k = s->hk;
    s->fa->scale = s->scale;
    s->fa->window_size_left = s->wl;
    s->fa->window_size_right = s->wr;
    s->bt->struct_size = sizeof *s->bt;
    s->bt->seqlen_q = s->sq;
    s->bt->seqlen_k = s->sk;
    s->bt->batch = s->batch;
    s->bt->max_seqlen_q = s->group ? s->max_sq : s->sq;
    s->bt->max_seqlen_k = s->group ? s->max_sk : s->sk;
    s->bt->hdim_q = s->dq;
    s->bt->hdim_v = s->dv;
    s->bt->nhead_q = s->hq;
    s->bt->nhead_k = s->hk;
    s->bt->dtype = s->dtype;
    s->bt->is_group_mode = s->group;
    s->bt->mask_type = s->mask;
    s->bt->is_deterministic = s->det;
    s->ba->struct_size = sizeof *s->ba;
    s->ba->seqstart_q = s->fa->seqstart_q;
    s->ba->seqstart_k = s->fa->seqstart_k;
    s->ba->batch = s->batch;
    s->ba->seqlen_q = s->sq;
    s->ba->seqlen_k = s->sk;
    s->ba->max_seqlen_q = s->fa->max_seqlen_q;
    s->ba->max_seqlen_k = s->fa->max_seqlen_k;
    s->ba->nhead_q = s->hq;
    s->ba->nhead_k = s->hk;
    s->ba->hdim_q = s->dq;
    s->ba->hdim_v = s->dv;
    s->ba->scale = s->scale;
    s->ba->window_size_left = s->wl;
    s->ba->window_size_right = s->wr;
    setup_sync_tensors(s);
    setup_poison(s, 0);
    if (s->op_bwd) setup_poison(s, 1);
}

void setup_free(setup *s) {
    int b;
    for (b = 0; b < MAX_BUFFERS; ++b) {
        gp_free(s->bufs[b]);
        s->bufs[b] = NULL;
    }
    gp_free(s->ssq);
    gp_free(s->ssk);
    gp_free(s->ft);
    gp_free(s->fa);
    gp_free(s->bt);
    gp_free(s->ba);
    s->ssq = s->ssk = NULL;
    s->ft = NULL;
    s->fa = NULL;
    s->bt = NULL;
    s->ba = NULL;
}

fmha_status setup_run_forward(setup *s) {
    fmha_status st;
    setup_poison(s, 0);
    st = fmha_fwd(s->ft, s->fa, s->stream);
    if (st != FMHA_OK) return st;
    return fmha_stream_synchronize(s->stream);
}

/* ---- the float64 check --------------------------------------------------------------------------- */

/* Dense [head][row][col] doubles of batch b (rows r0 .. r0 + rows of the tensor, group: physical). */
static void gather(const setup *s, int i, int b, int r0, int rows, double *out) {
    const fmha_tensor *t = &s->t[i];
    int heads = tensor_heads(s, i), cols = tensor_cols(s, i), h, r, c;
    int64_t base = s->group ? 0 : (int64_t)b * t->batch_stride;
    for (h = 0; h < heads; ++h)
        for (r = 0; r < rows; ++r)
            for (c = 0; c < cols; ++c) {
                int64_t at = base + h * t->head_stride + (int64_t)(r0 + r) * t->row_stride + c;
                double value;
                if (tensor_elem_bytes(s, i) == 4) value = ((const float *)t->data)[at];
                else value = element_to_float(s->dtype, ((const uint16_t *)t->data)[at]);
                out[((size_t)h * rows + r) * cols + c] = value;
            }
}

static int compare(const char *what, int b, const double *kernel, const double *reference, size_t n, char *note,
                   size_t note_size) {
    double error = relative_error(kernel, reference, n);
    if (!(error < 2e-2)) {
        appendf(note, note_size, "%s of batch %d: relative error %.3g (limit 2e-2)%s; ", what, b, error,
                error == INFINITY ? " (NaN: an output left unwritten?)" : "");
        return 0;
    }
    return 1;
}

/* compare() with the error relative to the largest of `magnitude` (elementwise at least |reference|):
 * for outputs that are sums of cancelling terms. */
static int compare_to_magnitude(const char *what, int b, const double *kernel, const double *reference,
                                const double *magnitude, size_t n, char *note, size_t note_size) {
    double error = 0.0, scale = 1e-30;
    size_t i;
    for (i = 0; i < n; ++i) {
        double diff = fabs(kernel[i] - reference[i]);
        if (kernel[i] != kernel[i]) diff = INFINITY;
        if (diff > error) error = diff;
        if (magnitude[i] > scale) scale = magnitude[i];
    }
    error /= scale;
    if (!(error < 2e-2)) {
        appendf(note, note_size, "%s of batch %d: error %.3g of its terms' magnitude (limit 2e-2); ", what, b, error);
        return 0;
    }
    return 1;
}

static int compare_lse(int b, const double *kernel, const double *reference, size_t n, char *note, size_t note_size) {
    size_t j;
    for (j = 0; j < n; ++j) {
        double k = kernel[j], r = reference[j];
        if (r == -INFINITY ? k != -INFINITY : !(fabs(k - r) < 2e-2)) {
            appendf(note, note_size, "lse of batch %d: element %zu is %g, reference %g; ", b, j, k, r);
            return 0;
        }
    }
    return 1;
}

/* The backward of attention_reference.h with one change: D = rowsum(dO * O) uses the O the backward
 * was given (the kernel's forward output, rounded to fp16/bf16) instead of the exact one. It is the
 * exact backward of the call as made; on tiny problems, where dS = P (dP - D) cancels, the rounding of
 * O alone moves dQ/dK by more than the examples' 2e-2 relative to the exact reference. dq_mag and
 * dk_mag get the sums of the terms' magnitudes (sum |scale dS k|, sum |scale dS q|): the kernels round dS
 * to 16 bits for their dQ/dK products, as FlashAttention does, so where those terms cancel (over a
 * GQA group's heads, or a row of two keys) their error is bounded by these sums, not by dQ/dK. */
static void reference_backward_given_o(const reference_shape *s, const double *q, const double *k, const double *v,
                                       const double *dout, const double *o_given, double *dq, double *dk,
                                       double *dq_mag, double *dk_mag) {
    int d = s->dim, group = s->hq / s->hk, h, i, j, c;
    double *p = (double *)malloc(sizeof(double) * (size_t)(s->sk > 0 ? s->sk : 1));
    memset(dk, 0, sizeof(double) * (size_t)s->hk * s->sk * d);
    memset(dk_mag, 0, sizeof(double) * (size_t)s->hk * s->sk * d);
    for (h = 0; h < s->hq; ++h) {
        int kv = h / group;
        for (i = 0; i < s->sq; ++i) {
            const double *qi = q + ((size_t)h * s->sq + i) * d, *gi = dout + ((size_t)h * s->sq + i) * d;
            const double *oi = o_given + ((size_t)h * s->sq + i) * d;
            double *dqi = dq + ((size_t)h * s->sq + i) * d;
            double max = -INFINITY, sum = 0.0, big_d = 0.0;
            for (j = 0; j < s->sk; ++j) {
                const double *kj = k + ((size_t)kv * s->sk + j) * d;
                double dot = 0.0;
                for (c = 0; c < d; ++c) dot += qi[c] * kj[c];
                p[j] = reference_kept(s, i, j) ? dot * s->scale : -INFINITY;
                if (p[j] > max) max = p[j];
            }
            for (j = 0; j < s->sk; ++j) {
                p[j] = max == -INFINITY ? 0.0 : exp(p[j] - max);
                sum += p[j];
            }
            double *dqi_mag = dq_mag + ((size_t)h * s->sq + i) * d;
            for (c = 0; c < d; ++c) dqi[c] = 0.0, dqi_mag[c] = 0.0, big_d += gi[c] * oi[c];
            for (j = 0; j < s->sk; ++j) {
                const double *kj = k + ((size_t)kv * s->sk + j) * d, *vj = v + ((size_t)kv * s->sk + j) * d;
                double dp = 0.0, ds;
                if (sum > 0.0) p[j] /= sum;
                if (p[j] == 0.0) continue;
                for (c = 0; c < d; ++c) dp += gi[c] * vj[c];
                ds = p[j] * (dp - big_d);
                for (c = 0; c < d; ++c) {
                    size_t at = ((size_t)kv * s->sk + j) * d + c;
                    dqi[c] += s->scale * ds * kj[c];
                    dk[at] += s->scale * ds * qi[c];
                    dqi_mag[c] += fabs(s->scale * ds * kj[c]);
                    dk_mag[at] += fabs(s->scale * ds * qi[c]);
                }
            }
        }
    }
    free(p);
}

int setup_check(const setup *s, int backward, char *note, size_t note_size) {
    int b, ok = 1;
    int window_ok = s->mask == FMHA_MASK_NONE ? (s->wl == -1 && s->wr == -1) : (s->wl == -1 && s->wr == 0);
    (void)&gather_bf16;
    (void)&random_unit;
    if (s->dq != s->dv || !window_ok || s->hk <= 0 || s->hq % s->hk != 0) return -1;
    for (b = 0; b < s->batch; ++b) {
        int sq = s->group ? s->lens_q[b] : s->sq, sk = s->group ? s->lens_k[b] : s->sk;
        int q0 = s->group ? s->ssq[b] : 0, k0 = s->group ? s->ssk[b] : 0;
        size_t qs = (size_t)s->hq * sq * s->dq, ks = (size_t)s->hk * sk * s->dq, ls = (size_t)s->hq * sq;
        double *mem = (double *)malloc(sizeof(double) * (8 * qs + 8 * ks + 2 * ls + 8));
        double *q = mem, *dout = q + qs, *o = dout + qs, *dq = o + qs, *o_k = dq + qs, *dq_k = o_k + qs;
        double *k = dq_k + qs, *v = k + ks, *dk = v + ks, *dv = dk + ks, *dk_k = dv + ks, *dv_k = dk_k + ks;
        double *lse = dv_k + ks, *lse_k = lse + ls;
        reference_shape shape;
        if (!mem) return -1;
        shape.sq = sq;
        shape.sk = sk;
        shape.hq = s->hq;
        shape.hk = s->hk;
        shape.dim = s->dq;
        shape.causal = s->mask != FMHA_MASK_NONE;
        shape.bottom_right = s->mask == FMHA_MASK_BOTTOM_RIGHT;
        shape.scale = s->scale != 0.0f ? (double)s->scale : 1.0 / sqrt((double)s->dq);
        gather(s, TQ, b, q0, sq, q);
        gather(s, TK, b, k0, sk, k);
        gather(s, TV, b, k0, sk, v);
        if (backward) gather(s, TDO, b, q0, sq, dout);
        else memset(dout, 0, sizeof(double) * qs);
        reference_attention(&shape, q, k, v, dout, o, lse, dq, dk, dv);
        if (qs > 0) {
            gather(s, TO, b, q0, sq, o_k);
            ok &= compare("o", b, o_k, o, qs, note, note_size);
            if (s->t[TLSE].data != NULL) {
                gather(s, TLSE, b, q0, sq, lse_k);
                ok &= compare_lse(b, lse_k, lse, ls, note, note_size);
            }
        }
        if (backward) {
            int exact_ok = 1;
            char exact_note[400] = "";
            if (qs > 0) gather(s, TDQ, b, q0, sq, dq_k);
            if (ks > 0) {
                gather(s, TDK, b, k0, sk, dk_k);
                gather(s, TDV, b, k0, sk, dv_k);
                ok &= compare("dv", b, dv_k, dv, ks, note, note_size);
            }
            if (qs > 0) exact_ok &= compare("dq", b, dq_k, dq, qs, exact_note, sizeof exact_note);
            if (ks > 0) exact_ok &= compare("dk", b, dk_k, dk, ks, exact_note, sizeof exact_note);
            if (!exact_ok) {
                /* within 2e-2 of the exact backward for the O the call passed? */
                double *alt = (double *)malloc(sizeof(double) * (2 * qs + 2 * ks + 2));
                double *alt_dq = alt, *alt_dk = alt + qs, *mag_dq = alt_dk + ks, *mag_dk = mag_dq + qs;
                char alt_note[400] = "";
                int alt_ok = 1;
                if (!alt) return -1;
                gather(s, TO, b, q0, sq, o_k);
                reference_backward_given_o(&shape, q, k, v, dout, o_k, alt_dq, alt_dk, mag_dq, mag_dk);
                if (qs > 0) alt_ok &= compare_to_magnitude("dq", b, dq_k, alt_dq, mag_dq, qs, alt_note, sizeof alt_note);
                if (ks > 0) alt_ok &= compare_to_magnitude("dk", b, dk_k, alt_dk, mag_dk, ks, alt_note, sizeof alt_note);
                free(alt);
                if (!alt_ok) {
                    ok = 0;
                    appendf(note, note_size, "vs the exact reference: %svs the reference given the kernel's O, to the terms' magnitude: %s", exact_note,
                            alt_note);
                }
            }
        }
        free(mem);
    }
    return ok;
}

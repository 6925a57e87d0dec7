/*
 * A naive double-precision attention reference for the examples (one sequence, dense [head][row][dim]
 * arrays), plus bf16 conversion helpers. Causal masks are aligned to the bottom-right corner when
 * `bottom_right` is set (flash-attn's convention) and to the top-left corner otherwise.
 */
#ifndef FMHA_EXAMPLES_ATTENTION_REFERENCE_H
#define FMHA_EXAMPLES_ATTENTION_REFERENCE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* bf16 <-> float: bf16 is the upper half of an IEEE float; round to nearest even. */
static uint16_t to_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static float from_bf16(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Uniform in [-1, 1), xorshift. */
static float random_unit(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)(*state >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

typedef struct {
    int sq, sk, hq, hk, dim;
    int causal, bottom_right;
    double scale;
} reference_shape;

static int reference_kept(const reference_shape *s, int i, int j) {
    int offset = s->bottom_right ? s->sk - s->sq : 0;
    return !s->causal || j <= i + offset;
}

/*
 * Forward and backward of one sequence. Inputs q [hq][sq][d], k/v [hk][sk][d], dout [hq][sq][d];
 * outputs o, dq [hq][sq][d], lse [hq][sq], dk/dv [hk][sk][d] (summed over each kv head's query heads).
 * With dout NULL only the forward runs, and dq, dk, dv may be NULL.
 */
static void reference_attention(const reference_shape *s, const double *q, const double *k, const double *v,
                                const double *dout, double *o, double *lse, double *dq, double *dk, double *dv) {
    int d = s->dim, group = s->hq / s->hk, h, i, j, c;
    double *p = (double *)malloc(sizeof(double) * (size_t)(s->sk > 0 ? s->sk : 1));
    if (dout) {
        memset(dk, 0, sizeof(double) * (size_t)s->hk * s->sk * d);
        memset(dv, 0, sizeof(double) * (size_t)s->hk * s->sk * d);
    }
    for (h = 0; h < s->hq; ++h) {
        int kv = h / group;
        for (i = 0; i < s->sq; ++i) {
            const double *qi = q + ((size_t)h * s->sq + i) * d, *gi;
            double *oi = o + ((size_t)h * s->sq + i) * d, *dqi;
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
            lse[(size_t)h * s->sq + i] = sum > 0.0 ? max + log(sum) : -INFINITY;
            for (c = 0; c < d; ++c) oi[c] = 0.0;
            for (j = 0; j < s->sk; ++j) {
                if (sum > 0.0) p[j] /= sum;
                for (c = 0; c < d; ++c) oi[c] += p[j] * v[((size_t)kv * s->sk + j) * d + c];
            }
            if (!dout) continue;
            gi = dout + ((size_t)h * s->sq + i) * d;
            dqi = dq + ((size_t)h * s->sq + i) * d;
            for (c = 0; c < d; ++c) dqi[c] = 0.0;
            for (c = 0; c < d; ++c) big_d += gi[c] * oi[c];
            for (j = 0; j < s->sk; ++j) {
                const double *kj = k + ((size_t)kv * s->sk + j) * d, *vj = v + ((size_t)kv * s->sk + j) * d;
                double dp = 0.0, ds;
                if (p[j] == 0.0) continue;
                for (c = 0; c < d; ++c) dp += gi[c] * vj[c];
                ds = p[j] * (dp - big_d);
                for (c = 0; c < d; ++c) {
                    dqi[c] += s->scale * ds * kj[c];
                    dk[((size_t)kv * s->sk + j) * d + c] += s->scale * ds * qi[c];
                    dv[((size_t)kv * s->sk + j) * d + c] += p[j] * gi[c];
                }
            }
        }
    }
    free(p);
}

/*
 * Copies `heads` x `rows` x `dim` elements of a bf16 tensor into a dense double array [head][row][dim].
 * Element (h, r, c) is at base + h * head_stride + r * row_stride + c.
 */
static void gather_bf16(const uint16_t *base, int heads, int rows, int dim, size_t head_stride, size_t row_stride,
                        double *out) {
    int h, r, c;
    for (h = 0; h < heads; ++h)
        for (r = 0; r < rows; ++r)
            for (c = 0; c < dim; ++c)
                out[((size_t)h * rows + r) * dim + c] = from_bf16(base[h * head_stride + r * row_stride + c]);
}

/* Largest |kernel - reference| relative to the largest |reference| (NaN counts as a failure). */
static double relative_error(const double *kernel, const double *reference, size_t n) {
    double error = 0.0, scale = 1e-30;
    size_t i;
    for (i = 0; i < n; ++i) {
        double diff = fabs(kernel[i] - reference[i]);
        if (kernel[i] != kernel[i]) return INFINITY;
        if (diff > error) error = diff;
        if (fabs(reference[i]) > scale) scale = fabs(reference[i]);
    }
    return error / scale;
}

#endif

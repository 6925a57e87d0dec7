/*
 * 03_varlen_deterministic_bwd: a packed variable-length batch (group mode) with a deterministic
 * backward.
 *
 *   Sequences of different lengths are packed back to back in [total][head][dim] tensors and
 *   described by seqstart_q/seqstart_k (cumulative offsets, on the device for the kernels and on the
 *   host for prepare_workspace). One sequence has no queries (its dK/dV come back zero). bf16, 4 query
 *   heads sharing one kv head (MQA), causal mask aligned to the bottom-right corner (flash-attn's).
 *   The deterministic backward runs twice: dQ, dK and dV must be bitwise identical, and match a naive
 *   double-precision reference.
 *
 * Exit status: 0 on success, 1 on a failure, 77 when a GPU build runs without a GPU.
 */
#include <fmha.h>

#include <stdio.h>
#include <stdlib.h>

#include "attention_reference.h"
#include "example_support.h"

enum { BATCH = 3, HEADS_Q = 4, HEADS_K = 1, DIM = 64 };
static const int32_t seqstart_q[BATCH + 1] = {0, 37, 37, 167};  /* lengths 37, 0, 130 */
static const int32_t seqstart_k[BATCH + 1] = {0, 50, 114, 244}; /* lengths 50, 64, 130 */
#define TOTAL_Q 167
#define TOTAL_K 244
#define MAX_Q 130
#define MAX_K 130

/* [total][heads][dim]: in group mode the batch stride is unused (rows start at seqstart[b]). */
static fmha_tensor thd(void *data, int heads) {
    fmha_tensor t;
    t.data = data;
    t.batch_stride = 0;
    t.head_stride = DIM;
    t.row_stride = (int64_t)heads * DIM;
    return t;
}

static fmha_tensor lse_layout(void *data) {
    fmha_tensor t;
    t.data = data;
    t.batch_stride = 0;
    t.head_stride = TOTAL_Q;
    t.row_stride = 1;
    return t;
}

int main(void) {
    const size_t nq = (size_t)TOTAL_Q * HEADS_Q * DIM, nk = (size_t)TOTAL_K * HEADS_K * DIM;
    const size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    int exit_code = 0, b, run;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    uint16_t *host[8] = {0}, *first[3] = {0}; /* q k v do o dq dk dv; first run's dq dk dv */
    void *dev[10] = {0};                      /* q k v do o dq dk dv lse d */
    void *starts_q = NULL, *starts_k = NULL, *workspace = NULL;
    size_t workspace_size = 0, i;
    fmha_bwd_launcher *launcher = NULL;
    fmha_stream_t stream = NULL;
    double worst[4] = {0, 0, 0, 0};
    /* Zeroed: what this program does not set (and what a later header appends) reads as its default. */
    fmha_fwd_traits fwd_traits = {0};
    fmha_fwd_args fwd_args = {0};
    fmha_bwd_traits bwd_traits = {0};
    fmha_bwd_args bwd_args = {0};

    for (i = 0; i < 8; ++i)
        if (!(host[i] = (uint16_t *)malloc(sizes[i] * sizeof(uint16_t)))) return 1;
    for (i = 0; i < 3; ++i)
        if (!(first[i] = (uint16_t *)malloc(sizes[5 + i] * sizeof(uint16_t)))) return 1;
    for (i = 0; i < 4; ++i) {
        size_t j;
        for (j = 0; j < sizes[i]; ++j) host[i][j] = to_bf16(random_unit(&rng));
    }
    for (i = 0; i < 8; ++i) TRY(fmha_device_malloc(&dev[i], sizes[i] * sizeof(uint16_t)));
    TRY(fmha_device_malloc(&dev[8], (size_t)HEADS_Q * TOTAL_Q * sizeof(float)));
    TRY(fmha_device_malloc(&dev[9], (size_t)HEADS_Q * TOTAL_Q * sizeof(float)));
    TRY(fmha_device_malloc(&starts_q, sizeof seqstart_q));
    TRY(fmha_device_malloc(&starts_k, sizeof seqstart_k));
    TRY(fmha_stream_create(&stream));
    for (i = 0; i < 4; ++i)
        TRY(fmha_memcpy_async(dev[i], host[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_HOST_TO_DEVICE, stream));
    TRY(fmha_memcpy_async(starts_q, seqstart_q, sizeof seqstart_q, FMHA_MEMCPY_HOST_TO_DEVICE, stream));
    TRY(fmha_memcpy_async(starts_k, seqstart_k, sizeof seqstart_k, FMHA_MEMCPY_HOST_TO_DEVICE, stream));

    fwd_traits.struct_size = sizeof fwd_traits;
    fwd_traits.dtype = FMHA_DTYPE_BF16;
    fwd_traits.hdim_q = fwd_traits.hdim_v = DIM;
    fwd_traits.is_group_mode = 1;
    fwd_traits.mask_type = FMHA_MASK_BOTTOM_RIGHT;
    fwd_traits.bias_type = FMHA_BIAS_NONE;
    fwd_traits.has_dropout = 0;
    fwd_args.struct_size = sizeof fwd_args;
    fwd_args.q = thd(dev[0], HEADS_Q);
    fwd_args.k = thd(dev[1], HEADS_K);
    fwd_args.v = thd(dev[2], HEADS_K);
    fwd_args.o = thd(dev[4], HEADS_Q);
    fwd_args.lse = lse_layout(dev[8]);
    fwd_args.seqstart_q = (const int32_t *)starts_q;
    fwd_args.seqstart_k = (const int32_t *)starts_k;
    fwd_args.seqlen_q_ptr = fwd_args.seqlen_k_ptr = NULL; /* logical = physical lengths */
    fwd_args.batch = BATCH;
    fwd_args.seqlen_q = TOTAL_Q;
    fwd_args.seqlen_k = TOTAL_K;
    fwd_args.max_seqlen_q = MAX_Q;
    fwd_args.max_seqlen_k = MAX_K;
    fwd_args.nhead_q = HEADS_Q;
    fwd_args.nhead_k = HEADS_K;
    fwd_args.scale = 0.0f;
    fwd_args.window_size_left = -1;
    fwd_args.window_size_right = 0;
    TRY(fmha_fwd(&fwd_traits, &fwd_args, stream));

    bwd_traits.struct_size = sizeof bwd_traits;
    bwd_traits.seqlen_q = TOTAL_Q;
    bwd_traits.seqlen_k = TOTAL_K;
    bwd_traits.batch = BATCH;
    bwd_traits.max_seqlen_q = MAX_Q;
    bwd_traits.max_seqlen_k = MAX_K;
    bwd_traits.hdim_q = bwd_traits.hdim_v = DIM;
    bwd_traits.nhead_q = HEADS_Q;
    bwd_traits.nhead_k = HEADS_K;
    bwd_traits.dtype = FMHA_DTYPE_BF16;
    bwd_traits.is_group_mode = 1;
    bwd_traits.mask_type = FMHA_MASK_BOTTOM_RIGHT;
    bwd_traits.bias_type = FMHA_BIAS_NONE;
    bwd_traits.has_dbias = bwd_traits.has_dropout = bwd_traits.is_store_randval = 0;
    bwd_traits.is_deterministic = 1;
    TRY(fmha_bwd_launcher_create(&bwd_traits, &launcher));
    TRY(fmha_bwd_launcher_workspace_size(launcher, &workspace_size));
    TRY(fmha_device_malloc(&workspace, workspace_size));
    /* The schedule is built from the host copies of the sequence starts. */
    TRY(fmha_bwd_launcher_prepare_workspace(launcher, workspace, workspace_size, seqstart_q, seqstart_k));
    bwd_args.struct_size = sizeof bwd_args;
    bwd_args.q = fwd_args.q;
    bwd_args.k = fwd_args.k;
    bwd_args.v = fwd_args.v;
    bwd_args.o = fwd_args.o;
    bwd_args.lse = fwd_args.lse;
    bwd_args.d_o = thd(dev[3], HEADS_Q);
    bwd_args.d = lse_layout(dev[9]);
    bwd_args.dq = thd(dev[5], HEADS_Q);
    bwd_args.dk = thd(dev[6], HEADS_K);
    bwd_args.dv = thd(dev[7], HEADS_K);
    bwd_args.workspace = workspace;
    bwd_args.workspace_size = workspace_size;
    bwd_args.seqstart_q = fwd_args.seqstart_q;
    bwd_args.seqstart_k = fwd_args.seqstart_k;
    bwd_args.seqlen_q_ptr = bwd_args.seqlen_k_ptr = NULL;
    bwd_args.batch = BATCH;
    bwd_args.seqlen_q = TOTAL_Q;
    bwd_args.seqlen_k = TOTAL_K;
    bwd_args.max_seqlen_q = MAX_Q;
    bwd_args.max_seqlen_k = MAX_K;
    bwd_args.nhead_q = HEADS_Q;
    bwd_args.nhead_k = HEADS_K;
    bwd_args.hdim_q = bwd_args.hdim_v = DIM;
    bwd_args.scale = 0.0f;
    bwd_args.window_size_left = -1;
    bwd_args.window_size_right = 0;
    for (run = 0; run < 2; ++run) {
        TRY(fmha_bwd_launcher_run(launcher, &bwd_args, stream));
        for (i = 4; i < 8; ++i)
            TRY(fmha_memcpy_async(host[i], dev[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_DEVICE_TO_HOST, stream));
        TRY(fmha_stream_synchronize(stream));
        for (i = 0; i < 3; ++i) {
            if (run == 0) {
                memcpy(first[i], host[5 + i], sizes[5 + i] * sizeof(uint16_t));
            } else if (memcmp(first[i], host[5 + i], sizes[5 + i] * sizeof(uint16_t)) != 0) {
                fprintf(stderr, "deterministic backward: %s differs between two runs\n", i == 0 ? "dQ" : i == 1 ? "dK" : "dV");
                exit_code = 1;
            }
        }
    }

    for (b = 0; b < BATCH; ++b) {
        int sq = seqstart_q[b + 1] - seqstart_q[b], sk = seqstart_k[b + 1] - seqstart_k[b];
        reference_shape shape = {0, 0, HEADS_Q, HEADS_K, DIM, 1, 1, 0.0};
        size_t qs = (size_t)HEADS_Q * sq * DIM, ks = (size_t)HEADS_K * sk * DIM;
        double *buf = (double *)malloc(sizeof(double) * (6 * qs + 6 * ks + HEADS_Q * sq + 1));
        double *q = buf, *dout = q + qs, *o = dout + qs, *dq = o + qs, *o_k = dq + qs, *dq_k = o_k + qs;
        double *k = dq_k + qs, *v = k + ks, *dk = v + ks, *dv = dk + ks, *dk_k = dv + ks, *dv_k = dk_k + ks;
        double *lse = dv_k + ks;
        const size_t q_row = (size_t)seqstart_q[b] * HEADS_Q * DIM, k_row = (size_t)seqstart_k[b] * HEADS_K * DIM;
        if (!buf) return 1;
        shape.sq = sq;
        shape.sk = sk;
        shape.scale = 1.0 / sqrt((double)DIM);
        gather_bf16(host[0] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, q);
        gather_bf16(host[3] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, dout);
        gather_bf16(host[1] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, k);
        gather_bf16(host[2] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, v);
        reference_attention(&shape, q, k, v, dout, o, lse, dq, dk, dv);
        gather_bf16(host[4] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, o_k);
        gather_bf16(host[5] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, dq_k);
        gather_bf16(host[6] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, dk_k);
        gather_bf16(host[7] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, dv_k);
        if (sq > 0) {
            worst[0] = fmax(worst[0], relative_error(o_k, o, qs));
            worst[1] = fmax(worst[1], relative_error(dq_k, dq, qs));
            worst[2] = fmax(worst[2], relative_error(dk_k, dk, ks));
            worst[3] = fmax(worst[3], relative_error(dv_k, dv, ks));
        } else {
            /* No queries: the sequence's keys received no gradient at all. */
            for (i = 0; i < ks; ++i)
                if (dk_k[i] != 0.0 || dv_k[i] != 0.0) exit_code = 1;
        }
        free(buf);
    }
    printf("varlen batch %d (q lengths 37, 0, 130; k lengths 50, 64, 130), heads %d/%d, dim %d, bf16, causal\n",
           BATCH, HEADS_Q, HEADS_K, DIM);
    printf("two deterministic runs: %s\n", exit_code == 0 ? "bitwise identical" : "DIFFERENT");
    printf("relative max error vs double reference: O %.2e  dQ %.2e  dK %.2e  dV %.2e\n", worst[0], worst[1],
           worst[2], worst[3]);
    for (i = 0; i < 4; ++i)
        if (!(worst[i] < 2e-2)) exit_code = 1;
    printf("%s\n", exit_code == 0 ? "ok" : "FAILED");

cleanup:
    fmha_bwd_launcher_destroy(launcher);
    if (stream) fmha_stream_destroy(stream);
    fmha_device_free(workspace);
    fmha_device_free(starts_q);
    fmha_device_free(starts_k);
    for (i = 0; i < 10; ++i) fmha_device_free(dev[i]);
    for (i = 0; i < 8; ++i) free(host[i]);
    for (i = 0; i < 3; ++i) free(first[i]);
    return exit_code;
}

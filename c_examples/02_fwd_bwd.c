/*
 * 02_fwd_bwd: attention forward and backward in batch mode through the C ABI.
 *
 *   bf16, [batch][seq][head][dim] (BSHD) tensors, 4 query heads sharing 2 kv heads (GQA), causal mask
 *   aligned to the top-left corner, seqlen_q != seqlen_k. Forward writes O and the LSE; the backward
 *   launcher is created, its workspace sized, allocated and prepared, then run; dK/dV come back with
 *   the kv heads' count (the GQA reduction happens inside fmha). Results are checked against a naive
 *   double-precision reference.
 *
 * Exit status: 0 on success, 1 on a failure, 77 when a GPU build runs without a GPU.
 */
#include <fmha.h>

#include <stdio.h>
#include <stdlib.h>

#include "attention_reference.h"
#include "example_support.h"

enum { BATCH = 2, SEQ_Q = 96, SEQ_K = 128, HEADS_Q = 4, HEADS_K = 2, DIM = 64 };

/* BSHD strides of a tensor with `heads` heads and `rows` rows per batch. */
static fmha_tensor bshd(void *data, int rows, int heads) {
    fmha_tensor t;
    t.data = data;
    t.batch_stride = (int64_t)rows * heads * DIM;
    t.head_stride = DIM;
    t.row_stride = (int64_t)heads * DIM;
    return t;
}

/* [batch][head][row] fp32 with unit row stride: the LSE and D layout. */
static fmha_tensor lse_layout(void *data) {
    fmha_tensor t;
    t.data = data;
    t.batch_stride = (int64_t)HEADS_Q * SEQ_Q;
    t.head_stride = SEQ_Q;
    t.row_stride = 1;
    return t;
}

int main(void) {
    const size_t nq = (size_t)BATCH * SEQ_Q * HEADS_Q * DIM, nk = (size_t)BATCH * SEQ_K * HEADS_K * DIM;
    const size_t nlse = (size_t)BATCH * HEADS_Q * SEQ_Q;
    int exit_code = 0, b;
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    uint16_t *host[9] = {0}; /* q k v do | o dq dk dv (downloads) */
    void *dev[10] = {0};     /* q k v do o dq dk dv lse d */
    void *workspace = NULL;
    size_t workspace_size = 0, i;
    fmha_bwd_launcher *launcher = NULL;
    fmha_stream_t stream = NULL;
    double worst[4] = {0, 0, 0, 0};
    const size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    /* Zeroed: what this program does not set (and what a later header appends) reads as its default. */
    fmha_fwd_traits fwd_traits = {0};
    fmha_fwd_args fwd_args = {0};
    fmha_bwd_traits bwd_traits = {0};
    fmha_bwd_args bwd_args = {0};

    for (i = 0; i < 8; ++i) {
        host[i] = (uint16_t *)malloc(sizes[i] * sizeof(uint16_t));
        if (!host[i]) return 1;
    }
    for (i = 0; i < 4; ++i) {
        size_t j;
        for (j = 0; j < sizes[i]; ++j) host[i][j] = to_bf16(random_unit(&rng));
    }
    for (i = 0; i < 8; ++i) TRY(fmha_device_malloc(&dev[i], sizes[i] * sizeof(uint16_t)));
    TRY(fmha_device_malloc(&dev[8], nlse * sizeof(float)));
    TRY(fmha_device_malloc(&dev[9], nlse * sizeof(float)));
    TRY(fmha_stream_create(&stream));
    for (i = 0; i < 4; ++i)
        TRY(fmha_memcpy_async(dev[i], host[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_HOST_TO_DEVICE, stream));

    /* Forward: traits select the kernel, args describe this call. */
    fwd_traits.struct_size = sizeof fwd_traits;
    fwd_traits.dtype = FMHA_DTYPE_BF16;
    fwd_traits.hdim_q = DIM;
    fwd_traits.hdim_v = DIM;
    fwd_traits.is_group_mode = 0;
    fwd_traits.mask_type = FMHA_MASK_TOP_LEFT;
    fwd_traits.bias_type = FMHA_BIAS_NONE;
    fwd_traits.has_dropout = 0;
    fwd_args.struct_size = sizeof fwd_args;
    fwd_args.q = bshd(dev[0], SEQ_Q, HEADS_Q);
    fwd_args.k = bshd(dev[1], SEQ_K, HEADS_K);
    fwd_args.v = bshd(dev[2], SEQ_K, HEADS_K);
    fwd_args.o = bshd(dev[4], SEQ_Q, HEADS_Q);
    fwd_args.lse = lse_layout(dev[8]);
    fwd_args.seqstart_q = fwd_args.seqstart_k = fwd_args.seqlen_q_ptr = fwd_args.seqlen_k_ptr = NULL;
    fwd_args.batch = BATCH;
    fwd_args.seqlen_q = fwd_args.max_seqlen_q = SEQ_Q;
    fwd_args.seqlen_k = fwd_args.max_seqlen_k = SEQ_K;
    fwd_args.nhead_q = HEADS_Q;
    fwd_args.nhead_k = HEADS_K;
    fwd_args.scale = 0.0f; /* 1 / sqrt(DIM) */
    fwd_args.window_size_left = -1;
    fwd_args.window_size_right = 0; /* causal */
    TRY(fmha_fwd(&fwd_traits, &fwd_args, stream));

    /* Backward: launcher -> workspace size -> allocate -> prepare -> run. */
    bwd_traits.struct_size = sizeof bwd_traits;
    bwd_traits.seqlen_q = bwd_traits.max_seqlen_q = SEQ_Q;
    bwd_traits.seqlen_k = bwd_traits.max_seqlen_k = SEQ_K;
    bwd_traits.batch = BATCH;
    bwd_traits.hdim_q = bwd_traits.hdim_v = DIM;
    bwd_traits.nhead_q = HEADS_Q;
    bwd_traits.nhead_k = HEADS_K;
    bwd_traits.dtype = FMHA_DTYPE_BF16;
    bwd_traits.is_group_mode = 0;
    bwd_traits.mask_type = FMHA_MASK_TOP_LEFT;
    bwd_traits.bias_type = FMHA_BIAS_NONE;
    bwd_traits.has_dbias = bwd_traits.has_dropout = bwd_traits.is_store_randval = 0;
    bwd_traits.is_deterministic = 0;
    TRY(fmha_bwd_launcher_create(&bwd_traits, &launcher));
    TRY(fmha_bwd_launcher_workspace_size(launcher, &workspace_size));
    TRY(fmha_device_malloc(&workspace, workspace_size));
    TRY(fmha_bwd_launcher_prepare_workspace(launcher, workspace, workspace_size, NULL, NULL));
    bwd_args.struct_size = sizeof bwd_args;
    bwd_args.q = fwd_args.q;
    bwd_args.k = fwd_args.k;
    bwd_args.v = fwd_args.v;
    bwd_args.o = fwd_args.o;
    bwd_args.lse = fwd_args.lse;
    bwd_args.d_o = bshd(dev[3], SEQ_Q, HEADS_Q);
    bwd_args.d = lse_layout(dev[9]);
    bwd_args.dq = bshd(dev[5], SEQ_Q, HEADS_Q);
    bwd_args.dk = bshd(dev[6], SEQ_K, HEADS_K);
    bwd_args.dv = bshd(dev[7], SEQ_K, HEADS_K);
    bwd_args.workspace = workspace;
    bwd_args.workspace_size = workspace_size;
    bwd_args.seqstart_q = bwd_args.seqstart_k = bwd_args.seqlen_q_ptr = bwd_args.seqlen_k_ptr = NULL;
    bwd_args.batch = BATCH;
    bwd_args.seqlen_q = bwd_args.max_seqlen_q = SEQ_Q;
    bwd_args.seqlen_k = bwd_args.max_seqlen_k = SEQ_K;
    bwd_args.nhead_q = HEADS_Q;
    bwd_args.nhead_k = HEADS_K;
    bwd_args.hdim_q = bwd_args.hdim_v = DIM;
    bwd_args.scale = 0.0f;
    bwd_args.window_size_left = -1;
    bwd_args.window_size_right = 0;
    TRY(fmha_bwd_launcher_run(launcher, &bwd_args, stream));
    for (i = 4; i < 8; ++i)
        TRY(fmha_memcpy_async(host[i], dev[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_stream_synchronize(stream));

    for (b = 0; b < BATCH; ++b) {
        reference_shape shape = {SEQ_Q, SEQ_K, HEADS_Q, HEADS_K, DIM, 1, 0, 0.0};
        size_t qs = (size_t)HEADS_Q * SEQ_Q * DIM, ks = (size_t)HEADS_K * SEQ_K * DIM;
        double *buf = (double *)malloc(sizeof(double) * (6 * qs + 6 * ks + HEADS_Q * SEQ_Q));
        double *q = buf, *dout = q + qs, *o = dout + qs, *dq = o + qs, *o_k = dq + qs, *dq_k = o_k + qs;
        double *k = dq_k + qs, *v = k + ks, *dk = v + ks, *dv = dk + ks, *dk_k = dv + ks, *dv_k = dk_k + ks;
        double *lse = dv_k + ks;
        if (!buf) return 1;
        shape.scale = 1.0 / sqrt((double)DIM);
        gather_bf16(host[0] + (size_t)b * SEQ_Q * HEADS_Q * DIM, HEADS_Q, SEQ_Q, DIM, DIM, HEADS_Q * DIM, q);
        gather_bf16(host[3] + (size_t)b * SEQ_Q * HEADS_Q * DIM, HEADS_Q, SEQ_Q, DIM, DIM, HEADS_Q * DIM, dout);
        gather_bf16(host[1] + (size_t)b * SEQ_K * HEADS_K * DIM, HEADS_K, SEQ_K, DIM, DIM, HEADS_K * DIM, k);
        gather_bf16(host[2] + (size_t)b * SEQ_K * HEADS_K * DIM, HEADS_K, SEQ_K, DIM, DIM, HEADS_K * DIM, v);
        reference_attention(&shape, q, k, v, dout, o, lse, dq, dk, dv);
        gather_bf16(host[4] + (size_t)b * SEQ_Q * HEADS_Q * DIM, HEADS_Q, SEQ_Q, DIM, DIM, HEADS_Q * DIM, o_k);
        gather_bf16(host[5] + (size_t)b * SEQ_Q * HEADS_Q * DIM, HEADS_Q, SEQ_Q, DIM, DIM, HEADS_Q * DIM, dq_k);
        gather_bf16(host[6] + (size_t)b * SEQ_K * HEADS_K * DIM, HEADS_K, SEQ_K, DIM, DIM, HEADS_K * DIM, dk_k);
        gather_bf16(host[7] + (size_t)b * SEQ_K * HEADS_K * DIM, HEADS_K, SEQ_K, DIM, DIM, HEADS_K * DIM, dv_k);
        worst[0] = fmax(worst[0], relative_error(o_k, o, qs));
        worst[1] = fmax(worst[1], relative_error(dq_k, dq, qs));
        worst[2] = fmax(worst[2], relative_error(dk_k, dk, ks));
        worst[3] = fmax(worst[3], relative_error(dv_k, dv, ks));
        free(buf);
    }
    printf("batch %d, seqlen_q %d, seqlen_k %d, heads %d/%d, dim %d, bf16, causal top-left\n", BATCH, SEQ_Q, SEQ_K,
           HEADS_Q, HEADS_K, DIM);
    printf("relative max error vs double reference: O %.2e  dQ %.2e  dK %.2e  dV %.2e\n", worst[0], worst[1],
           worst[2], worst[3]);
    for (i = 0; i < 4; ++i)
        if (!(worst[i] < 2e-2)) exit_code = 1;
    printf("%s\n", exit_code == 0 ? "ok" : "FAILED: error above 2e-2");

cleanup:
    fmha_bwd_launcher_destroy(launcher);
    if (stream) fmha_stream_destroy(stream);
    fmha_device_free(workspace);
    for (i = 0; i < 10; ++i) fmha_device_free(dev[i]);
    for (i = 0; i < 8; ++i) free(host[i]);
    return exit_code;
}

/*
 * 04_async_prepare: a varlen deterministic backward whose workspace is prepared on the stream, with
 * no host synchronization anywhere between uploading the batch and reading the gradients.
 *
 *   The sequence starts live only in device memory (as in a training loop, where they come from the
 *   data loader's device tensors). fmha_bwd_launcher_prepare_workspace_async copies them to pinned
 *   memory, packs the schedule in a stream host function and copies it to the workspace, all queued
 *   on the stream; the run is queued right behind it. The launcher is destroyed before the stream has
 *   finished: the staging buffer belongs to the queued work, and the library's releaser thread frees
 *   it afterwards. A second call reuses a launcher and its workspace for other lengths (same totals),
 *   with pinned memory from the caller's own allocator, and a third prepares with the device kernel
 *   (the method graph capture uses). Each result is checked against a double-precision reference.
 *
 * Exit status: 0 on success, 1 on a failure, 77 when a GPU build runs without a GPU.
 */
#include <fmha.h>

#include <stdio.h>
#include <stdlib.h>

#include "attention_reference.h"
#include "example_support.h"

enum { BATCH = 3, HEADS_Q = 4, HEADS_K = 2, DIM = 64, TOTAL_Q = 200, TOTAL_K = 240, MAX_LEN = 200 };

/* Three layouts of the same totals: the launcher's traits (totals and bounds) stay valid. */
static const int32_t starts_q[3][BATCH + 1] = {{0, 64, 64, 200}, {0, 100, 150, 200}, {0, 1, 2, 200}};
static const int32_t starts_k[3][BATCH + 1] = {{0, 80, 140, 240}, {0, 120, 170, 240}, {0, 40, 200, 240}};
static const int methods[3] = {FMHA_PREPARE_AUTO, FMHA_PREPARE_HOST, FMHA_PREPARE_DEVICE};

/* A caller allocator for the staging buffers; it counts allocations so the example can show it was
 * used. The library calls `free` on its releaser thread, never on a runtime callback thread. */
static int allocations;

static fmha_status counting_allocate(void *user_data, size_t bytes, void **ptr) {
    (void)user_data;
    ++allocations;
    return fmha_host_malloc_pinned(ptr, bytes);
}

static void counting_free(void *user_data, void *ptr) {
    (void)user_data;
    fmha_host_free_pinned(ptr);
}

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

/* Compares one call's outputs with the reference; returns the worst relative error. */
static double check_against_reference(const int32_t *sq_starts, const int32_t *sk_starts, uint16_t *const host[8]) {
    double worst = 0.0;
    int b;
    for (b = 0; b < BATCH; ++b) {
        int sq = sq_starts[b + 1] - sq_starts[b], sk = sk_starts[b + 1] - sk_starts[b], i;
        reference_shape shape = {0, 0, HEADS_Q, HEADS_K, DIM, 1, 1, 0.0};
        size_t qs = (size_t)HEADS_Q * sq * DIM, ks = (size_t)HEADS_K * sk * DIM;
        double *buf = (double *)malloc(sizeof(double) * (8 * qs + 6 * ks + HEADS_Q * sq + 1));
        double *t[14];
        const size_t q_row = (size_t)sq_starts[b] * HEADS_Q * DIM, k_row = (size_t)sk_starts[b] * HEADS_K * DIM;
        if (!buf) return INFINITY;
        /* q dout o dq o_kernel dq_kernel | k v dk dv dk_kernel dv_kernel | lse */
        for (i = 0; i < 6; ++i) t[i] = buf + i * qs;
        for (i = 0; i < 6; ++i) t[6 + i] = buf + 6 * qs + i * ks;
        t[12] = buf + 6 * qs + 6 * ks;
        shape.sq = sq;
        shape.sk = sk;
        shape.scale = 1.0 / sqrt((double)DIM);
        gather_bf16(host[0] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, t[0]);
        gather_bf16(host[3] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, t[1]);
        gather_bf16(host[1] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, t[6]);
        gather_bf16(host[2] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, t[7]);
        reference_attention(&shape, t[0], t[6], t[7], t[1], t[2], t[12], t[3], t[8], t[9]);
        gather_bf16(host[4] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, t[4]);
        gather_bf16(host[5] + q_row, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, t[5]);
        gather_bf16(host[6] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, t[10]);
        gather_bf16(host[7] + k_row, HEADS_K, sk, DIM, DIM, HEADS_K * DIM, t[11]);
        worst = fmax(worst, relative_error(t[4], t[2], qs));
        worst = fmax(worst, relative_error(t[5], t[3], qs));
        worst = fmax(worst, relative_error(t[10], t[8], ks));
        worst = fmax(worst, relative_error(t[11], t[9], ks));
        free(buf);
    }
    return worst;
}

int main(void) {
    const size_t nq = (size_t)TOTAL_Q * HEADS_Q * DIM, nk = (size_t)TOTAL_K * HEADS_K * DIM;
    const size_t sizes[8] = {nq, nk, nk, nq, nq, nq, nk, nk};
    int exit_code = 0, call;
    uint64_t rng = 0x853C49E6748FEA9Bull;
    uint16_t *host[8] = {0}; /* q k v do o dq dk dv */
    void *dev[10] = {0};     /* q k v do o dq dk dv lse d */
    void *dev_starts_q = NULL, *dev_starts_k = NULL, *workspace = NULL;
    size_t workspace_size = 0, i;
    fmha_bwd_launcher *launcher = NULL;
    fmha_stream_t stream = NULL;
    fmha_pinned_allocator allocator;
    /* Zeroed: what this program does not set (and what a later header appends) reads as its default. */
    fmha_fwd_traits fwd_traits = {0};
    fmha_fwd_args fwd_args = {0};
    fmha_bwd_traits bwd_traits = {0};
    fmha_bwd_args bwd_args = {0};

    allocator.struct_size = sizeof allocator;
    allocator.user_data = NULL;
    allocator.allocate = counting_allocate;
    allocator.free = counting_free;
    for (i = 0; i < 8; ++i)
        if (!(host[i] = (uint16_t *)malloc(sizes[i] * sizeof(uint16_t)))) return 1;
    for (i = 0; i < 4; ++i) {
        size_t j;
        for (j = 0; j < sizes[i]; ++j) host[i][j] = to_bf16(random_unit(&rng));
    }
    for (i = 0; i < 8; ++i) TRY(fmha_device_malloc(&dev[i], sizes[i] * sizeof(uint16_t)));
    TRY(fmha_device_malloc(&dev[8], (size_t)HEADS_Q * TOTAL_Q * sizeof(float)));
    TRY(fmha_device_malloc(&dev[9], (size_t)HEADS_Q * TOTAL_Q * sizeof(float)));
    TRY(fmha_device_malloc(&dev_starts_q, sizeof starts_q[0]));
    TRY(fmha_device_malloc(&dev_starts_k, sizeof starts_k[0]));
    TRY(fmha_stream_create(&stream));
    for (i = 0; i < 4; ++i)
        TRY(fmha_memcpy_async(dev[i], host[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_HOST_TO_DEVICE, stream));

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
    fwd_args.seqstart_q = (const int32_t *)dev_starts_q;
    fwd_args.seqstart_k = (const int32_t *)dev_starts_k;
    fwd_args.seqlen_q_ptr = fwd_args.seqlen_k_ptr = NULL;
    fwd_args.batch = BATCH;
    fwd_args.seqlen_q = TOTAL_Q;
    fwd_args.seqlen_k = TOTAL_K;
    fwd_args.max_seqlen_q = fwd_args.max_seqlen_k = MAX_LEN; /* a bound valid for every call */
    fwd_args.nhead_q = HEADS_Q;
    fwd_args.nhead_k = HEADS_K;
    fwd_args.scale = 0.0f;
    fwd_args.window_size_left = -1;
    fwd_args.window_size_right = 0;

    bwd_traits.struct_size = sizeof bwd_traits;
    bwd_traits.seqlen_q = TOTAL_Q;
    bwd_traits.seqlen_k = TOTAL_K;
    bwd_traits.batch = BATCH;
    bwd_traits.max_seqlen_q = bwd_traits.max_seqlen_k = MAX_LEN;
    bwd_traits.hdim_q = bwd_traits.hdim_v = DIM;
    bwd_traits.nhead_q = HEADS_Q;
    bwd_traits.nhead_k = HEADS_K;
    bwd_traits.dtype = FMHA_DTYPE_BF16;
    bwd_traits.is_group_mode = 1;
    bwd_traits.mask_type = FMHA_MASK_BOTTOM_RIGHT;
    bwd_traits.bias_type = FMHA_BIAS_NONE;
    bwd_traits.has_dbias = bwd_traits.has_dropout = bwd_traits.is_store_randval = 0;
    bwd_traits.is_deterministic = 1;

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
    bwd_args.seqstart_q = fwd_args.seqstart_q;
    bwd_args.seqstart_k = fwd_args.seqstart_k;
    bwd_args.seqlen_q_ptr = bwd_args.seqlen_k_ptr = NULL;
    bwd_args.batch = BATCH;
    bwd_args.seqlen_q = TOTAL_Q;
    bwd_args.seqlen_k = TOTAL_K;
    bwd_args.max_seqlen_q = bwd_args.max_seqlen_k = MAX_LEN;
    bwd_args.nhead_q = HEADS_Q;
    bwd_args.nhead_k = HEADS_K;
    bwd_args.hdim_q = bwd_args.hdim_v = DIM;
    bwd_args.scale = 0.0f;
    bwd_args.window_size_left = -1;
    bwd_args.window_size_right = 0;

    for (call = 0; call < 3; ++call) {
        double worst;
        TRY(fmha_memcpy_async(dev_starts_q, starts_q[call], sizeof starts_q[0], FMHA_MEMCPY_HOST_TO_DEVICE, stream));
        TRY(fmha_memcpy_async(dev_starts_k, starts_k[call], sizeof starts_k[0], FMHA_MEMCPY_HOST_TO_DEVICE, stream));
        TRY(fmha_fwd(&fwd_traits, &fwd_args, stream));
        if (!launcher) {
            TRY(fmha_bwd_launcher_create(&bwd_traits, &launcher));
            TRY(fmha_bwd_launcher_workspace_size(launcher, &workspace_size));
            if (!workspace) TRY(fmha_device_malloc(&workspace, workspace_size));
        }
        bwd_args.workspace = workspace;
        bwd_args.workspace_size = workspace_size;
        /* Everything below is queued on the stream: no host synchronization. */
        TRY(fmha_bwd_launcher_prepare_workspace_async(launcher, workspace, workspace_size, fwd_args.seqstart_q,
                                                      fwd_args.seqstart_k, stream, call == 1 ? &allocator : NULL,
                                                      methods[call]));
        TRY(fmha_bwd_launcher_run(launcher, &bwd_args, stream));
        if (call == 0) {
            /* Safe while the stream still works: the queued work owns what it needs. */
            TRY(fmha_bwd_launcher_destroy(launcher));
            launcher = NULL;
        }
        for (i = 4; i < 8; ++i)
            TRY(fmha_memcpy_async(host[i], dev[i], sizes[i] * sizeof(uint16_t), FMHA_MEMCPY_DEVICE_TO_HOST, stream));
        TRY(fmha_stream_synchronize(stream));
        worst = check_against_reference(starts_q[call], starts_k[call], host);
        printf("call %d (%s prepare%s): relative max error of O, dQ, dK, dV vs double reference %.2e\n", call,
               methods[call] == FMHA_PREPARE_DEVICE ? "device" : methods[call] == FMHA_PREPARE_HOST ? "host" : "auto",
               call == 1 ? ", caller's pinned allocator" : "", worst);
        if (!(worst < 2e-2)) exit_code = 1;
    }
    /* The staging buffers go back through the releaser thread shortly after the stream is done. */
    TRY(fmha_device_synchronize());
    printf("caller allocator: %d staging buffer(s) allocated\n", allocations);
    printf("%s\n", exit_code == 0 ? "ok" : "FAILED");

cleanup:
    fmha_bwd_launcher_destroy(launcher);
    if (stream) fmha_stream_destroy(stream);
    fmha_device_free(workspace);
    fmha_device_free(dev_starts_q);
    fmha_device_free(dev_starts_k);
    for (i = 0; i < 10; ++i) fmha_device_free(dev[i]);
    for (i = 0; i < 8; ++i) free(host[i]);
    return exit_code;
}

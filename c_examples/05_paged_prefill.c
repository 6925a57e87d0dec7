/*
 * 05_paged_prefill: chunked prefill over a paged KV cache (vLLM's block table), through the kv-cache
 * launcher.
 *
 *   8 sequences, each with tokens already in the cache and new ones appended (a prompt chunk, or one
 *   decode token); bf16, 32 query heads sharing 8 kv heads (GQA), head dim 128, causal. The cache is one
 *   pool of 16-token pages [page][token][kv head][dim] shared by every sequence, whose pages lie in it
 *   in shuffled order. The example writes the new tokens' K/V into their pages itself (the engine's job,
 *   before attention); the queries are the new tokens. Each attends to its sequence's cached tokens and
 *   to the new ones up to itself: the causal mask is aligned to the bottom-right corner, i.e. to each
 *   sequence's KV length.
 *
 *   launcher create -> workspace size -> allocate -> prepare (checks the lengths and every page id on
 *   the stream) -> run -> synchronize -> check. Every output row and LSE value is compared with a
 *   double-precision reference computed from each sequence's tokens in logical order, not through the
 *   page table. Then the same batch, described by a CSR table (SGLang / flashinfer: kv_indptr,
 *   page_indices, last_page_len) and run with the one-shot fmha_kvcache_fwd, must give bitwise the same
 *   O and LSE.
 *
 * Exit status: 0 on success, 1 on a failure, 77 when a GPU build runs without a GPU.
 */
#include <fmha.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_reference.h"
#include "example_support.h"

enum {
    BATCH = 8,
    HEADS_Q = 32,
    HEADS_K = 8,
    DIM = 128,
    PAGE = 16,
    MAX_CACHED = 300, /* tokens already in the cache: 0..MAX_CACHED per sequence */
    MAX_NEW = 64,     /* new tokens: 1..MAX_NEW per sequence */
    MAX_SEQLEN_K = MAX_CACHED + MAX_NEW,
    MAX_PAGES_PER_SEQ = (MAX_SEQLEN_K + PAGE - 1) / PAGE, /* the block table's width */
    FREE_PAGES = 6,                                       /* pool pages no sequence holds */
    MAX_POOL_PAGES = BATCH * MAX_PAGES_PER_SEQ + FREE_PAGES,
    TOKEN = HEADS_K * DIM /* elements of one token's K (or V) row: all kv heads */
};

/* A quiet NaN in bf16: what the pool holds wherever no token was written. */
#define BF16_NAN 0x7FC0u

/* Device buffers, by role. */
enum {
    D_Q,              /* [total_q][HEADS_Q][DIM] the new tokens' queries */
    D_K_NEW,          /* [total_q][HEADS_K][DIM] the new tokens' keys (a projection's output) */
    D_V_NEW,          /* [total_q][HEADS_K][DIM] and values */
    D_K_POOL,         /* [num_pages][PAGE][HEADS_K][DIM] the cache */
    D_V_POOL,         /* same */
    D_O,              /* [total_q][HEADS_Q][DIM] */
    D_LSE,            /* [HEADS_Q][total_q] fp32 */
    D_O_CSR,          /* the CSR call's O and LSE */
    D_LSE_CSR,
    D_SEQSTART_Q,     /* [BATCH + 1] */
    D_SEQLEN_K,       /* [BATCH] */
    D_BLOCK_TABLE,    /* [BATCH][MAX_PAGES_PER_SEQ] */
    D_KV_INDPTR,      /* [BATCH + 1] */
    D_PAGE_INDICES,   /* [pages in use] */
    D_LAST_PAGE_LEN,  /* [BATCH] */
    D_COUNT
};

/* Uniform in 0..n-1 (double: the product with n stays exact, so it never reaches n). */
static int random_below(uint64_t *state, int n) {
    return (int)(((double)random_unit(state) + 1.0) * 0.5 * n);
}

static fmha_tensor rows_of(void *data, int heads) { /* [row][head][DIM]: q, o */
    fmha_tensor t;
    t.data = data;
    t.batch_stride = 0; /* group mode: sequence b starts at row seqstart_q[b] */
    t.head_stride = DIM;
    t.row_stride = (int64_t)heads * DIM;
    return t;
}

static fmha_tensor pool_of(void *data) { /* [page][token][kv head][DIM] (NHD) */
    fmha_tensor t;
    t.data = data;
    t.batch_stride = (int64_t)PAGE * TOKEN; /* a pool's "batch" is the page */
    t.head_stride = DIM;
    t.row_stride = TOKEN;
    return t;
}

static fmha_tensor lse_of(void *data, int total_q) { /* [HEADS_Q][total_q] fp32 */
    fmha_tensor t;
    t.data = data;
    t.batch_stride = 0;
    t.head_stride = total_q;
    t.row_stride = 1;
    return t;
}

int main(void) {
    int exit_code = 0, b, h, i, j;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int cached[BATCH], added[BATCH], kv_start[BATCH + 1];
    int32_t seqstart_q[BATCH + 1], seqlen_k[BATCH], block_table[BATCH * MAX_PAGES_PER_SEQ];
    int32_t kv_indptr[BATCH + 1], page_indices[BATCH * MAX_PAGES_PER_SEQ], last_page_len[BATCH];
    int32_t pool_order[MAX_POOL_PAGES];
    int total_q, total_kv, pages_used, num_pages;
    size_t bytes[D_COUNT], n, workspace_size = 0;
    uint16_t *q = NULL, *k_seq = NULL, *v_seq = NULL, *k_image = NULL, *v_image = NULL, *o = NULL, *o_csr = NULL;
    float *lse = NULL, *lse_csr = NULL;
    void *dev[D_COUNT] = {0};
    void *workspace = NULL;
    fmha_kvcache_launcher *launcher = NULL;
    fmha_stream_t stream = NULL;
    fmha_kvcache_traits traits;
    fmha_kvcache_args args;
    double worst_o = 0.0, worst_lse = 0.0;
    int bitwise_same;

    /* The batch: lengths drawn at random, plus the cases every real batch has: a fresh prompt (nothing
     * cached), a decode step (one new token), and a cache that ends exactly on a page boundary. */
    for (b = 0; b < BATCH; ++b) {
        cached[b] = random_below(&rng, MAX_CACHED + 1);
        added[b] = 1 + random_below(&rng, MAX_NEW);
    }
    cached[0] = 0;
    added[1] = 1;
    cached[2] -= cached[2] % PAGE;
    seqstart_q[0] = kv_start[0] = 0;
    for (b = 0; b < BATCH; ++b) {
        seqstart_q[b + 1] = seqstart_q[b] + added[b];
        seqlen_k[b] = cached[b] + added[b];
        kv_start[b + 1] = kv_start[b] + seqlen_k[b];
    }
    total_q = seqstart_q[BATCH];
    total_kv = kv_start[BATCH];

    /* The page tables. The pool's pages are handed out in a shuffled order, as a cache allocator does
     * after some sequences came and went; FREE_PAGES pages stay free. */
    pages_used = 0;
    for (b = 0; b < BATCH; ++b) pages_used += (seqlen_k[b] + PAGE - 1) / PAGE;
    num_pages = pages_used + FREE_PAGES;
    for (i = 0; i < num_pages; ++i) pool_order[i] = i;
    for (i = num_pages - 1; i > 0; --i) {
        int r = random_below(&rng, i + 1);
        int32_t t = pool_order[i];
        pool_order[i] = pool_order[r];
        pool_order[r] = t;
    }
    kv_indptr[0] = 0;
    for (b = 0; b < BATCH; ++b) {
        int pages = (seqlen_k[b] + PAGE - 1) / PAGE, t;
        for (t = 0; t < MAX_PAGES_PER_SEQ; ++t) {
            /* Entries past a sequence's last page are padding that fmha never reads: out-of-range ids
             * here (a real engine's table holds stale ids or 0) would fail any read of them. */
            int32_t padding = b % 2 ? INT32_MAX : -1;
            block_table[b * MAX_PAGES_PER_SEQ + t] = t < pages ? pool_order[kv_indptr[b] + t] : padding;
        }
        /* The CSR table lists the same pages: kv_indptr[b]..kv_indptr[b + 1] of page_indices. */
        for (t = 0; t < pages; ++t) page_indices[kv_indptr[b] + t] = pool_order[kv_indptr[b] + t];
        kv_indptr[b + 1] = kv_indptr[b] + pages;
        last_page_len[b] = seqlen_k[b] - (pages - 1) * PAGE; /* 1..PAGE: every sequence has a token */
    }

    /* Host data: the queries of the new tokens, and every sequence's K/V in logical token order
     * [token][kv head][DIM] (cached tokens first, then the new ones), all bf16. */
    q = (uint16_t *)malloc((size_t)total_q * HEADS_Q * DIM * sizeof *q);
    k_seq = (uint16_t *)malloc((size_t)total_kv * TOKEN * sizeof *k_seq);
    v_seq = (uint16_t *)malloc((size_t)total_kv * TOKEN * sizeof *v_seq);
    k_image = (uint16_t *)malloc((size_t)num_pages * PAGE * TOKEN * sizeof *k_image);
    v_image = (uint16_t *)malloc((size_t)num_pages * PAGE * TOKEN * sizeof *v_image);
    o = (uint16_t *)malloc((size_t)total_q * HEADS_Q * DIM * sizeof *o);
    o_csr = (uint16_t *)malloc((size_t)total_q * HEADS_Q * DIM * sizeof *o_csr);
    lse = (float *)malloc((size_t)HEADS_Q * total_q * sizeof *lse);
    lse_csr = (float *)malloc((size_t)HEADS_Q * total_q * sizeof *lse_csr);
    if (!q || !k_seq || !v_seq || !k_image || !v_image || !o || !o_csr || !lse || !lse_csr) {
        fprintf(stderr, "out of host memory\n");
        exit_code = 1;
        goto cleanup;
    }
    for (n = 0; n < (size_t)total_q * HEADS_Q * DIM; ++n) q[n] = to_bf16(random_unit(&rng));
    for (n = 0; n < (size_t)total_kv * TOKEN; ++n) k_seq[n] = to_bf16(random_unit(&rng));
    for (n = 0; n < (size_t)total_kv * TOKEN; ++n) v_seq[n] = to_bf16(random_unit(&rng));

    /* The cache as it stands before this step: the cached tokens in their pages, NaN everywhere else
     * (free pages, the new tokens' rows, the rest of each last page). A NaN read by mistake would show
     * in the output. */
    for (n = 0; n < (size_t)num_pages * PAGE * TOKEN; ++n) k_image[n] = v_image[n] = BF16_NAN;
    for (b = 0; b < BATCH; ++b)
        for (j = 0; j < cached[b]; ++j) {
            size_t slot = ((size_t)page_indices[kv_indptr[b] + j / PAGE] * PAGE + j % PAGE) * TOKEN;
            memcpy(k_image + slot, k_seq + ((size_t)kv_start[b] + j) * TOKEN, TOKEN * sizeof *k_image);
            memcpy(v_image + slot, v_seq + ((size_t)kv_start[b] + j) * TOKEN, TOKEN * sizeof *v_image);
        }

    bytes[D_Q] = bytes[D_O] = bytes[D_O_CSR] = (size_t)total_q * HEADS_Q * DIM * sizeof(uint16_t);
    bytes[D_K_NEW] = bytes[D_V_NEW] = (size_t)total_q * TOKEN * sizeof(uint16_t);
    bytes[D_K_POOL] = bytes[D_V_POOL] = (size_t)num_pages * PAGE * TOKEN * sizeof(uint16_t);
    bytes[D_LSE] = bytes[D_LSE_CSR] = (size_t)HEADS_Q * total_q * sizeof(float);
    bytes[D_SEQSTART_Q] = bytes[D_KV_INDPTR] = (BATCH + 1) * sizeof(int32_t);
    bytes[D_SEQLEN_K] = bytes[D_LAST_PAGE_LEN] = BATCH * sizeof(int32_t);
    bytes[D_BLOCK_TABLE] = sizeof block_table;
    bytes[D_PAGE_INDICES] = (size_t)pages_used * sizeof(int32_t);
    for (i = 0; i < D_COUNT; ++i) TRY(fmha_device_malloc(&dev[i], bytes[i]));
    TRY(fmha_stream_create(&stream));

#define UPLOAD(index, host) TRY(fmha_memcpy_async(dev[index], host, bytes[index], FMHA_MEMCPY_HOST_TO_DEVICE, stream))
    UPLOAD(D_Q, q);
    UPLOAD(D_K_POOL, k_image);
    UPLOAD(D_V_POOL, v_image);
    UPLOAD(D_SEQSTART_Q, seqstart_q);
    UPLOAD(D_SEQLEN_K, seqlen_k);
    UPLOAD(D_BLOCK_TABLE, block_table);
    UPLOAD(D_KV_INDPTR, kv_indptr);
    UPLOAD(D_PAGE_INDICES, page_indices);
    UPLOAD(D_LAST_PAGE_LEN, last_page_len);
#undef UPLOAD
    /* The new tokens' K/V, packed by query row as a projection would leave them on the device. */
    for (b = 0; b < BATCH; ++b) {
        size_t from = ((size_t)kv_start[b] + cached[b]) * TOKEN, to = (size_t)seqstart_q[b] * TOKEN;
        size_t count = (size_t)added[b] * TOKEN * sizeof(uint16_t);
        TRY(fmha_memcpy_async((uint16_t *)dev[D_K_NEW] + to, k_seq + from, count, FMHA_MEMCPY_HOST_TO_DEVICE, stream));
        TRY(fmha_memcpy_async((uint16_t *)dev[D_V_NEW] + to, v_seq + from, count, FMHA_MEMCPY_HOST_TO_DEVICE, stream));
    }

    /* Appending to the cache is the caller's job (vLLM's reshape_and_cache): token j of sequence b goes
     * to row j % PAGE of page block_table[b][j / PAGE]. In NHD a token's heads are contiguous, and so
     * are consecutive tokens of one page: one copy per run of new tokens within a page. */
    for (b = 0; b < BATCH; ++b)
        for (j = cached[b]; j < seqlen_k[b];) {
            int row = j % PAGE, run = PAGE - row < seqlen_k[b] - j ? PAGE - row : seqlen_k[b] - j;
            size_t to = ((size_t)block_table[b * MAX_PAGES_PER_SEQ + j / PAGE] * PAGE + row) * TOKEN;
            size_t from = ((size_t)seqstart_q[b] + (j - cached[b])) * TOKEN;
            size_t count = (size_t)run * TOKEN * sizeof(uint16_t);
            TRY(fmha_memcpy_async((uint16_t *)dev[D_K_POOL] + to, (uint16_t *)dev[D_K_NEW] + from, count,
                                  FMHA_MEMCPY_DEVICE_TO_DEVICE, stream));
            TRY(fmha_memcpy_async((uint16_t *)dev[D_V_POOL] + to, (uint16_t *)dev[D_V_NEW] + from, count,
                                  FMHA_MEMCPY_DEVICE_TO_DEVICE, stream));
            j += run;
        }

    /* Traits: the kernel and the bounds every call of this launcher stays within (an engine creates
     * one per model and sizes the bounds for its largest step). */
    memset(&traits, 0, sizeof traits);
    traits.struct_size = sizeof traits;
    traits.dtype = FMHA_DTYPE_BF16;
    traits.o_dtype = FMHA_DTYPE_BF16; /* read only for fp8 inputs */
    traits.hdim_q = traits.hdim_v = DIM;
    traits.nhead_q = HEADS_Q;
    traits.nhead_k = HEADS_K;
    traits.is_group_mode = 1; /* varlen queries: seqstart_q */
    traits.mask_type = FMHA_MASK_BOTTOM_RIGHT;
    traits.has_lse = 1;
    traits.kv_table_kind = FMHA_KV_BLOCK_TABLE;
    traits.kv_layout = FMHA_KV_LAYOUT_STRIDED;
    traits.kv_scale_granularity = FMHA_KV_SCALE_TENSOR; /* no descales: bf16 */
    traits.page_size = PAGE;
    traits.batch = BATCH;
    traits.total_q = BATCH * MAX_NEW;
    traits.max_seqlen_q = MAX_NEW;
    traits.max_seqlen_k = MAX_SEQLEN_K;
    traits.max_splits = 0; /* heuristic */
    traits.kv_split_tokens = 0;
    traits.check_tables = 1; /* the prepare checks every page id the sequences use */

    /* Arguments of this step. Zeroed first: the CSR arrays, cache_batch_idx and the fp8 descales are
     * NULL for a bf16 block table. */
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.q = rows_of(dev[D_Q], HEADS_Q);
    args.k = pool_of(dev[D_K_POOL]);
    args.v = pool_of(dev[D_V_POOL]);
    args.o = rows_of(dev[D_O], HEADS_Q);
    args.lse = lse_of(dev[D_LSE], total_q);
    args.seqstart_q = (const int32_t *)dev[D_SEQSTART_Q];
    args.batch = BATCH;
    args.seqlen_q = total_q;
    args.num_pages = num_pages;
    args.max_pages_per_seq = MAX_PAGES_PER_SEQ;
    args.seqlen_k = (const int32_t *)dev[D_SEQLEN_K];
    args.block_table = (const int32_t *)dev[D_BLOCK_TABLE];
    args.block_table_stride = MAX_PAGES_PER_SEQ;
    args.scale = 0.0f; /* 1 / sqrt(DIM) */
    args.window_size_left = -1;
    args.window_size_right = 0; /* causal */

    TRY(fmha_kvcache_launcher_create(&traits, &launcher));
    TRY(fmha_kvcache_launcher_workspace_size(launcher, &workspace_size));
    TRY(fmha_device_malloc(&workspace, workspace_size));
    args.workspace = workspace;
    args.workspace_size = workspace_size;
    /* The prepare is queued: no host synchronization, so a step can be captured in a graph. One
     * prepare serves every layer of the step (same lengths and tables). */
    TRY(fmha_kvcache_launcher_prepare_async(launcher, &args, stream));
    TRY(fmha_kvcache_launcher_run(launcher, &args, stream));
    TRY(fmha_memcpy_async(o, dev[D_O], bytes[D_O], FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_memcpy_async(lse, dev[D_LSE], bytes[D_LSE], FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_stream_synchronize(stream));
    /* What the prepare found in the tables (a debugging aid: blocking). */
    TRY(fmha_kvcache_launcher_check(launcher, workspace, workspace_size, stream));

    /* The reference, one sequence at a time, from the logical K/V: the page table plays no part. */
    for (b = 0; b < BATCH; ++b) {
        int sq = added[b], sk = seqlen_k[b];
        reference_shape shape = {0, 0, HEADS_Q, HEADS_K, DIM, 1, 1, 0.0};
        size_t qs = (size_t)HEADS_Q * sq * DIM, ks = (size_t)HEADS_K * sk * DIM;
        double *buf = (double *)malloc(sizeof(double) * (3 * qs + 2 * ks + (size_t)HEADS_Q * sq));
        double *ref_q, *ref_o, *got_o, *ref_k, *ref_v, *ref_lse;
        if (!buf) {
            fprintf(stderr, "out of host memory\n");
            exit_code = 1;
            goto cleanup;
        }
        ref_q = buf, ref_o = ref_q + qs, got_o = ref_o + qs, ref_k = got_o + qs, ref_v = ref_k + ks;
        ref_lse = ref_v + ks;
        shape.sq = sq;
        shape.sk = sk;
        shape.scale = 1.0 / sqrt((double)DIM);
        gather_bf16(q + (size_t)seqstart_q[b] * HEADS_Q * DIM, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, ref_q);
        gather_bf16(k_seq + (size_t)kv_start[b] * TOKEN, HEADS_K, sk, DIM, DIM, TOKEN, ref_k);
        gather_bf16(v_seq + (size_t)kv_start[b] * TOKEN, HEADS_K, sk, DIM, DIM, TOKEN, ref_v);
        reference_attention(&shape, ref_q, ref_k, ref_v, NULL, ref_o, ref_lse, NULL, NULL, NULL);
        gather_bf16(o + (size_t)seqstart_q[b] * HEADS_Q * DIM, HEADS_Q, sq, DIM, DIM, HEADS_Q * DIM, got_o);
        for (h = 0; h < HEADS_Q; ++h)
            for (i = 0; i < sq; ++i) {
                /* O: each row (one token, one head) against its own largest value, since a row that
                 * averages many values is small. LSE: an fp32 softmax statistic, far more precise than
                 * the bf16 outputs, so held to 1e-4 of 1 + |LSE|. */
                size_t r = (size_t)h * sq + i;
                double lse_error = fabs(lse[(size_t)h * total_q + seqstart_q[b] + i] - ref_lse[r]);
                worst_o = fmax(worst_o, relative_error(got_o + r * DIM, ref_o + r * DIM, DIM));
                if (lse_error != lse_error) lse_error = INFINITY; /* fmax would drop a NaN */
                worst_lse = fmax(worst_lse, lse_error / (1.0 + fabs(ref_lse[r])));
            }
        free(buf);
    }

    /* The same step through a CSR table, with the one-shot call (no launcher, no prepare: nothing to
     * check; a prefill run reads no workspace, so none is passed). */
    traits.kv_table_kind = FMHA_KV_PAGE_CSR;
    args.seqlen_k = NULL; /* CSR: the lengths come from kv_indptr and last_page_len */
    args.block_table = NULL;
    args.max_pages_per_seq = 0;
    args.block_table_stride = 0;
    args.kv_indptr = (const int32_t *)dev[D_KV_INDPTR];
    args.page_indices = (const int32_t *)dev[D_PAGE_INDICES];
    args.last_page_len = (const int32_t *)dev[D_LAST_PAGE_LEN];
    args.num_page_indices = pages_used;
    args.o = rows_of(dev[D_O_CSR], HEADS_Q);
    args.lse = lse_of(dev[D_LSE_CSR], total_q);
    args.workspace = NULL;
    args.workspace_size = 0;
    TRY(fmha_kvcache_fwd(&traits, &args, stream));
    TRY(fmha_memcpy_async(o_csr, dev[D_O_CSR], bytes[D_O_CSR], FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_memcpy_async(lse_csr, dev[D_LSE_CSR], bytes[D_LSE_CSR], FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_stream_synchronize(stream));
    bitwise_same = memcmp(o, o_csr, bytes[D_O]) == 0 && memcmp(lse, lse_csr, bytes[D_LSE]) == 0;

    printf("%d sequences, %d new tokens on %d cached (pages of %d, %d of %d pool pages used), heads %d/%d, "
           "dim %d, bf16, causal bottom-right\n",
           BATCH, total_q, total_kv - total_q, PAGE, pages_used, num_pages, HEADS_Q, HEADS_K, DIM);
    printf("cached + new:");
    for (b = 0; b < BATCH; ++b) printf(" %d+%d", cached[b], added[b]);
    printf("\n");
    printf("block table vs double reference: O worst row relative error %.2e, LSE relative error %.2e\n",
           worst_o, worst_lse);
    printf("page CSR vs block table: O and LSE %s\n", bitwise_same ? "bitwise identical" : "DIFFER");
    if (!(worst_o < 2e-2) || !(worst_lse < 1e-4) || !bitwise_same) exit_code = 1;
    printf("%s\n", exit_code == 0 ? "ok" : "FAILED (tolerances: O 2e-2, LSE 1e-4; CSR must match bitwise)");

cleanup:
    fmha_kvcache_launcher_destroy(launcher);
    if (stream) fmha_stream_destroy(stream);
    fmha_device_free(workspace);
    for (i = 0; i < D_COUNT; ++i) fmha_device_free(dev[i]);
    free(q);
    free(k_seq);
    free(v_seq);
    free(k_image);
    free(v_image);
    free(o);
    free(o_csr);
    free(lse);
    free(lse_csr);
    return exit_code;
}

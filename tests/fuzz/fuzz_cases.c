/*
 * The targeted cases. Each starts from a valid call (forward; or the backward chain create →
 * workspace_size → prepare_workspace[_async] → run → synchronize) and changes ONE thing to a value
 * the header forbids, naming the field the message must mention; or it is a valid input (packed
 * layouts, aliasing inputs, a 0.1-sized fmha_bwd_args, workspaces prepared by other launchers) that
 * must be accepted and give correct results. Handle misuse (double destroy, garbage and foreign
 * handles, races with destroy), the releaser, asynchronous prepares with invalid device seqstarts and
 * the runtime helpers are custom cases.
 *
 * The table is built the same way in the parent (to count and name cases) and in each child.
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* fmha_bwd_args of 0.1 ended after window_size_right: 416 bytes (its FIRST version size) */
_Static_assert(offsetof(fmha_bwd_args, workspace_size) == 416, "fmha_bwd_args 0.1 is 416 bytes");

/* ---- the table ----------------------------------------------------------------------------------- */

enum base {
    B_NONE,           /* no problem set up (runtime helpers, handles) */
    B_FWD,            /* batch 2, sq 16, sk 24, heads 4/2, d 32, bf16, causal top-left */
    B_FWD_GROUP,      /* varlen 3 batches (q 5,0,12; k 8,12,10), causal bottom-right */
    B_FWD_MHA,        /* batch 2, sq = sk = 16, heads 2/2, d 32, no mask */
    B_BWD,            /* the forward's B_FWD, then the backward, atomic dQ */
    B_BWD_DET,        /* ... deterministic */
    B_BWD_GROUP,      /* B_FWD_GROUP's problem, backward */
    B_BWD_GROUP_DET,  /* ... deterministic */
    B_BWD_MHA,        /* B_FWD_MHA's problem, backward */
};

enum stage { ST_SETUP, ST_FWD, ST_FWD_SYNC, ST_CREATE, ST_SIZE, ST_PREPARE, ST_PREPARE_SYNC, ST_RUN, ST_RUN_SYNC, ST_CUSTOM };
enum target { TG_NONE, TG_FT, TG_FA, TG_BT, TG_BA };
enum judge { J_CALL, J_CHAIN };
enum prep { PREP_SYNC, PREP_AUTO, PREP_HOST, PREP_DEVICE };

#define F_NO_PREPARE 1u /* the chain skips the prepare */
#define F_HEAVY 2u      /* slow under valgrind: --light skips it */
#define F_SAMPLE 4u     /* always in a --sample (use-after-free and race cases, where valgrind sees most) */
#define F_UNWRITTEN 8u  /* nothing may be computed: dq, dk and dv must keep their NaN poison */

#define INV STATUS_BIT(FMHA_ERR_INVALID_ARGUMENT)
#define NULLP STATUS_BIT(FMHA_ERR_NULL_POINTER)
#define UNSUP STATUS_BIT(FMHA_ERR_UNSUPPORTED)
#define NOT_PREPARED STATUS_BIT(FMHA_ERR_WORKSPACE_NOT_PREPARED)

typedef struct run_ctx run_ctx;
typedef void (*hook_fn)(run_ctx *r);

typedef struct {
    char desc[200];
    char fields[80];
    int expect;
    int base;
    int stage;
    int hook_stage; /* the stage whose call the mutation and hook change (default: stage) */
    int judge;
    int target;
    size_t offset, width;
    int64_t value;
    hook_fn layout; /* before allocation: changes the plans (valid layouts) */
    hook_fn hook;   /* right before the judged stage (or the whole case for ST_CUSTOM) */
    int arg;
    uint32_t statuses;
    int prep;
    unsigned flags;
} tcase;

struct run_ctx {
    setup s;
    const tcase *c;
    case_record *rec;
    uint64_t rng;
    int judged;
    fmha_bwd_launcher *launcher;
    size_t ws_size;
    void *ws;
    /* the arguments of each stage's call (defaults, then the hook) */
    const fmha_fwd_traits *f_traits;
    const fmha_fwd_args *f_args;
    fmha_stream_t f_stream;
    const fmha_bwd_traits *c_traits;
    fmha_bwd_launcher **c_out;
    const fmha_bwd_launcher *z_launcher;
    size_t *z_out;
    fmha_bwd_launcher *p_launcher;
    void *p_ws;
    size_t p_size;
    const int32_t *p_ssq, *p_ssk;
    fmha_stream_t p_stream;
    const fmha_pinned_allocator *p_alloc;
    int32_t p_method;
    const fmha_bwd_launcher *r_launcher;
    const fmha_bwd_args *r_args;
    fmha_stream_t r_stream;
};

#define MAX_CASES 1200
static tcase table[MAX_CASES];
static int table_size = -1;

static tcase *add(int expect, int base, int stage, const char *fields, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

static tcase *add(int expect, int base, int stage, const char *fields, const char *fmt, ...) {
    static const char *const base_names[] = {"",          "fwd",           "fwd group",         "fwd mha",  "bwd",
                                             "bwd det",   "bwd group",     "bwd group det",     "bwd mha"};
    tcase *c;
    va_list ap;
    if (table_size >= MAX_CASES) {
        fprintf(stderr, "fuzz: too many targeted cases\n");
        abort();
    }
    c = &table[table_size++];
    memset(c, 0, sizeof *c);
    c->expect = expect;
    c->base = base;
    c->stage = stage;
    c->hook_stage = stage;
    c->judge = expect == EXPECT_OK ? J_CHAIN : J_CALL;
    snprintf(c->fields, sizeof c->fields, "%s", fields ? fields : "");
    if (base != B_NONE) snprintf(c->desc, sizeof c->desc, "%s: ", base_names[base]);
    va_start(ap, fmt);
    vsnprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), fmt, ap);
    va_end(ap);
    return c;
}

/* A data mutation: `width` bytes at `offset` of the struct `target` set to `value`. */
static tcase *mut(int base, int target, size_t offset, size_t width, int64_t value, const char *fields,
                  const char *what) {
    static const int stage_of[] = {ST_SETUP, ST_FWD, ST_FWD, ST_CREATE, ST_RUN};
    static const char *const struct_of[] = {"", "fwd_traits", "fwd_args", "bwd_traits", "bwd_args"};
    tcase *c = add(EXPECT_ERROR, base, stage_of[target], fields, "%s.%s = %lld", struct_of[target], what, (long long)value);
    c->target = target;
    c->offset = offset;
    c->width = width;
    c->value = value;
    return c;
}

#define MEMBER_SIZE(type, member) sizeof(((type *)0)->member)
#define MUT(base, target, type, member, value, fields) \
    mut(base, target, offsetof(type, member), MEMBER_SIZE(type, member), (int64_t)(value), fields, #member)

/* ---- hooks --------------------------------------------------------------------------------------- */

static fmha_tensor *fwd_tensor(run_ctx *r, int i) {
    fmha_fwd_args *a = r->s.fa;
    switch (i) {
    case TQ: return &a->q;
    case TK: return &a->k;
    case TV: return &a->v;
    case TO: return &a->o;
    default: return &a->lse;
    }
}

static fmha_tensor *bwd_tensor(run_ctx *r, int i) {
    fmha_bwd_args *a = r->s.ba;
    switch (i) {
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

static fmha_tensor *stage_tensor(run_ctx *r, int i) {
    return r->c->stage == ST_FWD ? fwd_tensor(r, i) : bwd_tensor(r, i);
}

/* arg = tensor: data = a pointer whose extent wraps past the end of the address space (2^64 - 16:
 * aligned, and every tensor of the default problems is larger than 16 bytes) */
static void h_wrap(run_ctx *r) {
    stage_tensor(r, r->c->arg)->data = (void *)(UINTPTR_MAX - 15);
}

/* arg = tensor: data moved by `value` bytes (not a multiple of the element size) */
static void h_misalign(run_ctx *r) {
    fmha_tensor *t = stage_tensor(r, r->c->arg);
    t->data = (unsigned char *)t->data + r->c->value;
}

/* arg = tensor: batch_stride = value (group mode ignores it: any value is valid) */
static void h_batch_stride(run_ctx *r) {
    stage_tensor(r, r->c->arg)->batch_stride = r->c->value;
}

/* arg = dst * 100 + src * 4 + ... : dst.data = src.data + value bytes */
static void h_overlap(run_ctx *r) {
    int dst = r->c->arg / 100, src = r->c->arg % 100;
    fmha_tensor *d = stage_tensor(r, dst), *s = stage_tensor(r, src);
    d->data = (unsigned char *)s->data + r->c->value;
}

/* arg = tensor, value = which stride set to 0 (0 batch, 1 head, 2 row) or an element count (value
 * >= 10: row stride = value - 10) */
static void h_self_overlap(run_ctx *r) {
    fmha_tensor *t = stage_tensor(r, r->c->arg);
    if (r->c->value == 0) t->batch_stride = 0;
    else if (r->c->value == 1) t->head_stride = 0;
    else if (r->c->value == 2) t->row_stride = 0;
    else t->row_stride = r->c->value - 10;
}

/* arg: 0 NaN, 1 +inf, 2 -inf */
static void h_scale(run_ctx *r) {
    float v = r->c->arg == 0 ? NAN : r->c->arg == 1 ? INFINITY : -INFINITY;
    if (r->c->stage == ST_FWD) r->s.fa->scale = v;
    else r->s.ba->scale = v;
}

static void h_fwd_null(run_ctx *r) {
    if (r->c->arg == 0) r->f_traits = NULL;
    else r->f_args = NULL;
}

static void h_garbage_stream(run_ctx *r) {
    fmha_stream_t bad = (fmha_stream_t)(uintptr_t)0x1234;
    if (r->c->arg == 1) {
        fmha_stream_t s = NULL;
        if (fmha_stream_create(&s) == FMHA_OK) fmha_stream_destroy(s);
        bad = s;
    }
    if (r->c->stage == ST_FWD) r->f_stream = bad;
    else if (r->c->stage == ST_PREPARE) r->p_stream = bad;
    else r->r_stream = bad;
}

/* Group-mode device seqstarts / logical lengths (the forward reads them while it runs). */
static void h_dev_seq(run_ctx *r) {
    setup *s = &r->s;
    switch (r->c->arg) {
    case 0: s->ssq[2] = 3; break;                 /* 0 5 3 17: decreasing */
    case 1: s->ssq[3] = s->sq + 1; break;         /* past the total */
    case 2: s->ssk[0] = -1; break;                /* negative start */
    case 3: s->ssq[1] = INT32_MIN; break;
    case 4: s->ssk[3] = INT32_MAX; break;
    case 5: s->ssk[2] = s->ssk[1] - 1; s->ssk[3] = s->ssk[2] + 10; break; /* 0 8 7 17: decreasing k, no batch too long */
    default: break;
    }
}

static void h_logical(run_ctx *r) {
    int32_t *lens = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)r->s.batch, 4, "seqlen_q_ptr");
    int b;
    for (b = 0; b < r->s.batch; ++b) lens[b] = r->s.lens_q[b];
    if (r->c->arg == 0) lens[0] = r->s.lens_q[0] + 1; /* longer than physical */
    else if (r->c->arg == 1) lens[2] = -1;
    else if (r->c->arg == 2) lens[1] = INT32_MAX;
    if (r->c->arg == 3) {
        int32_t *lk = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)r->s.batch, 4, "seqlen_k_ptr");
        for (b = 0; b < r->s.batch; ++b) lk[b] = r->s.lens_k[b];
        lk[1] = r->s.lens_k[1] + 1;
        if (r->c->stage == ST_FWD) r->s.fa->seqlen_k_ptr = lk;
        else r->s.ba->seqlen_k_ptr = lk;
        return;
    }
    if (r->c->stage == ST_FWD) r->s.fa->seqlen_q_ptr = lens;
    else r->s.ba->seqlen_q_ptr = lens;
}

static void h_create(run_ctx *r) {
    if (r->c->arg == 0) r->c_traits = NULL;
    else r->c_out = NULL;
}

static void h_size(run_ctx *r) {
    if (r->c->arg == 0) r->z_launcher = NULL;
    else r->z_out = NULL;
}

/* host seqstart arrays for the prepare: a copy of the valid ones with one change */
static int32_t *host_seq(run_ctx *r, const int32_t *from, const char *name) {
    int32_t *copy = (int32_t *)gp_alloc(sizeof(int32_t) * (size_t)(r->s.batch + 1), 4, name);
    memcpy(copy, from, sizeof(int32_t) * (size_t)(r->s.batch + 1));
    return copy;
}

static fmha_status fail_allocate(void *user, size_t bytes, void **ptr) {
    (void)user;
    (void)bytes;
    (void)ptr;
    return FMHA_ERR_OUT_OF_MEMORY;
}

static fmha_status null_allocate(void *user, size_t bytes, void **ptr) {
    (void)user;
    (void)bytes;
    *ptr = NULL;
    return FMHA_OK;
}

static fmha_status good_allocate(void *user, size_t bytes, void **ptr) {
    (void)user;
    return fmha_host_malloc_pinned(ptr, bytes);
}

static void good_free(void *user, void *ptr) {
    (void)user;
    fmha_host_free_pinned(ptr);
}

static fmha_pinned_allocator *allocator_struct(void) {
    fmha_pinned_allocator *a = (fmha_pinned_allocator *)gp_alloc(sizeof *a, 8, "allocator");
    a->struct_size = sizeof *a;
    a->user_data = NULL;
    a->allocate = good_allocate;
    a->free = good_free;
    return a;
}

/* prepare hooks, arg selects */
enum {
    P_WS_NULL, P_SIZE_MINUS_1, P_SIZE_0, P_MISALIGN, P_LAUNCHER_NULL, P_BATCH_SSQ, P_BATCH_SSK, P_SSQ_NULL, P_SSK_NULL,
    P_SSQ_DECREASING, P_SSQ_START_1, P_SSQ_PAST_TOTAL, P_SSK_PAST_TOTAL, P_SSK_DECREASING, P_SSK_LONG, P_SSQ_NEG,
    P_METHOD, P_ALLOC_SIZE_0, P_ALLOC_SIZE_BIG, P_ALLOC_NO_ALLOCATE, P_ALLOC_NO_FREE, P_ALLOC_FAILS, P_ALLOC_NULL,
    P_DEV_SSQ_DECREASING, P_DEV_SSK_PAST_TOTAL, P_GARBAGE_LAUNCHER,
};

static void h_prepare(run_ctx *r) {
    setup *s = &r->s;
    int32_t *h;
    fmha_pinned_allocator *a;
    switch (r->c->arg) {
    case P_WS_NULL: r->p_ws = NULL; break;
    case P_SIZE_MINUS_1: r->p_size = r->ws_size - 1; break;
    case P_SIZE_0: r->p_size = 0; break;
    case P_MISALIGN: {
        unsigned char *w = (unsigned char *)gp_alloc(r->ws_size + 16, 16, "workspace (misaligned)");
        r->p_ws = w + r->c->value;
        r->p_size = r->ws_size;
        s->ba->workspace = r->p_ws; /* the run uses what was prepared */
        break;
    }
    case P_LAUNCHER_NULL: r->p_launcher = NULL; break;
    case P_BATCH_SSQ: r->p_ssq = s->ssq; break;
    case P_BATCH_SSK: r->p_ssk = s->ssk; break;
    case P_SSQ_NULL: r->p_ssq = NULL; break;
    case P_SSK_NULL: r->p_ssk = NULL; break;
    case P_SSQ_DECREASING: h = host_seq(r, s->ssq, "host seqstart_q"); h[2] = h[1] - 1; r->p_ssq = h; break;
    case P_SSQ_START_1: h = host_seq(r, s->ssq, "host seqstart_q"); h[0] = 1; r->p_ssq = h; break;
    case P_SSQ_PAST_TOTAL: h = host_seq(r, s->ssq, "host seqstart_q"); h[s->batch] = s->sq + 1; r->p_ssq = h; break;
    case P_SSK_PAST_TOTAL: h = host_seq(r, s->ssk, "host seqstart_k"); h[s->batch] = s->sk + 5; r->p_ssk = h; break;
    case P_SSK_DECREASING: h = host_seq(r, s->ssk, "host seqstart_k"); h[1] = h[2] + 1; r->p_ssk = h; break;
    case P_SSK_LONG: /* a batch of 13 keys > max_seqlen_k = 12 (totals unchanged) */
        h = host_seq(r, s->ssk, "host seqstart_k");
        h[2] = h[1] + s->max_sk + 1;
        r->p_ssk = h;
        break;
    case P_SSQ_NEG: h = host_seq(r, s->ssq, "host seqstart_q"); h[1] = -3; r->p_ssq = h; break;
    case P_METHOD: r->p_method = (int32_t)r->c->value; break;
    case P_ALLOC_SIZE_0: a = allocator_struct(); a->struct_size = 0; r->p_alloc = a; break;
    case P_ALLOC_SIZE_BIG: a = allocator_struct(); a->struct_size = sizeof *a + 8; r->p_alloc = a; break;
    case P_ALLOC_NO_ALLOCATE: a = allocator_struct(); a->allocate = NULL; r->p_alloc = a; break;
    case P_ALLOC_NO_FREE: a = allocator_struct(); a->free = NULL; r->p_alloc = a; break;
    case P_ALLOC_FAILS: a = allocator_struct(); a->allocate = fail_allocate; r->p_alloc = a; break;
    case P_ALLOC_NULL: a = allocator_struct(); a->allocate = null_allocate; r->p_alloc = a; break;
    case P_DEV_SSQ_DECREASING: s->ssq[2] = s->ssq[1] - 1; break;
    case P_DEV_SSK_PAST_TOTAL: s->ssk[s->batch] = s->sk + 5; break;
    case P_GARBAGE_LAUNCHER: r->p_launcher = (fmha_bwd_launcher *)(uintptr_t)0x1234; break;
    default: break;
    }
}

enum {
    R_ARGS_NULL, R_LAUNCHER_NULL, R_WS_NULL, R_WS_OTHER, R_WS_GARBAGE, R_WS_UNPREPARED, R_WS_MISALIGNED, R_WS_OTHER_TRAITS,
    R_WS_SAME_TRAITS, R_DEV_SSQ_CHANGED, R_DEV_SSQ_OTHER, R_DEV_SSK_DECREASING, R_WSSIZE_MINUS_1, R_WSSIZE_1, R_WSSIZE_0,
    R_WSSIZE_BIG, R_ARGS_V01,
};

static int precondition(run_ctx *r, const char *call, fmha_status st);

/* A workspace prepared by a second launcher created from `traits` (destroyed right after the
 * prepare), at least as large as this case's launcher needs. Returns NULL on failure (noted). */
static void *workspace_of_other_launcher(run_ctx *r, const fmha_bwd_traits *traits, size_t *bytes) {
    setup *s = &r->s;
    fmha_bwd_launcher *other = NULL;
    size_t need = 0;
    void *ws;
    if (!precondition(r, "create (a second launcher)", fmha_bwd_launcher_create(traits, &other))) return NULL;
    if (!precondition(r, "workspace_size (second launcher)", fmha_bwd_launcher_workspace_size(other, &need))) return NULL;
    if (need < r->ws_size) need = r->ws_size;
    ws = gp_alloc(need, 16, "workspace (second launcher)");
    if (!precondition(r, "prepare_workspace (second launcher)",
                      fmha_bwd_launcher_prepare_workspace(other, ws, need, s->group ? s->ssq : NULL, s->group ? s->ssk : NULL)))
        return NULL;
    if (!precondition(r, "destroy (second launcher)", fmha_bwd_launcher_destroy(other))) return NULL;
    *bytes = need;
    return ws;
}

static void h_run(run_ctx *r) {
    setup *s = &r->s;
    switch (r->c->arg) {
    case R_ARGS_NULL: r->r_args = NULL; break;
    case R_LAUNCHER_NULL: r->r_launcher = NULL; break;
    case R_WS_NULL: s->ba->workspace = NULL; break;
    case R_WS_OTHER: s->ba->workspace = gp_alloc(r->ws_size, 16, "workspace (never prepared)"); break;
    case R_WS_GARBAGE: {
        unsigned char *w = (unsigned char *)gp_alloc(r->ws_size, 16, "workspace (random bytes)");
        size_t i;
        for (i = 0; i < r->ws_size; ++i) w[i] = (unsigned char)rng_next(&r->rng);
        s->ba->workspace = w;
        break;
    }
    case R_WS_UNPREPARED: break; /* with F_NO_PREPARE */
    case R_WS_MISALIGNED:
        s->ba->workspace = (unsigned char *)gp_alloc(r->ws_size + 32, 16, "workspace (misaligned)") + 8;
        break;
    case R_WS_OTHER_TRAITS:
    case R_WS_SAME_TRAITS: {
        /* other traits: the other launcher's schedule differs (is_deterministic toggled), so its
         * workspace was not prepared for this launcher */
        fmha_bwd_traits *t = (fmha_bwd_traits *)gp_alloc(sizeof *t, 8, "bwd_traits (second launcher)");
        size_t bytes = 0;
        void *ws;
        memcpy(t, s->bt, sizeof *t);
        if (r->c->arg == R_WS_OTHER_TRAITS) t->is_deterministic = !t->is_deterministic;
        ws = workspace_of_other_launcher(r, t, &bytes);
        if (ws) {
            s->ba->workspace = ws;
            s->ba->workspace_size = bytes;
        }
        break;
    }
    case R_DEV_SSQ_CHANGED: s->ssq[1] = s->ssq[1] + 1; break; /* differs from what was prepared (and decreases) */
    case R_DEV_SSQ_OTHER: s->ssq[1] = s->ssq[1] - 1; break; /* other valid starts: 0 4 5 17 instead of 0 5 5 17 */
    case R_DEV_SSK_DECREASING: s->ssk[1] = s->ssk[2] + 1; break;
    case R_WSSIZE_MINUS_1: s->ba->workspace_size = r->ws_size - 1; break;
    case R_WSSIZE_1: s->ba->workspace_size = 1; break;
    case R_WSSIZE_0: s->ba->workspace_size = 0; break; /* 0: not checked */
    case R_WSSIZE_BIG: {
        size_t big = r->ws_size + 4096;
        void *ws = gp_alloc(big, 16, "workspace (4096 bytes more than needed)");
        if (!precondition(r, "prepare_workspace (larger workspace)",
                          fmha_bwd_launcher_prepare_workspace(r->launcher, ws, big, s->group ? s->ssq : NULL, s->group ? s->ssk : NULL)))
            break;
        s->ba->workspace = ws;
        s->ba->workspace_size = big;
        break;
    }
    case R_ARGS_V01: {
        /* a caller compiled against 0.1: its struct ends before workspace_size, flush against the guard page */
        size_t v01 = offsetof(fmha_bwd_args, workspace_size);
        unsigned char *old = (unsigned char *)gp_alloc(v01, 8, "bwd_args (0.1: 416 bytes)");
        memcpy(old, s->ba, v01);
        memcpy(old, &v01, sizeof v01); /* struct_size */
        r->r_args = (const fmha_bwd_args *)(const void *)old;
        break;
    }
    default: break;
    }
}

/* ---- valid layouts (before allocation) ----------------------------------------------------------- */

/* arg: which layout */
enum {
    L_PACKED_QKV,     /* q, k, v views of one [b][s][3][h][d] buffer (MHA, sq == sk) */
    L_PACKED_DQKV,    /* dq, dk, dv views of one [b][s][3][h][d] buffer, and q, k, v packed too */
    L_KV_ALIAS,       /* v.data == k.data (the same values) */
    L_Q_BROADCAST,    /* q.head_stride = 0: every head reads the same queries */
    L_KV_BATCH_BCAST, /* k, v batch_stride = 0: batches share K/V */
    L_O_PADDED,       /* o rows padded to twice their width, lse in the padding's buffer after o */
    L_BHSD,           /* every tensor [b][h][s][d] */
    L_DO_ALIAS_O,     /* d_o.data == o.data (an input aliasing another input) */
    L_EMPTY_Q,        /* seqlen_q = 0: q-side tensors may be NULL */
    L_EMPTY_K,        /* seqlen_k = 0: k and v may be NULL (rows see no keys) */
    L_DQKV_HEADS,     /* dq/dk/dv interleaved per head: [b][s][h][3][d] */
    L_MAX_Q_HUGE,     /* group mode: max_seqlen_q = INT32_MAX (a valid upper bound) */
    L_MAX_K_HUGE,     /* group mode: max_seqlen_k = INT32_MAX */
};

static void set_bshd_packed(setup *s, int i, int buf, int slot, int nslots) {
    tensor_plan *p = &s->plan[i];
    int64_t h = tensor_heads(s, i), c = tensor_cols(s, i), rows = tensor_rows(s, i);
    p->buf = buf;
    p->offset = (size_t)slot * (size_t)(h * c) * 2;
    p->row_stride = nslots * h * c;
    p->head_stride = c;
    p->batch_stride = s->group ? 0 : rows * nslots * h * c;
}

/* arg = dst * 100 + src, value = bytes: dst placed `value` bytes after src in src's buffer (the
 * buffer is sized for both, so only the overlap is wrong) */
static void l_overlap(run_ctx *r) {
    int dst = r->c->arg / 100, src = r->c->arg % 100;
    r->s.plan[dst].buf = r->s.plan[src].buf;
    r->s.plan[dst].offset = r->s.plan[src].offset + (size_t)r->c->value;
}

static void l_layout(run_ctx *r) {
    setup *s = &r->s;
    int i;
    switch (r->c->arg) {
    case L_PACKED_QKV:
        set_bshd_packed(s, TQ, TQ, 0, 3);
        set_bshd_packed(s, TK, TQ, 1, 3);
        set_bshd_packed(s, TV, TQ, 2, 3);
        break;
    case L_PACKED_DQKV:
        set_bshd_packed(s, TQ, TQ, 0, 3);
        set_bshd_packed(s, TK, TQ, 1, 3);
        set_bshd_packed(s, TV, TQ, 2, 3);
        set_bshd_packed(s, TDQ, TDQ, 0, 3);
        set_bshd_packed(s, TDK, TDQ, 1, 3);
        set_bshd_packed(s, TDV, TDQ, 2, 3);
        break;
    case L_DQKV_HEADS: {
        int t[3] = {TDQ, TDK, TDV};
        for (i = 0; i < 3; ++i) {
            tensor_plan *p = &s->plan[t[i]];
            int64_t h = s->hq, c = s->dq;
            p->buf = TDQ;
            p->offset = (size_t)i * (size_t)c * 2;
            p->row_stride = h * 3 * c;
            p->head_stride = 3 * c;
            p->batch_stride = s->group ? 0 : s->sq * h * 3 * c;
        }
        break;
    }
    case L_KV_ALIAS: s->plan[TV] = s->plan[TK]; break;
    case L_Q_BROADCAST: s->plan[TQ].head_stride = 0; break;
    case L_KV_BATCH_BCAST: s->plan[TK].batch_stride = 0; s->plan[TV].batch_stride = 0; break;
    case L_O_PADDED:
        s->plan[TO].row_stride *= 2;
        s->plan[TO].batch_stride *= 2;
        break;
    case L_BHSD:
        for (i = 0; i < NT; ++i) {
            tensor_plan *p = &s->plan[i];
            int64_t h = tensor_heads(s, i), rows = tensor_rows(s, i), c = tensor_cols(s, i);
            if (i == TLSE || i == TD) continue;
            p->row_stride = c;
            p->head_stride = rows * c;
            p->batch_stride = s->group ? 0 : h * rows * c;
        }
        break;
    case L_DO_ALIAS_O: s->plan[TDO] = s->plan[TO]; break;
    case L_MAX_Q_HUGE: s->max_sq = INT32_MAX; break;
    case L_MAX_K_HUGE: s->max_sk = INT32_MAX; break;
    case L_EMPTY_Q:
        s->sq = 0;
        s->max_sq = 0;
        s->plan[TQ].buf = s->plan[TO].buf = s->plan[TLSE].buf = BUF_NULL;
        if (s->op_bwd) s->plan[TDO].buf = s->plan[TD].buf = s->plan[TDQ].buf = BUF_NULL;
        setup_default_layout_strides:
        for (i = 0; i < NT; ++i) {
            tensor_plan *p = &s->plan[i];
            int64_t h = tensor_heads(s, i), rows = tensor_rows(s, i), c = tensor_cols(s, i);
            if (i == TLSE || i == TD) {
                p->head_stride = rows;
                p->batch_stride = s->group ? 0 : h * rows;
            } else {
                p->batch_stride = s->group ? 0 : rows * h * c;
            }
        }
        break;
    case L_EMPTY_K:
        s->sk = 0;
        s->max_sk = 0;
        s->plan[TK].buf = s->plan[TV].buf = BUF_NULL;
        if (s->op_bwd) s->plan[TDK].buf = s->plan[TDV].buf = BUF_NULL;
        goto setup_default_layout_strides;
    default: break;
    }
}

/* ---- judging ------------------------------------------------------------------------------------- */

static void judged(run_ctx *r, const char *call, fmha_status st) {
    case_record *rec = r->rec;
    r->judged = 1;
    rec->status = st;
    last_message(rec->message, sizeof rec->message);
    appendf(rec->note, sizeof rec->note, "judged: %s; ", call);
    rec->phase = 1;
    report(rec);
}

/* A call before the judged one: must succeed. Returns 1 if it did. */
static int precondition(run_ctx *r, const char *call, fmha_status st) {
    char msg[600];
    if (st == FMHA_OK) return 1;
    last_message(msg, sizeof msg);
    appendf(r->rec->note, sizeof r->rec->note, "valid step %s failed: %s (%d): %s; ", call, fmha_status_string(st), (int)st,
            msg);
    r->rec->correct = 0;
    return 0;
}

/* One call of the chain. Returns 1 to go on. */
static int step(run_ctx *r, int stage, const char *call, fmha_status st) {
    case_record *rec = r->rec;
    char msg[600];
    if (!r->judged && stage == r->c->stage) {
        judged(r, call, st);
        return st == FMHA_OK;
    }
    if (!r->judged) return precondition(r, call, st);
    if (st == FMHA_OK) return 1;
    last_message(msg, sizeof msg);
    if (r->c->judge == J_CHAIN && rec->status == FMHA_OK) {
        rec->status = st;
        snprintf(rec->message, sizeof rec->message, "%s", msg);
        appendf(rec->note, sizeof rec->note, "reported by the later %s; ", call);
        report(rec);
    } else if (r->c->expect == EXPECT_ANY && rec->status == FMHA_OK) {
        /* an undecided input the library accepted must then work */
        rec->correct = 0;
        appendf(rec->note, sizeof rec->note, "accepted, but the later %s failed: %s (%d): %s; ", call, fmha_status_string(st), (int)st,
                msg);
    } else {
        appendf(rec->note, sizeof rec->note, "then %s: %s (%d): %s; ", call, fmha_status_string(st), (int)st, msg);
    }
    return 0;
}

static void apply_mutation(run_ctx *r) {
    const tcase *c = r->c;
    unsigned char *base = NULL;
    if (c->target == TG_FT) base = (unsigned char *)r->s.ft;
    else if (c->target == TG_FA) base = (unsigned char *)r->s.fa;
    else if (c->target == TG_BT) base = (unsigned char *)r->s.bt;
    else if (c->target == TG_BA) base = (unsigned char *)r->s.ba;
    if (base != NULL) {
        if (c->width == 4) {
            int32_t v = (int32_t)c->value;
            memcpy(base + c->offset, &v, 4);
        } else if (c->width == 8) {
            int64_t v = c->value;
            memcpy(base + c->offset, &v, 8);
        }
    }
    if (c->hook) c->hook(r);
}

static void check_results(run_ctx *r, int backward) {
    if (r->c->expect == EXPECT_ERROR || r->rec->status != FMHA_OK || r->rec->correct == 0) return;
    r->rec->correct = setup_check(&r->s, backward, r->rec->note, sizeof r->rec->note);
    if (r->rec->correct < 0) appendf(r->rec->note, sizeof r->rec->note, "results not checkable; ");
}

/* Nothing computed: dq, dk and dv must still hold their poison. Returns 1 if so (else noted, wrong). */
static int check_unwritten(run_ctx *r) {
    static const int t[3] = {TDQ, TDK, TDV};
    int i, ok = 1;
    for (i = 0; i < 3; ++i) {
        long written = setup_written(&r->s, t[i]);
        if (written > 0) {
            appendf(r->rec->note, sizeof r->rec->note, "%s: %ld bytes written, although nothing may be computed; ", tensor_names[t[i]],
                    written);
            r->rec->correct = 0;
            ok = 0;
        }
    }
    return ok;
}

static void run_chain(run_ctx *r) {
    setup *s = &r->s;
    const tcase *c = r->c;
    fmha_status st;
    if (!s->op_bwd) {
        r->f_traits = s->ft;
        r->f_args = s->fa;
        r->f_stream = s->stream;
        setup_poison(s, 0);
        if (c->hook_stage == ST_FWD) apply_mutation(r);
        if (!step(r, ST_FWD, "fmha_fwd", fmha_fwd(r->f_traits, r->f_args, r->f_stream))) {
            fmha_device_synchronize();
            return;
        }
        if (!step(r, ST_FWD_SYNC, "fmha_stream_synchronize", fmha_stream_synchronize(r->f_stream))) return;
        check_results(r, 0);
        return;
    }
    if (!step(r, ST_SETUP, "the forward (setup)", setup_run_forward(s))) return;
    setup_poison(s, 1);
    /* create */
    r->c_traits = s->bt;
    r->c_out = &r->launcher;
    if (c->hook_stage == ST_CREATE) apply_mutation(r);
    st = fmha_bwd_launcher_create(r->c_traits, r->c_out);
    if (!step(r, ST_CREATE, "fmha_bwd_launcher_create", st)) return;
    if (r->launcher == NULL) {
        appendf(r->rec->note, sizeof r->rec->note, "create returned OK but no launcher; ");
        return;
    }
    /* workspace size */
    r->z_launcher = r->launcher;
    r->z_out = &r->ws_size;
    if (c->hook_stage == ST_SIZE) apply_mutation(r);
    st = fmha_bwd_launcher_workspace_size(r->z_launcher, r->z_out);
    if (!step(r, ST_SIZE, "fmha_bwd_launcher_workspace_size", st)) goto out;
    if (r->ws_size > ((size_t)1 << 31)) {
        appendf(r->rec->note, sizeof r->rec->note, "workspace_size %zu bytes: not allocated; ", r->ws_size);
        goto out;
    }
    r->ws = gp_alloc(r->ws_size, 16, "workspace");
    s->ba->workspace = r->ws;
    s->ba->workspace_size = r->ws_size; /* 0.2: checked against the launcher's size */
    /* prepare */
    r->p_launcher = r->launcher;
    r->p_ws = r->ws;
    r->p_size = r->ws_size;
    r->p_ssq = s->group ? s->ssq : NULL;
    r->p_ssk = s->group ? s->ssk : NULL;
    r->p_stream = s->stream;
    r->p_alloc = NULL;
    r->p_method = c->prep == PREP_HOST ? FMHA_PREPARE_HOST : c->prep == PREP_DEVICE ? FMHA_PREPARE_DEVICE : FMHA_PREPARE_AUTO;
    if (!(c->flags & F_NO_PREPARE)) {
        if (c->hook_stage == ST_PREPARE) apply_mutation(r);
        if (c->prep == PREP_SYNC) {
            st = fmha_bwd_launcher_prepare_workspace(r->p_launcher, r->p_ws, r->p_size, r->p_ssq, r->p_ssk);
            if (!step(r, ST_PREPARE, "fmha_bwd_launcher_prepare_workspace", st)) goto out;
        } else {
            st = fmha_bwd_launcher_prepare_workspace_async(r->p_launcher, r->p_ws, r->p_size, r->p_ssq, r->p_ssk,
                                                           r->p_stream, r->p_alloc, r->p_method);
            if (!step(r, ST_PREPARE, "fmha_bwd_launcher_prepare_workspace_async", st)) goto out;
            if (!step(r, ST_PREPARE_SYNC, "fmha_stream_synchronize (after the async prepare)",
                      fmha_stream_synchronize(r->p_stream)))
                goto out;
        }
    }
    /* run */
    r->r_launcher = r->launcher;
    r->r_args = s->ba;
    r->r_stream = s->stream;
    if (c->hook_stage == ST_RUN) apply_mutation(r);
    st = fmha_bwd_launcher_run(r->r_launcher, r->r_args, r->r_stream);
    if (!step(r, ST_RUN, "fmha_bwd_launcher_run", st)) {
        fmha_device_synchronize();
        goto out;
    }
    {
        int ok = step(r, ST_RUN_SYNC, "fmha_stream_synchronize", fmha_stream_synchronize(r->r_stream));
        if (c->flags & F_UNWRITTEN) check_unwritten(r);
        if (!ok) goto out;
    }
    check_results(r, 1);
out:
    if (r->launcher) {
        st = fmha_bwd_launcher_destroy(r->launcher);
        if (st != FMHA_OK) appendf(r->rec->note, sizeof r->rec->note, "destroy of the case's launcher: %d; ", (int)st);
        r->launcher = NULL;
    }
}

/* ---- custom cases -------------------------------------------------------------------------------- */

static void new_problem(run_ctx *r, int op_bwd, int group, int det) {
    setup_default(&r->s, op_bwd, group, det);
    setup_default_layout(&r->s);
    setup_alloc(&r->s, &r->rng);
}

/* A launcher with its workspace prepared for r->s (batch mode). Returns NULL on failure (noted). */
static fmha_bwd_launcher *prepared_launcher(run_ctx *r) {
    fmha_bwd_launcher *l = NULL;
    if (!precondition(r, "create", fmha_bwd_launcher_create(r->s.bt, &l))) return NULL;
    if (!precondition(r, "workspace_size", fmha_bwd_launcher_workspace_size(l, &r->ws_size))) return NULL;
    r->ws = gp_alloc(r->ws_size, 16, "workspace");
    r->s.ba->workspace = r->ws;
    r->s.ba->workspace_size = r->ws_size;
    if (!precondition(r, "prepare", fmha_bwd_launcher_prepare_workspace(l, r->ws, r->ws_size, r->s.group ? r->s.ssq : NULL,
                                                                        r->s.group ? r->s.ssk : NULL)))
        return NULL;
    return l;
}

/* Launcher handles: arg selects the misuse. */
enum {
    H_DOUBLE_DESTROY, H_DESTROYED_SIZE, H_DESTROYED_RUN, H_DESTROYED_PREPARE, H_DESTROYED_PREPARE_ASYNC, H_GARBAGE_SIZE,
    H_GARBAGE_RUN, H_GARBAGE_PREPARE, H_GARBAGE_DESTROY, H_RANDOM_SIZE, H_RANDOM_RUN, H_RANDOM_PREPARE, H_RANDOM_DESTROY,
    H_RELEASER_SIZE, H_RELEASER_RUN, H_RELEASER_DESTROY, H_GARBAGE_PREPARE_ASYNC,
    H_NULL_DESTROY, H_NULL_RUN, H_NULL_PREPARE_ASYNC, H_NULL_PREPARE, H_NULL_SIZE, H_DESTROY_QUEUED,
};

static fmha_bwd_launcher *random_bytes_handle(run_ctx *r) {
    unsigned char *bytes = (unsigned char *)gp_alloc(64, 8, "64 random bytes");
    int i;
    for (i = 0; i < 64; ++i) bytes[i] = (unsigned char)rng_next(&r->rng);
    return (fmha_bwd_launcher *)bytes;
}

static void c_launcher_handle(run_ctx *r) {
    fmha_bwd_launcher *l = NULL, *bad = NULL;
    size_t bytes = 0;
    int a = r->c->arg;
    new_problem(r, 1, 0, 0);
    if (!precondition(r, "forward", setup_run_forward(&r->s))) return;
    if (a == H_NULL_DESTROY) {
        judged(r, "fmha_bwd_launcher_destroy(NULL)", fmha_bwd_launcher_destroy(NULL));
        return;
    }
    if (a == H_NULL_RUN) {
        judged(r, "fmha_bwd_launcher_run(NULL, ...)", fmha_bwd_launcher_run(NULL, r->s.ba, NULL));
        return;
    }
    if (a == H_NULL_PREPARE_ASYNC) {
        void *ws = gp_alloc(4096, 16, "workspace");
        judged(r, "prepare_workspace_async(NULL, ...)",
               fmha_bwd_launcher_prepare_workspace_async(NULL, ws, 4096, NULL, NULL, NULL, NULL, FMHA_PREPARE_AUTO));
        return;
    }
    if (a == H_NULL_PREPARE) {
        void *ws = gp_alloc(4096, 16, "workspace");
        judged(r, "prepare_workspace(NULL, ...)", fmha_bwd_launcher_prepare_workspace(NULL, ws, 4096, NULL, NULL));
        return;
    }
    if (a == H_NULL_SIZE) {
        judged(r, "workspace_size(NULL, &bytes)", fmha_bwd_launcher_workspace_size(NULL, &bytes));
        return;
    }
    if (a >= H_RELEASER_SIZE && a <= H_RELEASER_DESTROY) {
        /* a live releaser's handle passed as a launcher: refused, and the releaser is untouched */
        fmha_pinned_releaser *rel = NULL;
        void *p = NULL;
        if (!precondition(r, "fmha_pinned_releaser_create", fmha_pinned_releaser_create(NULL, &rel))) return;
        bad = (fmha_bwd_launcher *)(void *)rel;
        if (a == H_RELEASER_SIZE) judged(r, "fmha_bwd_launcher_workspace_size(a releaser)", fmha_bwd_launcher_workspace_size(bad, &bytes));
        else if (a == H_RELEASER_RUN) {
            judged(r, "fmha_bwd_launcher_run(a releaser, ...)", fmha_bwd_launcher_run(bad, r->s.ba, NULL));
            step(r, ST_RUN_SYNC, "fmha_device_synchronize", fmha_device_synchronize());
        } else judged(r, "fmha_bwd_launcher_destroy(a releaser)", fmha_bwd_launcher_destroy(bad));
        if (precondition(r, "fmha_host_malloc_pinned", fmha_host_malloc_pinned(&p, 64)) &&
            !precondition(r, "release on the releaser afterwards", fmha_pinned_releaser_release(rel, p)))
            fmha_host_free_pinned(p);
        precondition(r, "destroy the releaser afterwards", fmha_pinned_releaser_destroy(rel));
        return;
    }
    if (a == H_DESTROY_QUEUED) {
        /* valid: destroy while the run is still queued behind a slow forward on the same stream */
        fmha_stream_t stream = NULL;
        if (!precondition(r, "stream_create", fmha_stream_create(&stream))) return;
        l = prepared_launcher(r);
        if (!l) return;
        setup_poison(&r->s, 1);
        if (!precondition(r, "run", fmha_bwd_launcher_run(l, r->s.ba, stream))) return;
        judged(r, "fmha_bwd_launcher_destroy (work queued)", fmha_bwd_launcher_destroy(l));
        if (!step(r, ST_RUN_SYNC, "fmha_stream_synchronize", fmha_stream_synchronize(stream))) return;
        fmha_stream_destroy(stream);
        r->rec->correct = setup_check(&r->s, 1, r->rec->note, sizeof r->rec->note);
        return;
    }
    if (a <= H_DESTROYED_PREPARE_ASYNC) {
        l = prepared_launcher(r);
        if (!l) return;
        if (!precondition(r, "destroy", fmha_bwd_launcher_destroy(l))) return;
        bad = l;
    } else if (a <= H_GARBAGE_DESTROY || a == H_GARBAGE_PREPARE_ASYNC) {
        bad = (fmha_bwd_launcher *)(uintptr_t)0x1234;
        if (!precondition(r, "workspace_size of a valid launcher", fmha_bwd_workspace_size_upper_bound(r->s.bt, &r->ws_size))) return;
    } else {
        bad = random_bytes_handle(r);
    }
    switch (a) {
    case H_DOUBLE_DESTROY:
    case H_GARBAGE_DESTROY:
    case H_RANDOM_DESTROY: judged(r, "fmha_bwd_launcher_destroy", fmha_bwd_launcher_destroy(bad)); break;
    case H_DESTROYED_SIZE:
    case H_GARBAGE_SIZE:
    case H_RANDOM_SIZE: judged(r, "fmha_bwd_launcher_workspace_size", fmha_bwd_launcher_workspace_size(bad, &bytes)); break;
    case H_DESTROYED_RUN:
    case H_GARBAGE_RUN:
    case H_RANDOM_RUN:
        judged(r, "fmha_bwd_launcher_run", fmha_bwd_launcher_run(bad, r->s.ba, NULL));
        step(r, ST_RUN_SYNC, "fmha_device_synchronize", fmha_device_synchronize());
        break;
    case H_DESTROYED_PREPARE:
    case H_GARBAGE_PREPARE:
    case H_RANDOM_PREPARE: {
        void *ws = gp_alloc(4096, 16, "workspace");
        judged(r, "fmha_bwd_launcher_prepare_workspace", fmha_bwd_launcher_prepare_workspace(bad, ws, 4096, NULL, NULL));
        break;
    }
    case H_DESTROYED_PREPARE_ASYNC:
    case H_GARBAGE_PREPARE_ASYNC: {
        void *ws = gp_alloc(r->ws_size, 16, "workspace");
        judged(r, "fmha_bwd_launcher_prepare_workspace_async",
               fmha_bwd_launcher_prepare_workspace_async(bad, ws, r->ws_size, NULL, NULL, NULL, NULL, FMHA_PREPARE_HOST));
        step(r, ST_RUN_SYNC, "fmha_device_synchronize", fmha_device_synchronize());
        break;
    }
    default: break;
    }
}

/* Releaser misuse. */
enum {
    RL_DOUBLE_DESTROY, RL_RELEASE_DESTROYED, RL_GARBAGE_RELEASE, RL_GARBAGE_DESTROY, RL_RANDOM_RELEASE, RL_RANDOM_DESTROY,
    RL_CREATE_NULL_OUT, RL_CREATE_SIZE_0, RL_CREATE_SIZE_BIG, RL_CREATE_NO_FREE, RL_RELEASE_NULL_PTR, RL_DESTROY_NULL,
    RL_CREATE_FLUSH_ALLOCATOR, RL_DEFAULT_RELEASE, RL_LAUNCHER_RELEASE, RL_LAUNCHER_DESTROY, RL_CREATE_NO_ALLOCATE,
};

static atomic_int frees_counted;

static void counting_free(void *user, void *ptr) {
    (void)user;
    atomic_fetch_add(&frees_counted, 1);
    fmha_host_free_pinned(ptr);
}

static void c_releaser(run_ctx *r) {
    fmha_pinned_releaser *rel = NULL, *bad;
    void *p = NULL;
    int a = r->c->arg;
    switch (a) {
    case RL_DOUBLE_DESTROY:
    case RL_RELEASE_DESTROYED:
        if (!precondition(r, "fmha_pinned_releaser_create", fmha_pinned_releaser_create(NULL, &rel))) return;
        if (!precondition(r, "fmha_pinned_releaser_destroy", fmha_pinned_releaser_destroy(rel))) return;
        if (a == RL_DOUBLE_DESTROY) {
            judged(r, "fmha_pinned_releaser_destroy (again)", fmha_pinned_releaser_destroy(rel));
        } else {
            if (!precondition(r, "fmha_host_malloc_pinned", fmha_host_malloc_pinned(&p, 64))) return;
            judged(r, "fmha_pinned_releaser_release (destroyed releaser)", fmha_pinned_releaser_release(rel, p));
        }
        return;
    case RL_GARBAGE_RELEASE:
    case RL_RANDOM_RELEASE:
        bad = a == RL_GARBAGE_RELEASE ? (fmha_pinned_releaser *)(uintptr_t)0x1234 : (fmha_pinned_releaser *)random_bytes_handle(r);
        if (!precondition(r, "fmha_host_malloc_pinned", fmha_host_malloc_pinned(&p, 64))) return;
        judged(r, "fmha_pinned_releaser_release", fmha_pinned_releaser_release(bad, p));
        return;
    case RL_GARBAGE_DESTROY:
    case RL_RANDOM_DESTROY:
        bad = a == RL_GARBAGE_DESTROY ? (fmha_pinned_releaser *)(uintptr_t)0x1234 : (fmha_pinned_releaser *)random_bytes_handle(r);
        judged(r, "fmha_pinned_releaser_destroy", fmha_pinned_releaser_destroy(bad));
        return;
    case RL_CREATE_NULL_OUT: judged(r, "fmha_pinned_releaser_create(NULL, NULL)", fmha_pinned_releaser_create(NULL, NULL)); return;
    case RL_CREATE_SIZE_0:
    case RL_CREATE_SIZE_BIG:
    case RL_CREATE_NO_FREE:
    case RL_CREATE_FLUSH_ALLOCATOR:
    case RL_CREATE_NO_ALLOCATE: {
        /* (a releaser only frees: allocate may be NULL) */
        fmha_pinned_allocator *al = allocator_struct();
        int counted = a == RL_CREATE_FLUSH_ALLOCATOR || a == RL_CREATE_NO_ALLOCATE;
        al->free = counting_free;
        if (a == RL_CREATE_SIZE_0) al->struct_size = 0;
        if (a == RL_CREATE_SIZE_BIG) al->struct_size = sizeof *al + 64;
        if (a == RL_CREATE_NO_FREE) al->free = NULL;
        if (a == RL_CREATE_NO_ALLOCATE) al->allocate = NULL;
        judged(r, "fmha_pinned_releaser_create", fmha_pinned_releaser_create(al, &rel));
        if (rel != NULL && r->rec->status == FMHA_OK) {
            if (counted && precondition(r, "malloc_pinned", fmha_host_malloc_pinned(&p, 64))) {
                step(r, ST_CUSTOM + 1, "release", fmha_pinned_releaser_release(rel, p));
            }
            step(r, ST_CUSTOM + 1, "destroy", fmha_pinned_releaser_destroy(rel));
            if (counted && atomic_load(&frees_counted) != 1) {
                appendf(r->rec->note, sizeof r->rec->note, "the released buffer was freed %d times (expected once); ",
                        atomic_load(&frees_counted));
                r->rec->correct = 0;
            }
        }
        return;
    }
    case RL_RELEASE_NULL_PTR:
        if (!precondition(r, "create", fmha_pinned_releaser_create(NULL, &rel))) return;
        judged(r, "fmha_pinned_releaser_release(r, NULL)", fmha_pinned_releaser_release(rel, NULL));
        fmha_pinned_releaser_destroy(rel);
        return;
    case RL_DESTROY_NULL: judged(r, "fmha_pinned_releaser_destroy(NULL)", fmha_pinned_releaser_destroy(NULL)); return;
    case RL_DEFAULT_RELEASE:
        if (!precondition(r, "fmha_host_malloc_pinned", fmha_host_malloc_pinned(&p, 64))) return;
        judged(r, "fmha_pinned_releaser_release(NULL releaser = the default)", fmha_pinned_releaser_release(NULL, p));
        return;
    case RL_LAUNCHER_RELEASE:
    case RL_LAUNCHER_DESTROY: {
        /* a live launcher's handle passed as a releaser: refused, and the launcher is untouched */
        fmha_bwd_launcher *l = NULL;
        size_t bytes = 0;
        new_problem(r, 1, 0, 0);
        if (!precondition(r, "fmha_bwd_launcher_create", fmha_bwd_launcher_create(r->s.bt, &l))) return;
        bad = (fmha_pinned_releaser *)(void *)l;
        if (a == RL_LAUNCHER_RELEASE) {
            if (!precondition(r, "fmha_host_malloc_pinned", fmha_host_malloc_pinned(&p, 64))) return;
            judged(r, "fmha_pinned_releaser_release(a launcher, p)", fmha_pinned_releaser_release(bad, p));
            if (r->rec->status != FMHA_OK) fmha_host_free_pinned(p); /* refused: still the caller's */
        } else {
            judged(r, "fmha_pinned_releaser_destroy(a launcher)", fmha_pinned_releaser_destroy(bad));
        }
        precondition(r, "workspace_size on the launcher afterwards", fmha_bwd_launcher_workspace_size(l, &bytes));
        precondition(r, "destroy the launcher afterwards", fmha_bwd_launcher_destroy(l));
        return;
    }
    default: return;
    }
}

/* Releases racing destroy: 4 threads release "buffers" on one releaser, without any coordination,
 * while the main thread destroys it; each thread goes on until the releaser has refused it a few
 * times. Contract: a release returns FMHA_OK (the releaser frees the buffer exactly once) or
 * FMHA_ERR_INVALID_ARGUMENT (the releaser was destroyed: the buffer was not taken, the caller still
 * owns it); nothing else, no crash. The buffers are tokens (addresses of slots of an array) that the
 * releaser's free function counts per slot, so that every attempt is accounted for exactly: freed
 * once if released, never if refused, never twice, never lost. */
#define RACE_THREADS 4
#define RACE_SLOTS 8192
typedef struct {
    fmha_pinned_releaser *rel;
    atomic_int go;
    unsigned char token[RACE_THREADS][RACE_SLOTS];
    atomic_int frees[RACE_THREADS][RACE_SLOTS];
    int status[RACE_THREADS][RACE_SLOTS]; /* -1: not attempted */
    int attempts[RACE_THREADS];
    char message[RACE_THREADS][160]; /* the refusal's message (first) */
    atomic_int stray_frees;
} race_state;

static race_state race;

static void race_free(void *user, void *ptr) {
    race_state *st = (race_state *)user;
    uintptr_t base = (uintptr_t)&st->token[0][0], at = (uintptr_t)ptr;
    if (at >= base && at < base + sizeof st->token) {
        size_t k = (size_t)(at - base);
        atomic_fetch_add(&st->frees[k / RACE_SLOTS][k % RACE_SLOTS], 1);
    } else {
        atomic_fetch_add(&st->stray_frees, 1);
    }
}

typedef struct {
    race_state *st;
    int id;
} race_arg;

static void *race_thread(void *arg) {
    race_arg *a = (race_arg *)arg;
    race_state *st = a->st;
    int i, refused = 0;
    while (!atomic_load(&st->go)) {
    }
    for (i = 0; i < RACE_SLOTS && refused < 3; ++i) {
        fmha_status s = fmha_pinned_releaser_release(st->rel, &st->token[a->id][i]);
        st->status[a->id][i] = (int)s;
        st->attempts[a->id] = i + 1;
        if (s != FMHA_OK) {
            if (refused++ == 0) last_message(st->message[a->id], sizeof st->message[a->id]);
        }
    }
    return NULL;
}

static void c_releaser_race(run_ctx *r) {
    int round, rounds = fuzz_light ? 6 : 25;
    long ok_total = 0, refused_total = 0;
    for (round = 0; round < rounds; ++round) {
        race_state *st = &race;
        pthread_t threads[RACE_THREADS];
        race_arg args[RACE_THREADS];
        fmha_pinned_allocator *al = allocator_struct();
        int i, k, bad = 0;
        memset(st, 0, sizeof *st);
        memset(st->status, 0xFF, sizeof st->status);
        al->user_data = st;
        al->allocate = NULL;
        al->free = race_free;
        if (!precondition(r, "fmha_pinned_releaser_create", fmha_pinned_releaser_create(al, &st->rel))) return;
        for (i = 0; i < RACE_THREADS; ++i) {
            args[i].st = st;
            args[i].id = i;
            pthread_create(&threads[i], NULL, race_thread, &args[i]);
        }
        atomic_store(&st->go, 1);
        usleep(100 + 150 * (unsigned)(round % 7));
        if (round == 0) judged(r, "fmha_pinned_releaser_destroy (racing releases)", fmha_pinned_releaser_destroy(st->rel));
        else step(r, ST_CUSTOM + 1, "fmha_pinned_releaser_destroy (racing releases)", fmha_pinned_releaser_destroy(st->rel));
        for (i = 0; i < RACE_THREADS; ++i) pthread_join(threads[i], NULL);
        /* the releaser is destroyed and its thread stopped: every free has happened */
        for (i = 0; i < RACE_THREADS && bad < 4; ++i) {
            for (k = 0; k < RACE_SLOTS && bad < 4; ++k) {
                int s = st->status[i][k], frees = atomic_load(&st->frees[i][k]);
                const char *what = NULL;
                if (s == -1 && frees != 0) what = "never released, but freed";
                else if (s == FMHA_OK && frees != 1) what = frees == 0 ? "released (FMHA_OK) but never freed (lost)" : "released (FMHA_OK) and freed more than once";
                else if (s == FMHA_ERR_INVALID_ARGUMENT && frees != 0) what = "refused (FMHA_ERR_INVALID_ARGUMENT) but freed by the releaser";
                else if (s != -1 && s != FMHA_OK && s != FMHA_ERR_INVALID_ARGUMENT) what = "a status other than FMHA_OK and FMHA_ERR_INVALID_ARGUMENT";
                if (s == FMHA_OK) ok_total++;
                else if (s == FMHA_ERR_INVALID_ARGUMENT) refused_total++;
                if (what) {
                    appendf(r->rec->note, sizeof r->rec->note, "round %d, thread %d, release %d: status %d, freed %d times: %s; ", round, i,
                            k, s, frees, what);
                    bad++;
                }
            }
            if (st->message[i][0] && round == 0 && i == 0)
                appendf(r->rec->note, sizeof r->rec->note, "a refusal's message: %s; ", st->message[i]);
        }
        if (atomic_load(&st->stray_frees) != 0) {
            appendf(r->rec->note, sizeof r->rec->note, "round %d: the releaser freed %d pointers that were never released; ", round,
                    atomic_load(&st->stray_frees));
            bad++;
        }
        if (bad) {
            r->rec->correct = 0;
            return;
        }
    }
    appendf(r->rec->note, sizeof r->rec->note, "%ld releases freed once, %ld refused after destroy (over %d rounds); ", ok_total,
            refused_total, rounds);
}

/* fmha_device_synchronize from two threads: one queues a forward on a private stream, destroys the
 * stream (its work still completes), does something else for 3 ms and waits with
 * fmha_device_synchronize, 12 times; the other calls fmha_device_synchronize in a loop meanwhile.
 * Every wait must cover the waiting thread's work. */
typedef struct {
    setup s;
    int failures;
    atomic_int done;
    char note[300];
} sync_thread_state;

static void *sync_spammer(void *arg) {
    sync_thread_state *t = (sync_thread_state *)arg;
    while (!atomic_load(&t->done)) {
        fmha_device_synchronize();
        usleep(100);
    }
    return NULL;
}

static void *sync_thread(void *arg) {
    sync_thread_state *t = (sync_thread_state *)arg;
    int round;
    for (round = 0; round < (fuzz_light ? 3 : 12); ++round) {
        fmha_stream_t stream = NULL;
        int64_t j, n = (int64_t)t->s.batch * t->s.sq * t->s.hq * t->s.dv;
        const uint16_t *o = (const uint16_t *)t->s.t[TO].data;
        setup_poison(&t->s, 0);
        if (fmha_stream_create(&stream) != FMHA_OK || fmha_fwd(t->s.ft, t->s.fa, stream) != FMHA_OK ||
            fmha_stream_destroy(stream) != FMHA_OK || usleep(3000) != 0 || fmha_device_synchronize() != FMHA_OK) {
            char msg[200];
            last_message(msg, sizeof msg);
            snprintf(t->note, sizeof t->note, "a call failed: %s", msg);
            t->failures++;
            break;
        }
        for (j = 0; j < n; ++j)
            if (o[j] == 0xFFFF) {
                snprintf(t->note, sizeof t->note,
                         "round %d: o still NaN-poisoned after fmha_device_synchronize returned OK (element %lld of %lld)", round,
                         (long long)j, (long long)n);
                t->failures++;
                break;
            }
        if (t->failures) break;
    }
    atomic_store(&t->done, 1);
    return NULL;
}

static void c_device_sync_threads(run_ctx *r) {
    static sync_thread_state state;
    pthread_t worker, spammer;
    memset(&state, 0, sizeof state);
    setup_default(&state.s, 0, 0, 0);
    state.s.sq = 256;
    state.s.sk = 256;
    state.s.dq = state.s.dv = 64;
    state.s.max_sq = state.s.sq;
    state.s.max_sk = state.s.sk;
    setup_default_layout(&state.s);
    setup_alloc(&state.s, &r->rng);
    pthread_create(&spammer, NULL, sync_spammer, &state);
    pthread_create(&worker, NULL, sync_thread, &state);
    pthread_join(worker, NULL);
    pthread_join(spammer, NULL);
    judged(r, "fmha_device_synchronize from two threads", FMHA_OK);
    r->rec->correct = state.failures == 0;
    if (state.failures) appendf(r->rec->note, sizeof r->rec->note, "%s; ", state.note);
}

/* is_deterministic = 1 is bitwise reproducible: two launchers (each with its own workspace) give
 * bitwise-equal dq, dk, dv. (Values other than 0 and 1 are invalid: see the table.) */
static void c_det_flag(run_ctx *r) {
    setup *s = &r->s;
    fmha_bwd_launcher *l = NULL;
    size_t bytes[3], n[3], i;
    unsigned char *first[3];
    int t[3] = {TDQ, TDK, TDV}, run;
    new_problem(r, 1, r->c->base == B_BWD_GROUP_DET, 1);
    if (!precondition(r, "forward", setup_run_forward(s))) return;
    for (i = 0; i < 3; ++i) {
        tensor_extent(s, t[i], &bytes[i]);
        n[i] = (size_t)bytes[i];
        first[i] = (unsigned char *)malloc(n[i] + 1);
    }
    for (run = 0; run < 2; ++run) {
        fmha_status st;
        s->bt->is_deterministic = 1;
        setup_poison(s, 1);
        st = fmha_bwd_launcher_create(s->bt, &l);
        if (run == 1) {
            judged(r, "fmha_bwd_launcher_create", st);
            if (st != FMHA_OK) break;
        } else if (!precondition(r, "create (the first launcher)", st)) {
            break;
        }
        if (!step(r, ST_SIZE, "workspace_size", fmha_bwd_launcher_workspace_size(l, &r->ws_size))) break;
        r->ws = gp_alloc(r->ws_size, 16, "workspace");
        s->ba->workspace = r->ws;
        s->ba->workspace_size = r->ws_size;
        if (!step(r, ST_PREPARE, "prepare",
                  fmha_bwd_launcher_prepare_workspace(l, r->ws, r->ws_size, s->group ? s->ssq : NULL, s->group ? s->ssk : NULL)))
            break;
        if (!step(r, ST_RUN, "run", fmha_bwd_launcher_run(l, s->ba, NULL))) break;
        if (!step(r, ST_RUN_SYNC, "sync", fmha_stream_synchronize(NULL))) break;
        fmha_bwd_launcher_destroy(l);
        l = NULL;
        if (run == 0) {
            for (i = 0; i < 3; ++i) memcpy(first[i], s->t[t[i]].data, n[i]);
        } else {
            r->rec->correct = setup_check(s, 1, r->rec->note, sizeof r->rec->note);
            for (i = 0; i < 3; ++i)
                if (memcmp(first[i], s->t[t[i]].data, n[i]) != 0) {
                    appendf(r->rec->note, sizeof r->rec->note, "%s differs bitwise between the two launchers; ", tensor_names[t[i]]);
                    r->rec->correct = 0;
                }
        }
    }
    if (l) fmha_bwd_launcher_destroy(l);
    for (i = 0; i < 3; ++i) free(first[i]);
}

/* batch = INT32_MAX, a valid request whose workspace cannot exist on most machines: the library may
 * answer an error (e.g. FMHA_ERR_OUT_OF_MEMORY) or succeed, never abort. arg 0: group-mode
 * deterministic create → workspace_size → prepare (workspace and the [batch + 1] zero seqstarts are
 * MAP_NORESERVE mappings: valid memory that costs nothing until touched); 1: the upper bound of
 * that; 2: batch-mode deterministic; 3: group-mode atomic; 4: group-mode deterministic, prepared
 * with prepare_workspace_async(DEVICE) (3 and 4 are not in the table: too slow). */
static void *reserve(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void c_big_batch(run_ctx *r) {
    fmha_bwd_traits *t = (fmha_bwd_traits *)gp_alloc(sizeof *t, 8, "bwd_traits");
    fmha_bwd_launcher *l = NULL;
    size_t bytes = 0, seq_bytes = ((size_t)INT32_MAX + 1) * sizeof(int32_t);
    int a = r->c->arg;
    fmha_status st;
    void *ws, *seq;
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
    t->batch = INT32_MAX;
    t->seqlen_q = t->seqlen_k = a == 2 ? 64 : 1 << 20;
    t->max_seqlen_q = t->max_seqlen_k = a == 2 ? 64 : 128;
    t->hdim_q = t->hdim_v = 64;
    t->nhead_q = t->nhead_k = 1;
    t->dtype = FMHA_DTYPE_BF16;
    t->is_group_mode = a == 2 ? 0 : 1;
    t->is_deterministic = a == 3 ? 0 : 1;
    r->rec->forbidden = -1;
    if (a == 1) {
        judged(r, "fmha_bwd_workspace_size_upper_bound", fmha_bwd_workspace_size_upper_bound(t, &bytes));
        if (r->rec->status == FMHA_OK) appendf(r->rec->note, sizeof r->rec->note, "upper bound = %zu bytes; ", bytes);
        return;
    }
    judged(r, "fmha_bwd_launcher_create", fmha_bwd_launcher_create(t, &l));
    if (l == NULL) return;
    st = fmha_bwd_launcher_workspace_size(l, &bytes);
    appendf(r->rec->note, sizeof r->rec->note, "workspace_size: %d, %zu bytes; ", (int)st, bytes);
    if (st != FMHA_OK) goto out;
    ws = reserve(bytes);
    seq = t->is_group_mode ? reserve(seq_bytes) : NULL;
    if (ws == NULL || (t->is_group_mode && seq == NULL)) {
        appendf(r->rec->note, sizeof r->rec->note, "could not reserve the workspace or seqstarts: not prepared; ");
        goto out;
    }
    report(r->rec);
    if (a == 4)
        st = fmha_bwd_launcher_prepare_workspace_async(l, ws, bytes, (const int32_t *)seq, (const int32_t *)seq, NULL, NULL,
                                                       FMHA_PREPARE_DEVICE);
    else
        st = fmha_bwd_launcher_prepare_workspace(l, ws, bytes, (const int32_t *)seq, (const int32_t *)seq);
    {
        char m[300];
        last_message(m, sizeof m);
        appendf(r->rec->note, sizeof r->rec->note, "%s: %s (%d) %s; ", a == 4 ? "prepare_async(DEVICE)" : "prepare",
                fmha_status_string(st), (int)st, m);
    }
    if (a == 4) {
        st = fmha_stream_synchronize(NULL);
        appendf(r->rec->note, sizeof r->rec->note, "synchronize: %d; ", (int)st);
    }
out:
    fmha_bwd_launcher_destroy(l);
}

/* An empty forward (seqlen_q = seqlen_k = 0, every tensor NULL: nothing to compute) with a huge
 * count: arg 0 nhead_q = INT32_MAX (nhead_k = 1, batch 2), arg 1 batch = INT32_MAX. Valid by the
 * header (no extent, no bound on the counts); it must return (OK, or an error) within the timeout. */
static void c_empty_huge(run_ctx *r) {
    fmha_fwd_traits *t = (fmha_fwd_traits *)gp_alloc(sizeof *t, 8, "fwd_traits");
    fmha_fwd_args *a = (fmha_fwd_args *)gp_alloc(sizeof *a, 8, "fwd_args");
    fmha_status st;
    memset(t, 0, sizeof *t);
    memset(a, 0, sizeof *a);
    t->struct_size = sizeof *t;
    t->dtype = FMHA_DTYPE_BF16;
    t->hdim_q = t->hdim_v = 32;
    t->mask_type = FMHA_MASK_BOTTOM_RIGHT;
    a->struct_size = sizeof *a;
    a->batch = r->c->arg == 0 ? 2 : INT32_MAX;
    a->nhead_q = r->c->arg == 0 ? INT32_MAX : 1;
    a->nhead_k = 1;
    a->window_size_left = -1;
    a->window_size_right = 0;
    r->rec->forbidden = -1;
    st = fmha_fwd(t, a, NULL);
    judged(r, "fmha_fwd (empty, huge count)", st);
    if (st == FMHA_OK) step(r, ST_CUSTOM + 1, "fmha_stream_synchronize", fmha_stream_synchronize(NULL));
}

/* fmha_bwd_workspace_size_upper_bound with a bad argument (arg) */
static void c_upper_bound(run_ctx *r) {
    size_t bytes = 0;
    fmha_bwd_traits *t;
    new_problem(r, 1, r->c->base == B_BWD_GROUP, 0);
    t = r->s.bt;
    switch (r->c->arg) {
    case 0: judged(r, "upper_bound(NULL traits)", fmha_bwd_workspace_size_upper_bound(NULL, &bytes)); return;
    case 1: judged(r, "upper_bound(NULL bytes)", fmha_bwd_workspace_size_upper_bound(t, NULL)); return;
    case 2: t->struct_size = 0; break;
    case 3: t->dtype = 7; break;
    case 4: t->hdim_q = 0; break;
    case 5: t->nhead_k = 3; break;
    case 6: t->is_group_mode = 2; break;
    case 7: t->batch = -1; break;
    case 8: t->struct_size = sizeof *t + 8; break;
    case 10: t->is_deterministic = 2; break;
    case 11: t->has_dbias = -1; break;
    case 9: /* valid: must be at least the launcher's size */ {
        fmha_bwd_launcher *l = NULL;
        size_t need = 0;
        judged(r, "fmha_bwd_workspace_size_upper_bound", fmha_bwd_workspace_size_upper_bound(t, &bytes));
        if (precondition(r, "create", fmha_bwd_launcher_create(t, &l)) &&
            precondition(r, "workspace_size", fmha_bwd_launcher_workspace_size(l, &need))) {
            r->rec->correct = bytes >= need;
            if (bytes < need) appendf(r->rec->note, sizeof r->rec->note, "upper bound %zu < launcher size %zu; ", bytes, need);
        }
        if (l) fmha_bwd_launcher_destroy(l);
        return;
    }
    default: break;
    }
    judged(r, "fmha_bwd_workspace_size_upper_bound", fmha_bwd_workspace_size_upper_bound(t, &bytes));
}

/* Runtime helpers (arg). */
enum {
    RT_MEMCPY_KIND_0, RT_MEMCPY_KIND_4, RT_MEMCPY_KIND_NEG, RT_MEMCPY_ASYNC_KIND, RT_MEMSET_256, RT_MEMSET_NEG,
    RT_MEMSET_ASYNC_BIG, RT_STREAM_DESTROY_GARBAGE, RT_STREAM_SYNC_GARBAGE, RT_STREAM_DESTROY_TWICE, RT_STREAM_DESTROY_DEFAULT,
    RT_DEVICE_FREE_GARBAGE, RT_DEVICE_FREE_TWICE, RT_PINNED_FREE_TWICE, RT_CU_COUNT_0, RT_CU_COUNT_BIG, RT_CU_COUNT_OUT_NULL,
    RT_REGISTRY_NULL_REQUIRED, RT_REGISTRY_SMALL, RT_STATUS_STRING, RT_LAST_ERROR_NULL, RT_MEMCPY_WRAP_SRC, RT_MEMSET_WRAP_DST,
    RT_MEMCPY_ASYNC_DESTROYED, RT_MALLOC_NULL_OUT, RT_MALLOC_HUGE, RT_STREAM_CREATE_NULL, RT_MEMCPY_NULL_DST, RT_MEMCPY_WRAP_DST,
    RT_MEMCPY_ASYNC_WRAP, RT_MEMSET_ASYNC_WRAP, RT_LOAD_KERNELS, RT_LAST_ERROR_CLEARED,
};

static void c_runtime(run_ctx *r) {
    unsigned char *a = (unsigned char *)gp_alloc(64, 16, "buffer a"), *b = (unsigned char *)gp_alloc(64, 16, "buffer b");
    fmha_stream_t s = NULL;
    void *p = NULL;
    int32_t count = 0;
    switch (r->c->arg) {
    case RT_MEMCPY_KIND_0: judged(r, "fmha_memcpy(kind 0)", fmha_memcpy(a, b, 64, 0)); break;
    case RT_MEMCPY_KIND_4: judged(r, "fmha_memcpy(kind 4)", fmha_memcpy(a, b, 64, 4)); break;
    case RT_MEMCPY_KIND_NEG: judged(r, "fmha_memcpy(kind -1)", fmha_memcpy(a, b, 64, -1)); break;
    case RT_MEMCPY_ASYNC_KIND: judged(r, "fmha_memcpy_async(kind INT32_MIN)", fmha_memcpy_async(a, b, 64, INT32_MIN, NULL)); break;
    case RT_MEMSET_256: judged(r, "fmha_memset(value 256)", fmha_memset(a, 256, 64)); break;
    case RT_MEMSET_NEG: judged(r, "fmha_memset(value -1)", fmha_memset(a, -1, 64)); break;
    case RT_MEMSET_ASYNC_BIG: judged(r, "fmha_memset_async(value INT32_MAX)", fmha_memset_async(a, INT32_MAX, 64, NULL)); break;
    case RT_STREAM_DESTROY_GARBAGE:
        judged(r, "fmha_stream_destroy(0x1234)", fmha_stream_destroy((fmha_stream_t)(uintptr_t)0x1234));
        break;
    case RT_STREAM_SYNC_GARBAGE:
        judged(r, "fmha_stream_synchronize(0x1234)", fmha_stream_synchronize((fmha_stream_t)(uintptr_t)0x1234));
        break;
    case RT_STREAM_DESTROY_TWICE:
        if (!precondition(r, "stream_create", fmha_stream_create(&s))) break;
        if (!precondition(r, "stream_destroy", fmha_stream_destroy(s))) break;
        judged(r, "fmha_stream_destroy (again)", fmha_stream_destroy(s));
        break;
    case RT_STREAM_DESTROY_DEFAULT: judged(r, "fmha_stream_destroy(NULL)", fmha_stream_destroy(NULL)); break;
    case RT_DEVICE_FREE_GARBAGE: judged(r, "fmha_device_free(not from fmha)", fmha_device_free(a)); break;
    case RT_DEVICE_FREE_TWICE:
        if (!precondition(r, "device_malloc", fmha_device_malloc(&p, 64))) break;
        if (!precondition(r, "device_free", fmha_device_free(p))) break;
        judged(r, "fmha_device_free (again)", fmha_device_free(p));
        break;
    case RT_PINNED_FREE_TWICE:
        if (!precondition(r, "host_malloc_pinned", fmha_host_malloc_pinned(&p, 64))) break;
        if (!precondition(r, "host_free_pinned", fmha_host_free_pinned(p))) break;
        judged(r, "fmha_host_free_pinned (again)", fmha_host_free_pinned(p));
        break;
    case RT_CU_COUNT_0: judged(r, "fmha_host_set_cu_count(0)", fmha_host_set_cu_count(0)); break;
    case RT_CU_COUNT_BIG: judged(r, "fmha_host_set_cu_count(INT32_MAX)", fmha_host_set_cu_count(INT32_MAX)); break;
    case RT_CU_COUNT_OUT_NULL: judged(r, "fmha_device_cu_count(NULL)", fmha_device_cu_count(NULL)); break;
    case RT_REGISTRY_NULL_REQUIRED: judged(r, "fmha_registry_json(buf, 64, NULL)", fmha_registry_json((char *)a, 64, NULL)); break;
    case RT_REGISTRY_SMALL: {
        /* valid: a 7-byte buffer flush against a guard page gets 6 bytes and a NUL */
        char *small = (char *)gp_alloc(7, 1, "registry buffer");
        size_t required = 0;
        judged(r, "fmha_registry_json(7-byte buffer)", fmha_registry_json(small, 7, &required));
        r->rec->correct = r->rec->status == FMHA_OK && small[6] == 0 && strlen(small) == 6 && required > 6;
        if (!r->rec->correct) appendf(r->rec->note, sizeof r->rec->note, "buffer \"%.7s\", required %zu; ", small, required);
        break;
    }
    case RT_STATUS_STRING: {
        const char *text = fmha_status_string(12345);
        judged(r, "fmha_status_string(12345)", FMHA_OK);
        r->rec->correct = text != NULL && strcmp(text, "unknown status") == 0;
        break;
    }
    case RT_LAST_ERROR_NULL: {
        size_t len;
        fmha_memset(a, 300, 64);
        len = fmha_last_error_message(NULL, 5);
        judged(r, "fmha_last_error_message(NULL, 5)", FMHA_OK);
        r->rec->correct = len > 0;
        break;
    }
    case RT_MEMCPY_WRAP_SRC:
        judged(r, "fmha_memcpy(src = UINTPTR_MAX - 15, 64 bytes)",
               fmha_memcpy(a, (void *)(UINTPTR_MAX - 15), 64, FMHA_MEMCPY_DEVICE_TO_DEVICE));
        break;
    case RT_MEMSET_WRAP_DST:
        judged(r, "fmha_memset(dst = UINTPTR_MAX - 15, 64 bytes)", fmha_memset((void *)(UINTPTR_MAX - 15), 0, 64));
        break;
    case RT_MEMCPY_ASYNC_DESTROYED:
        if (!precondition(r, "stream_create", fmha_stream_create(&s))) break;
        if (!precondition(r, "stream_destroy", fmha_stream_destroy(s))) break;
        judged(r, "fmha_memcpy_async(destroyed stream)", fmha_memcpy_async(a, b, 64, FMHA_MEMCPY_DEVICE_TO_DEVICE, s));
        break;
    case RT_MALLOC_NULL_OUT: judged(r, "fmha_device_malloc(NULL, 64)", fmha_device_malloc(NULL, 64)); break;
    case RT_MALLOC_HUGE:
        judged(r, "fmha_device_malloc(&p, SIZE_MAX / 2)", fmha_device_malloc(&p, SIZE_MAX / 2));
        if (p != NULL) appendf(r->rec->note, sizeof r->rec->note, "p = %p after the failure; ", p);
        break;
    case RT_STREAM_CREATE_NULL: judged(r, "fmha_stream_create(NULL)", fmha_stream_create(NULL)); break;
    case RT_MEMCPY_NULL_DST: judged(r, "fmha_memcpy(NULL, src, 64)", fmha_memcpy(NULL, b, 64, FMHA_MEMCPY_HOST_TO_DEVICE)); break;
    case RT_MEMCPY_WRAP_DST:
        judged(r, "fmha_memcpy(dst = UINTPTR_MAX - 15, 64 bytes)",
               fmha_memcpy((void *)(UINTPTR_MAX - 15), a, 64, FMHA_MEMCPY_HOST_TO_DEVICE));
        break;
    case RT_MEMCPY_ASYNC_WRAP:
        judged(r, "fmha_memcpy_async(src = UINTPTR_MAX - 31, 64 bytes)",
               fmha_memcpy_async(a, (void *)(UINTPTR_MAX - 31), 64, FMHA_MEMCPY_DEVICE_TO_HOST, NULL));
        step(r, ST_CUSTOM + 1, "fmha_stream_synchronize", fmha_stream_synchronize(NULL));
        break;
    case RT_MEMSET_ASYNC_WRAP:
        judged(r, "fmha_memset_async(dst = UINTPTR_MAX - 15, 64 bytes)", fmha_memset_async((void *)(UINTPTR_MAX - 15), 0, 64, NULL));
        step(r, ST_CUSTOM + 1, "fmha_stream_synchronize", fmha_stream_synchronize(NULL));
        break;
    case RT_LOAD_KERNELS: {
        /* valid: the host backend has nothing to load; a forward works afterwards */
        judged(r, "fmha_load_kernels()", fmha_load_kernels());
        new_problem(r, 0, 0, 0);
        if (step(r, ST_CUSTOM + 1, "forward after fmha_load_kernels", setup_run_forward(&r->s)))
            r->rec->correct = setup_check(&r->s, 0, r->rec->note, sizeof r->rec->note);
        break;
    }
    case RT_LAST_ERROR_CLEARED: {
        /* valid: a successful call clears the message ("empty after a successful call") */
        size_t before, after;
        fmha_memset(a, 300, 64);
        before = fmha_last_error_message(NULL, 0);
        judged(r, "fmha_device_cu_count(&count) after a failure", fmha_device_cu_count(&count));
        after = fmha_last_error_message(NULL, 0);
        r->rec->correct = before > 0 && after == 0;
        if (!r->rec->correct) appendf(r->rec->note, sizeof r->rec->note, "message length %zu after the failure, %zu after the success; ", before, after);
        break;
    }
    default: break;
    }
    (void)count;
}

/* A workspace describes itself: any launcher with the same traits may run with it, on any stream; one
 * launcher may prepare any number of them. arg 0: batch mode, 1: varlen deterministic. Launcher 1
 * prepares w0 and is destroyed; launcher 2 prepares w1 (async DEVICE, stream B) and w2 (async HOST,
 * default stream); then launcher 2 runs with w0 on stream A, w1 on the default stream, w2 on stream B
 * and w0 again on the default stream: every run correct. */
static void c_shared_workspace(run_ctx *r) {
    setup *s = &r->s;
    fmha_bwd_launcher *l1 = NULL, *l2 = NULL;
    fmha_stream_t sa = NULL, sb = NULL;
    void *w[3];
    size_t need = 0;
    int group = r->c->arg, i;
    const int32_t *hq, *hk;
    static const char *const wname[3] = {"w0 (launcher 1, sync, destroyed)", "w1 (launcher 2, async DEVICE)", "w2 (launcher 2, async HOST)"};
    new_problem(r, 1, group, group);
    hq = group ? s->ssq : NULL;
    hk = group ? s->ssk : NULL;
    if (!precondition(r, "forward", setup_run_forward(s))) return;
    if (!precondition(r, "create launcher 1", fmha_bwd_launcher_create(s->bt, &l1)) ||
        !precondition(r, "create launcher 2", fmha_bwd_launcher_create(s->bt, &l2)) ||
        !precondition(r, "workspace_size", fmha_bwd_launcher_workspace_size(l1, &need)) ||
        !precondition(r, "stream_create", fmha_stream_create(&sa)) || !precondition(r, "stream_create", fmha_stream_create(&sb)))
        goto out;
    for (i = 0; i < 3; ++i) w[i] = gp_alloc(need, 16, wname[i]);
    if (!precondition(r, "prepare w0 with launcher 1", fmha_bwd_launcher_prepare_workspace(l1, w[0], need, hq, hk)) ||
        !precondition(r, "destroy launcher 1", fmha_bwd_launcher_destroy(l1)))
        goto out;
    l1 = NULL;
    if (!precondition(r, "prepare_async w1 (DEVICE, stream B)",
                      fmha_bwd_launcher_prepare_workspace_async(l2, w[1], need, hq, hk, sb, NULL, FMHA_PREPARE_DEVICE)) ||
        !precondition(r, "prepare_async w2 (HOST, default stream)",
                      fmha_bwd_launcher_prepare_workspace_async(l2, w[2], need, hq, hk, NULL, NULL, FMHA_PREPARE_HOST)) ||
        !precondition(r, "synchronize stream B", fmha_stream_synchronize(sb)) ||
        !precondition(r, "synchronize the default stream", fmha_stream_synchronize(NULL)))
        goto out;
    {
        static const int which[4] = {0, 1, 2, 0};
        fmha_stream_t on[4];
        on[0] = sa, on[1] = NULL, on[2] = sb, on[3] = NULL;
        for (i = 0; i < 4; ++i) {
            fmha_status st;
            int ok;
            char what[120];
            setup_poison(s, 1);
            s->ba->workspace = w[which[i]];
            s->ba->workspace_size = need;
            st = fmha_bwd_launcher_run(l2, s->ba, on[i]);
            snprintf(what, sizeof what, "run %d: launcher 2 with %s", i, wname[which[i]]);
            if (i == 0) judged(r, what, st);
            if (!step(r, ST_CUSTOM + 1, what, st) || !step(r, ST_CUSTOM + 1, "fmha_stream_synchronize", fmha_stream_synchronize(on[i]))) {
                r->rec->correct = 0;
                break;
            }
            ok = setup_check(s, 1, r->rec->note, sizeof r->rec->note);
            if (ok == 0) {
                appendf(r->rec->note, sizeof r->rec->note, "(%s); ", what);
                r->rec->correct = 0;
                break;
            }
            r->rec->correct = ok;
        }
    }
out:
    if (l1) fmha_bwd_launcher_destroy(l1);
    if (l2) fmha_bwd_launcher_destroy(l2);
    if (sa) fmha_stream_destroy(sa);
    if (sb) fmha_stream_destroy(sb);
}

/* Invalid device seqstarts given to prepare_workspace_async: the call returns FMHA_OK; the next
 * synchronize of its stream (or fmha_device_synchronize) reports the cause naming the field — on the
 * host backend FMHA_ERR_INVALID_ARGUMENT for the device kernel (DEVICE, AUTO), FMHA_ERR_ASYNC_FAILURE
 * for the host method; then a run with that workspace (and valid seqstarts again) returns FMHA_OK and
 * computes nothing: its synchronize reports FMHA_ERR_WORKSPACE_NOT_PREPARED, dq/dk/dv unwritten.
 * arg = method (FMHA_PREPARE_*); value = corruption + 10 * (wait with fmha_device_synchronize). */
enum { DS_SSQ_DECREASING, DS_SSK_PAST_TOTAL, DS_SSQ_START_1, DS_SSK_LONG, DS_SSQ_NEG };

static void c_dev_seq_prepare(run_ctx *r) {
    setup *s = &r->s;
    fmha_bwd_launcher *l = NULL;
    fmha_stream_t stream = NULL;
    int method = r->c->arg, corruption = (int)(r->c->value % 10), device_sync = r->c->value >= 10;
    int32_t save_q[4], save_k[4];
    fmha_status st;
    char m[400];
    new_problem(r, 1, 1, r->c->base == B_BWD_GROUP_DET);
    if (!precondition(r, "forward", setup_run_forward(s))) return;
    setup_poison(s, 1);
    if (!precondition(r, "create", fmha_bwd_launcher_create(s->bt, &l)) ||
        !precondition(r, "workspace_size", fmha_bwd_launcher_workspace_size(l, &r->ws_size)) ||
        !precondition(r, "stream_create", fmha_stream_create(&stream)))
        goto out;
    r->ws = gp_alloc(r->ws_size, 16, "workspace");
    s->ba->workspace = r->ws;
    s->ba->workspace_size = r->ws_size;
    memcpy(save_q, s->ssq, sizeof save_q);
    memcpy(save_k, s->ssk, sizeof save_k);
    switch (corruption) {
    case DS_SSQ_DECREASING: s->ssq[2] = s->ssq[1] - 1; break;                  /* 0 5 4 17 */
    case DS_SSK_PAST_TOTAL: s->ssk[s->batch] = s->sk + 5; break;               /* 0 8 20 35 > 30 */
    case DS_SSQ_START_1: s->ssq[0] = 1; break;                                 /* 1 5 5 17 */
    case DS_SSK_LONG: s->ssk[2] = s->ssk[1] + s->max_sk + 1; s->ssk[3] = s->sk; break; /* a batch of 13 > max 12 */
    default: s->ssq[1] = -3; break;                                            /* 0 -3 5 17 */
    }
    st = fmha_bwd_launcher_prepare_workspace_async(l, r->ws, r->ws_size, s->ssq, s->ssk, stream, NULL, method);
    if (!precondition(r, "prepare_workspace_async (device arrays are checked on the stream: must return FMHA_OK)", st)) goto out;
    if (device_sync) judged(r, "fmha_device_synchronize after the prepare", fmha_device_synchronize());
    else judged(r, "fmha_stream_synchronize after the prepare", fmha_stream_synchronize(stream));
    /* valid seqstarts again: the run fails only because the workspace is unprepared */
    memcpy(s->ssq, save_q, sizeof save_q);
    memcpy(s->ssk, save_k, sizeof save_k);
    st = fmha_bwd_launcher_run(l, s->ba, stream);
    if (st != FMHA_OK) {
        last_message(m, sizeof m);
        appendf(r->rec->note, sizeof r->rec->note, "the following run returned %d (%s): %s (expected FMHA_OK); ", (int)st,
                fmha_status_string(st), m);
        r->rec->correct = 0;
        goto out;
    }
    st = fmha_stream_synchronize(stream);
    last_message(m, sizeof m);
    if (st != FMHA_ERR_WORKSPACE_NOT_PREPARED) {
        appendf(r->rec->note, sizeof r->rec->note,
                "the following run's synchronize returned %d (%s): %s (expected FMHA_ERR_WORKSPACE_NOT_PREPARED); ", (int)st,
                fmha_status_string(st), m);
        r->rec->correct = 0;
    } else {
        appendf(r->rec->note, sizeof r->rec->note, "the following run: %s; ", m);
    }
    check_unwritten(r);
out:
    if (l) fmha_bwd_launcher_destroy(l);
    if (stream) fmha_stream_destroy(stream);
}

/* Destroy racing use: 3 threads call workspace_size and prepare_workspace (each with its own
 * workspace) on one launcher, without any coordination, while the main thread destroys it. Every
 * call returns FMHA_OK (it finished before the destroy) or FMHA_ERR_INVALID_ARGUMENT (the handle is
 * gone); once refused, never OK again; no crash. */
typedef struct {
    fmha_bwd_launcher *l;
    atomic_int go;
    size_t ws_size;
    void *ws[3];
    int calls[3], ok[3], refused[3], other[3], ok_after_refusal[3], other_status[3];
} lrace_state;

typedef struct {
    lrace_state *st;
    int id;
} lrace_arg;

static void *lrace_thread(void *arg) {
    lrace_arg *a = (lrace_arg *)arg;
    lrace_state *st = a->st;
    int i, refused = 0;
    while (!atomic_load(&st->go)) {
    }
    for (i = 0; i < 100000 && refused < 3; ++i) {
        size_t bytes = 0;
        fmha_status s = (i & 1) ? fmha_bwd_launcher_workspace_size(st->l, &bytes)
                                : fmha_bwd_launcher_prepare_workspace(st->l, st->ws[a->id], st->ws_size, NULL, NULL);
        st->calls[a->id]++;
        if (s == FMHA_OK) {
            st->ok[a->id]++;
            if (refused) st->ok_after_refusal[a->id]++;
        } else if (s == FMHA_ERR_INVALID_ARGUMENT) {
            st->refused[a->id]++;
            refused++;
        } else {
            st->other[a->id]++;
            st->other_status[a->id] = (int)s;
        }
    }
    return NULL;
}

static void c_launcher_race(run_ctx *r) {
    static lrace_state st;
    int round, rounds = fuzz_light ? 4 : 15, i;
    long ok_total = 0, refused_total = 0;
    new_problem(r, 1, 0, 0);
    for (round = 0; round < rounds; ++round) {
        pthread_t threads[3];
        lrace_arg args[3];
        memset(&st, 0, sizeof st);
        if (!precondition(r, "create", fmha_bwd_launcher_create(r->s.bt, &st.l)) ||
            !precondition(r, "workspace_size", fmha_bwd_launcher_workspace_size(st.l, &st.ws_size)))
            return;
        for (i = 0; i < 3; ++i) {
            st.ws[i] = gp_alloc(st.ws_size, 16, "workspace (race)");
            args[i].st = &st;
            args[i].id = i;
            pthread_create(&threads[i], NULL, lrace_thread, &args[i]);
        }
        atomic_store(&st.go, 1);
        usleep(200 + 150 * (unsigned)(round % 5));
        if (round == 0) judged(r, "fmha_bwd_launcher_destroy (racing calls)", fmha_bwd_launcher_destroy(st.l));
        else step(r, ST_CUSTOM + 1, "fmha_bwd_launcher_destroy (racing calls)", fmha_bwd_launcher_destroy(st.l));
        for (i = 0; i < 3; ++i) pthread_join(threads[i], NULL);
        for (i = 0; i < 3; ++i) {
            gp_free(st.ws[i]);
            ok_total += st.ok[i];
            refused_total += st.refused[i];
            if (st.other[i] || st.ok_after_refusal[i]) {
                appendf(r->rec->note, sizeof r->rec->note,
                        "round %d, thread %d: %d calls, %d OK, %d refused, %d other statuses (last %d), %d OK after a refusal; ", round, i,
                        st.calls[i], st.ok[i], st.refused[i], st.other[i], st.other_status[i], st.ok_after_refusal[i]);
                r->rec->correct = 0;
            }
        }
        if (r->rec->correct == 0) return;
    }
    appendf(r->rec->note, sizeof r->rec->note, "%ld calls OK, %ld refused after destroy (over %d rounds); ", ok_total, refused_total, rounds);
}

static void c_kvcache(run_ctx *r) {
    kv_case_run(r->c->arg, r->rng, r->rec);
}

/* ---- building the table -------------------------------------------------------------------------- */

static tcase *custom(int expect, int base, hook_fn fn, int arg, const char *fields, uint32_t statuses, const char *desc) {
    tcase *c = add(expect, base, ST_CUSTOM, fields, "%s", desc);
    c->hook = fn;
    c->arg = arg;
    c->statuses = statuses;
    return c;
}

static tcase *hooked(int expect, int base, int stage, hook_fn fn, int arg, int64_t value, const char *fields,
                     const char *desc) {
    tcase *c = add(expect, base, stage, fields, "%s", desc);
    c->hook = fn;
    c->arg = arg;
    c->value = value;
    return c;
}

static tcase *valid_layout(int base, int arg, const char *desc) {
    tcase *c = add(EXPECT_OK, base, (base >= B_BWD) ? ST_RUN : ST_FWD, "", "valid: %s", desc);
    c->layout = l_layout;
    c->arg = arg;
    return c;
}

static void require_invalid_argument_for_tensor_rules(void);

static void build(void) {
    static const int64_t struct_sizes_delta[] = {-8, -1, 8};
    static const char *const stride_names[3] = {"batch_stride", "head_stride", "row_stride"};
    const int64_t big = (int64_t)1 << 62;
    char fields[80], desc[160];
    size_t i;
    int t, k;
    if (table_size >= 0) return;
    table_size = 0;

    /* ---- forward traits ---- */
    MUT(B_FWD, TG_FT, fmha_fwd_traits, struct_size, 0, "struct_size|traits")->statuses = INV;
    for (i = 0; i < 3; ++i)
        MUT(B_FWD, TG_FT, fmha_fwd_traits, struct_size, (int64_t)sizeof(fmha_fwd_traits) + struct_sizes_delta[i],
            "struct_size|traits")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, struct_size, 4096, "struct_size|traits")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, dtype, 2, "dtype")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, dtype, -1, "dtype")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, dtype, INT32_MIN, "dtype")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, dtype, INT32_MAX, "dtype")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_q, 0, "hdim_q");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_q, -1, "hdim_q");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_q, 257, "hdim_q");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_q, INT32_MIN, "hdim_q");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_q, INT32_MAX, "hdim_q");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_v, 0, "hdim_v");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_v, -7, "hdim_v");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, hdim_v, 257, "hdim_v");
    MUT(B_FWD, TG_FT, fmha_fwd_traits, is_group_mode, 2, "is_group_mode")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, is_group_mode, -1, "is_group_mode")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, is_group_mode, INT32_MIN, "is_group_mode")->statuses = INV;
    /* 3 is the library's internal generic-window mask (not in the header): it answers UNSUPPORTED, where
     * docs/abi.md asks INVALID_ARGUMENT for unknown values; both are accepted (reported) */
    MUT(B_FWD, TG_FT, fmha_fwd_traits, mask_type, 3, "mask_type")->statuses = INV | UNSUP;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, mask_type, 4, "mask_type")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, mask_type, -1, "mask_type")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, mask_type, INT32_MAX, "mask_type")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, bias_type, 1, "bias_type")->statuses = STATUS_BIT(FMHA_ERR_UNSUPPORTED);
    MUT(B_FWD, TG_FT, fmha_fwd_traits, bias_type, 2, "bias_type")->statuses = STATUS_BIT(FMHA_ERR_UNSUPPORTED);
    MUT(B_FWD, TG_FT, fmha_fwd_traits, bias_type, 3, "bias_type")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, bias_type, -1, "bias_type")->statuses = INV;
    /* flags are 0 or 1: 1 requests dropout (FMHA_ERR_UNSUPPORTED), anything else is invalid */
    MUT(B_FWD, TG_FT, fmha_fwd_traits, has_dropout, 1, "has_dropout")->statuses = UNSUP;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, has_dropout, 2, "has_dropout")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, has_dropout, -1, "has_dropout")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, has_dropout, INT32_MIN, "has_dropout")->statuses = INV;
    MUT(B_FWD, TG_FT, fmha_fwd_traits, has_dropout, INT32_MAX, "has_dropout")->statuses = INV;

    /* ---- forward args ---- */
    MUT(B_FWD, TG_FA, fmha_fwd_args, struct_size, 0, "struct_size|args")->statuses = INV;
    for (i = 0; i < 3; ++i)
        MUT(B_FWD, TG_FA, fmha_fwd_args, struct_size, (int64_t)sizeof(fmha_fwd_args) + struct_sizes_delta[i], "struct_size|args")
            ->statuses = INV;
    MUT(B_FWD, TG_FA, fmha_fwd_args, struct_size, 1 << 20, "struct_size|args")->statuses = INV;
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_fwd_null, 0, 0, "traits", "fmha_fwd(NULL traits)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_fwd_null, 1, 0, "args", "fmha_fwd(NULL args)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    /* tensors: null data, negative strides, extents >= 2^63 bytes, wrapping pointers */
    for (t = TQ; t <= TLSE; ++t) {
        size_t off = t == TQ ? offsetof(fmha_fwd_args, q) : t == TK ? offsetof(fmha_fwd_args, k)
                   : t == TV ? offsetof(fmha_fwd_args, v) : t == TO ? offsetof(fmha_fwd_args, o)
                             : offsetof(fmha_fwd_args, lse);
        const char *n = tensor_names[t];
        if (t != TLSE) {
            snprintf(fields, sizeof fields, "%s.data", n);
            snprintf(desc, sizeof desc, "%s.data", n);
            mut(B_FWD, TG_FA, off + offsetof(fmha_tensor, data), 8, 0, fields, desc);
        }
        for (k = 0; k < 3; ++k) {
            size_t so = off + (k == 0 ? offsetof(fmha_tensor, batch_stride) : k == 1 ? offsetof(fmha_tensor, head_stride)
                                                                                  : offsetof(fmha_tensor, row_stride));
            snprintf(fields, sizeof fields, "%s.%s", n, stride_names[k]);
            snprintf(desc, sizeof desc, "%s.%s", n, stride_names[k]);
            if (!(t == TLSE && k == 2)) {
                mut(B_FWD, TG_FA, so, 8, -1, fields, desc);
                snprintf(fields, sizeof fields, "%s.%s|%s", n, stride_names[k], n);
                mut(B_FWD, TG_FA, so, 8, t == TLSE ? big / 2 : big, fields, desc)->statuses = INV; /* >= 2^63 bytes */
            }
            if (t == TQ) {
                mut(B_FWD, TG_FA, so, 8, INT64_MIN, fields, desc);
                mut(B_FWD, TG_FA, so, 8, INT64_MAX, fields, desc)->statuses = INV;
            }
        }
        snprintf(fields, sizeof fields, "%s.data|%s", n, n);
        snprintf(desc, sizeof desc, "%s.data = UINTPTR_MAX - 4095 (the extent wraps the address space)", n);
        hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_wrap, t, 0, fields, desc);
    }
    MUT(B_FWD, TG_FA, fmha_fwd_args, q.row_stride, (int64_t)1 << 59, "q.row_stride|q")->statuses = INV; /* 15 * 2^59 * 2 bytes */
    /* data not aligned to the element size */
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_misalign, TQ, 1, "q.data|q", "q.data + 1 byte (bf16 elements: misaligned)");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_misalign, TV, 1, "v.data|v", "v.data + 1 byte (misaligned)");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_misalign, TO, 1, "o.data|o", "o.data + 1 byte (misaligned output)");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_misalign, TLSE, 2, "lse.data|lse", "lse.data + 2 bytes (fp32 elements: misaligned)");
    MUT(B_FWD, TG_FA, fmha_fwd_args, lse.row_stride, 0, "lse.row_stride");
    MUT(B_FWD, TG_FA, fmha_fwd_args, lse.row_stride, 2, "lse.row_stride");
    MUT(B_FWD, TG_FA, fmha_fwd_args, lse.row_stride, -1, "lse.row_stride");
    MUT(B_FWD, TG_FA, fmha_fwd_args, batch, 0, "batch");
    MUT(B_FWD, TG_FA, fmha_fwd_args, batch, -1, "batch");
    MUT(B_FWD, TG_FA, fmha_fwd_args, batch, INT32_MIN, "batch");
    MUT(B_FWD, TG_FA, fmha_fwd_args, seqlen_q, -1, "seqlen_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, seqlen_q, INT32_MIN, "seqlen_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, seqlen_k, -1, "seqlen_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, max_seqlen_q, 5, "max_seqlen_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, max_seqlen_q, -1, "max_seqlen_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, max_seqlen_k, 1, "max_seqlen_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_q, 0, "nhead_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_q, -1, "nhead_q");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_q, 3, "nhead_q|nhead_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_k, 0, "nhead_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_k, -1, "nhead_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, nhead_k, 3, "nhead_q|nhead_k");
    MUT(B_FWD, TG_FA, fmha_fwd_args, window_size_left, -2, "window_size_left");
    MUT(B_FWD, TG_FA, fmha_fwd_args, window_size_right, -2, "window_size_right");
    MUT(B_FWD, TG_FA, fmha_fwd_args, window_size_left, INT32_MIN, "window_size_left");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_scale, 0, 0, "scale", "scale = NaN");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_scale, 1, 0, "scale", "scale = +inf");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_garbage_stream, 0, 0, "stream", "stream = 0x1234 (not a stream)");
    hooked(EXPECT_ERROR, B_FWD, ST_FWD, h_garbage_stream, 1, 0, "stream", "a destroyed stream");
    /* outputs overlapping an input, each other or themselves (MHA: same shapes) */
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_overlap, TO * 100 + TQ, 0, "o", "o.data = q.data (output overwrites an input)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_overlap, TO * 100 + TV, 0, "o", "o.data = v.data");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, NULL, TO * 100 + TK, 64, "o", "o.data = k.data + 64 bytes (partial overlap)")->layout =
        l_overlap;
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_overlap, TLSE * 100 + TO, 0, "lse|o", "lse.data = o.data (two outputs overlap)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_overlap, TLSE * 100 + TQ, 0, "lse|q", "lse.data = q.data");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_self_overlap, TO, 2, "o.row_stride|o", "o.row_stride = 0 (rows overlap)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_self_overlap, TO, 1, "o.head_stride|o", "o.head_stride = 0 (heads overlap)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_self_overlap, TO, 0, "o.batch_stride|o", "o.batch_stride = 0 (batches overlap)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_self_overlap, TO, 10 + 16, "o.row_stride|o",
           "o.row_stride = 16 < hdim_v = 32 (rows half overlap)");
    hooked(EXPECT_ERROR, B_FWD_MHA, ST_FWD, h_self_overlap, TLSE, 1, "lse.head_stride|lse", "lse.head_stride = 0");
    /* group mode */
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, seqstart_q, 0, "seqstart_q")->statuses = 0;
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, seqstart_k, 0, "seqstart_k");
    {
        static const char *const what[] = {"device seqstart_q = {0,5,3,17} (decreasing)", "device seqstart_q[3] = 18 > seqlen_q = 17",
                                           "device seqstart_k[0] = -1", "device seqstart_q[1] = INT32_MIN",
                                           "device seqstart_k[3] = INT32_MAX", "device seqstart_k = {0,8,7,17} (decreasing)"};
        static const char *const f[] = {"seqstart_q", "seqstart_q", "seqstart_k", "seqstart_q", "seqstart_k", "seqstart_k"};
        for (k = 0; k < 6; ++k) hooked(EXPECT_ERROR, B_FWD_GROUP, ST_FWD, h_dev_seq, k, 0, f[k], what[k])->judge = J_CHAIN;
    }
    hooked(EXPECT_ERROR, B_FWD_GROUP, ST_FWD, h_logical, 0, 0, "seqlen_q_ptr", "seqlen_q_ptr[0] = 6 > physical length 5")->judge =
        J_CHAIN;
    hooked(EXPECT_ERROR, B_FWD_GROUP, ST_FWD, h_logical, 1, 0, "seqlen_q_ptr", "seqlen_q_ptr[2] = -1")->judge = J_CHAIN;
    hooked(EXPECT_ERROR, B_FWD_GROUP, ST_FWD, h_logical, 2, 0, "seqlen_q_ptr", "seqlen_q_ptr[1] = INT32_MAX")->judge = J_CHAIN;
    hooked(EXPECT_ERROR, B_FWD_GROUP, ST_FWD, h_logical, 3, 0, "seqlen_k_ptr", "seqlen_k_ptr[1] = 13 > physical length 12")->judge =
        J_CHAIN;
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, max_seqlen_q, 4, "max_seqlen_q")->judge = J_CHAIN;
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, max_seqlen_k, 9, "max_seqlen_k")->judge = J_CHAIN;
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, seqlen_q, 10, "seqlen_q|seqstart_q")->judge = J_CHAIN;
    MUT(B_FWD_GROUP, TG_FA, fmha_fwd_args, batch, 0, "batch");
    /* valid forward layouts */
    add(EXPECT_OK, B_FWD, ST_FWD, "", "valid: the default problem (every struct flush against a guard page)");
    add(EXPECT_OK, B_FWD_GROUP, ST_FWD, "", "valid: the default varlen problem");
    valid_layout(B_FWD_MHA, L_PACKED_QKV, "q, k, v views of one packed qkv buffer (row stride 3*H*D)");
    valid_layout(B_FWD, L_KV_ALIAS, "v.data == k.data (inputs alias)");
    valid_layout(B_FWD, L_Q_BROADCAST, "q.head_stride = 0 (q broadcast over heads)");
    valid_layout(B_FWD, L_KV_BATCH_BCAST, "k, v batch_stride = 0 (broadcast over batches)");
    valid_layout(B_FWD, L_O_PADDED, "o rows padded to twice their width");
    valid_layout(B_FWD, L_BHSD, "every tensor [b][h][s][d]");
    valid_layout(B_FWD, L_EMPTY_Q, "seqlen_q = 0 with q, o, lse data NULL");
    valid_layout(B_FWD, L_EMPTY_K, "seqlen_k = 0 with k, v data NULL");
    valid_layout(B_FWD_GROUP, L_PACKED_QKV, "varlen: q, k, v packed in one buffer")->base = B_FWD_GROUP;
    valid_layout(B_FWD_GROUP, L_MAX_Q_HUGE, "varlen: max_seqlen_q = INT32_MAX (a valid upper bound of the lengths)");
    valid_layout(B_FWD_GROUP, L_MAX_K_HUGE, "varlen: max_seqlen_k = INT32_MAX (a valid upper bound of the lengths)");
    /* group mode ignores batch_stride: any value is valid */
    hooked(EXPECT_OK, B_FWD_GROUP, ST_FWD, h_batch_stride, TQ, -1, "", "valid: varlen q.batch_stride = -1 (ignored)");
    hooked(EXPECT_OK, B_FWD_GROUP, ST_FWD, h_batch_stride, TK, INT64_MIN, "", "valid: varlen k.batch_stride = INT64_MIN (ignored)");
    hooked(EXPECT_OK, B_FWD_GROUP, ST_FWD, h_batch_stride, TO, INT64_MAX, "", "valid: varlen o.batch_stride = INT64_MAX (ignored)");
    hooked(EXPECT_OK, B_FWD_GROUP, ST_FWD, h_batch_stride, TLSE, (int64_t)1 << 62, "",
           "valid: varlen lse.batch_stride = 2^62 (ignored)");

    /* empty problems with huge counts: nothing to compute, must not take minutes */
    custom(EXPECT_ANY, B_NONE, c_empty_huge, 0, "", 0,
           "fwd: empty (seqlen 0/0, NULL tensors), nhead_q = INT32_MAX, nhead_k = 1: answers (OK or an error) promptly")
        ->flags = F_HEAVY;
    custom(EXPECT_ANY, B_NONE, c_empty_huge, 1, "", 0, "fwd: empty (seqlen 0/0, NULL tensors), batch = INT32_MAX: answers promptly")
        ->flags = F_HEAVY;

    /* ---- backward traits (create) ---- */
    /* struct_size: 0.1's (80: is_deterministic and padding) or this header's (88); 76 ends inside 0.1's */
    {
        static const int64_t bad[] = {0, 8, 76, 84, (int64_t)sizeof(fmha_bwd_traits) - 1, (int64_t)sizeof(fmha_bwd_traits) + 8};
        _Static_assert(offsetof(fmha_bwd_traits, dq_scheme) == 80 && sizeof(fmha_bwd_traits) == 88, "fmha_bwd_traits 0.1 is 80 bytes");
        for (i = 0; i < sizeof bad / sizeof bad[0]; ++i)
            MUT(B_BWD, TG_BT, fmha_bwd_traits, struct_size, bad[i], "struct_size|traits")->statuses = INV;
        for (i = 0; i < 2; ++i) {
            tcase *c = MUT(i ? B_BWD_GROUP_DET : B_BWD, TG_BT, fmha_bwd_traits, struct_size, 80, "");
            c->expect = EXPECT_OK;
            c->judge = J_CHAIN;
            snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), " (valid: a 0.1 caller's traits)");
        }
    }
    /* dq_scheme: AUTO, SPLIT_SLOTS, ORDERED (the host backend runs both), else invalid */
    MUT(B_BWD_DET, TG_BT, fmha_bwd_traits, dq_scheme, 3, "dq_scheme")->statuses = INV;
    MUT(B_BWD_GROUP_DET, TG_BT, fmha_bwd_traits, dq_scheme, -1, "dq_scheme")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, dq_scheme, INT32_MIN, "dq_scheme")->statuses = INV;
    for (i = 1; i <= 2; ++i) {
        int k;
        for (k = 0; k < 2; ++k) {
            tcase *c = MUT(k ? B_BWD_GROUP_DET : B_BWD_DET, TG_BT, fmha_bwd_traits, dq_scheme, i, "");
            c->expect = EXPECT_OK;
            c->judge = J_CHAIN;
        }
    }
    MUT(B_BWD, TG_BT, fmha_bwd_traits, dtype, 2, "dtype")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, dtype, -1, "dtype")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, hdim_q, 0, "hdim_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, hdim_q, 257, "hdim_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, hdim_q, -1, "hdim_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, hdim_v, 0, "hdim_v");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, hdim_v, 257, "hdim_v");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_group_mode, 2, "is_group_mode")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_group_mode, -1, "is_group_mode")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, mask_type, 3, "mask_type")->statuses = INV | UNSUP; /* (see the forward's) */
    MUT(B_BWD, TG_BT, fmha_bwd_traits, mask_type, 4, "mask_type")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, mask_type, -1, "mask_type")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, bias_type, 1, "bias_type")->statuses = STATUS_BIT(FMHA_ERR_UNSUPPORTED);
    MUT(B_BWD, TG_BT, fmha_bwd_traits, bias_type, 2, "bias_type")->statuses = STATUS_BIT(FMHA_ERR_UNSUPPORTED);
    MUT(B_BWD, TG_BT, fmha_bwd_traits, bias_type, 3, "bias_type")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, bias_type, -1, "bias_type")->statuses = INV;
    /* flags are 0 or 1: 1 requests an unsupported feature (FMHA_ERR_UNSUPPORTED), anything else is invalid */
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dbias, 1, "has_dbias")->statuses = UNSUP;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dbias, 2, "has_dbias")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dbias, -1, "has_dbias")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dropout, 1, "has_dropout")->statuses = UNSUP;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dropout, 2, "has_dropout")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, has_dropout, -1, "has_dropout")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_store_randval, 1, "is_store_randval")->statuses = UNSUP;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_store_randval, 2, "is_store_randval")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_store_randval, -1, "is_store_randval")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_store_randval, INT32_MIN, "is_store_randval")->statuses = INV;
    MUT(B_BWD_DET, TG_BT, fmha_bwd_traits, is_deterministic, 2, "is_deterministic")->statuses = INV;
    MUT(B_BWD_DET, TG_BT, fmha_bwd_traits, is_deterministic, -1, "is_deterministic")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, is_deterministic, INT32_MAX, "is_deterministic")->statuses = INV;
    MUT(B_BWD_GROUP_DET, TG_BT, fmha_bwd_traits, is_deterministic, INT32_MIN, "is_deterministic")->statuses = INV;
    MUT(B_BWD_GROUP, TG_BT, fmha_bwd_traits, is_group_mode, INT32_MIN, "is_group_mode")->statuses = INV;
    MUT(B_BWD, TG_BT, fmha_bwd_traits, batch, 0, "batch");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, batch, -1, "batch");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, seqlen_q, -1, "seqlen_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, seqlen_k, -1, "seqlen_k");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, max_seqlen_q, 5, "max_seqlen_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, max_seqlen_k, 1, "max_seqlen_k");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, nhead_q, 0, "nhead_q");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, nhead_q, 3, "nhead_q|nhead_k");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, nhead_k, 0, "nhead_k");
    MUT(B_BWD, TG_BT, fmha_bwd_traits, nhead_k, 3, "nhead_q|nhead_k");
    MUT(B_BWD_GROUP, TG_BT, fmha_bwd_traits, max_seqlen_k, -1, "max_seqlen_k");
    MUT(B_BWD_GROUP, TG_BT, fmha_bwd_traits, batch, -5, "batch");
    hooked(EXPECT_ERROR, B_BWD, ST_CREATE, h_create, 0, 0, "traits", "create(NULL traits)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    hooked(EXPECT_ERROR, B_BWD, ST_CREATE, h_create, 1, 0, "launcher", "create(traits, NULL)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    hooked(EXPECT_ERROR, B_BWD, ST_SIZE, h_size, 0, 0, "launcher", "workspace_size(NULL launcher)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    hooked(EXPECT_ERROR, B_BWD, ST_SIZE, h_size, 1, 0, "bytes", "workspace_size(launcher, NULL)")->statuses =
        STATUS_BIT(FMHA_ERR_NULL_POINTER);
    /* is_deterministic = 1: bitwise reproducible, also across launchers */
    custom(EXPECT_OK, B_BWD_DET, c_det_flag, 0, "", 0, "valid: two deterministic launchers give bitwise-equal dq/dk/dv");
    custom(EXPECT_OK, B_BWD_GROUP_DET, c_det_flag, 0, "", 0, "valid: varlen: two deterministic launchers give bitwise-equal dq/dk/dv");
    /* batch = INT32_MAX: group-mode deterministic is refused at create (its metadata region is bounded
     * to 1 GiB); the others must answer (an error or OK), never abort */
    custom(EXPECT_ERROR, B_NONE, c_big_batch, 0, "batch", INV,
           "bwd: group-mode deterministic batch = INT32_MAX: refused at create (metadata bounded to 1 GiB)");
    custom(EXPECT_ANY, B_NONE, c_big_batch, 1, "batch", 0, "bwd: workspace_size_upper_bound, group-mode deterministic batch = INT32_MAX");
    custom(EXPECT_ANY, B_NONE, c_big_batch, 2, "batch", 0, "bwd: batch-mode deterministic batch = INT32_MAX: create, prepare");
    /* (group-mode atomic with batch = INT32_MAX reads all 2^31 entries of the seqstarts: too slow here) */
    {
        static const char *const what[] = {"upper_bound(NULL traits)", "upper_bound(traits, NULL bytes)",
                                           "upper_bound: struct_size = 0", "upper_bound: dtype = 7", "upper_bound: hdim_q = 0",
                                           "upper_bound: nhead_k = 3 (nhead_q = 4)", "upper_bound: is_group_mode = 2",
                                           "upper_bound: batch = -1", "upper_bound: struct_size = sizeof + 8"};
        static const char *const f[] = {"traits", "bytes", "struct_size|traits", "dtype", "hdim_q", "nhead_q|nhead_k",
                                        "is_group_mode", "batch", "struct_size|traits"};
        static const uint32_t st[] = {NULLP, NULLP, INV, INV, 0, 0, INV, 0, INV};
        for (k = 0; k < 9; ++k) custom(EXPECT_ERROR, B_BWD, c_upper_bound, k, f[k], st[k], what[k]);
        custom(EXPECT_OK, B_BWD_GROUP, c_upper_bound, 9, "", 0, "valid: upper_bound >= the launcher's workspace_size");
        custom(EXPECT_ERROR, B_BWD, c_upper_bound, 10, "is_deterministic", INV, "upper_bound: is_deterministic = 2");
        custom(EXPECT_ERROR, B_BWD, c_upper_bound, 11, "has_dbias", INV, "upper_bound: has_dbias = -1");
    }

    /* ---- prepare (sync and async) ---- */
    {
        struct {
            int base, arg, prep;
            int64_t value;
            const char *fields, *desc;
        } p[] = {
            {B_BWD, P_WS_NULL, PREP_SYNC, 0, "workspace", "prepare: workspace = NULL"},
            {B_BWD, P_SIZE_MINUS_1, PREP_SYNC, 0, "workspace_size|workspace", "prepare: workspace_size = needed - 1"},
            {B_BWD, P_SIZE_0, PREP_SYNC, 0, "workspace_size|workspace", "prepare: workspace_size = 0"},
            {B_BWD, P_MISALIGN, PREP_SYNC, 1, "workspace", "prepare: workspace 1 byte past 16-byte alignment"},
            {B_BWD, P_MISALIGN, PREP_SYNC, 8, "workspace", "prepare: workspace 8 bytes past 16-byte alignment"},
            {B_BWD_GROUP_DET, P_MISALIGN, PREP_SYNC, 4, "workspace", "prepare: workspace 4 bytes past 16-byte alignment"},
            {B_BWD, P_LAUNCHER_NULL, PREP_SYNC, 0, "launcher", "prepare: launcher = NULL"},
            {B_BWD, P_GARBAGE_LAUNCHER, PREP_SYNC, 0, "launcher", "prepare: launcher = 0x1234"},
            {B_BWD, P_BATCH_SSQ, PREP_SYNC, 0, "seqstart_q", "batch-mode prepare with seqstart_q non-null"},
            {B_BWD, P_BATCH_SSK, PREP_SYNC, 0, "seqstart_k", "batch-mode prepare with only seqstart_k non-null"},
            {B_BWD_GROUP, P_SSQ_NULL, PREP_SYNC, 0, "seqstart_q", "group prepare: seqstart_q = NULL"},
            {B_BWD_GROUP, P_SSK_NULL, PREP_SYNC, 0, "seqstart_k", "group prepare: seqstart_k = NULL"},
            {B_BWD_GROUP, P_SSQ_DECREASING, PREP_SYNC, 0, "seqstart_q", "group prepare: host seqstart_q decreasing"},
            {B_BWD_GROUP_DET, P_SSQ_DECREASING, PREP_SYNC, 0, "seqstart_q", "group prepare: host seqstart_q decreasing"},
            {B_BWD_GROUP, P_SSQ_START_1, PREP_SYNC, 0, "seqstart_q", "group prepare: host seqstart_q[0] = 1"},
            {B_BWD_GROUP, P_SSQ_NEG, PREP_SYNC, 0, "seqstart_q", "group prepare: host seqstart_q[1] = -3"},
            {B_BWD_GROUP, P_SSQ_PAST_TOTAL, PREP_SYNC, 0, "seqstart_q", "group prepare: host seqstart_q[batch] = seqlen_q + 1"},
            {B_BWD_GROUP_DET, P_SSK_PAST_TOTAL, PREP_SYNC, 0, "seqstart_k", "group prepare: host seqstart_k[batch] = seqlen_k + 5"},
            {B_BWD_GROUP, P_SSK_DECREASING, PREP_SYNC, 0, "seqstart_k", "group prepare: host seqstart_k decreasing"},
            {B_BWD_GROUP_DET, P_SSK_LONG, PREP_SYNC, 0, "seqstart_k|max_seqlen_k",
             "group prepare: a batch of 13 keys > max_seqlen_k = 12"},
            /* async */
            {B_BWD, P_METHOD, PREP_AUTO, 3, "method", "prepare_async: method = 3"},
            {B_BWD, P_METHOD, PREP_AUTO, -1, "method", "prepare_async: method = -1"},
            {B_BWD, P_METHOD, PREP_AUTO, INT32_MAX, "method", "prepare_async: method = INT32_MAX"},
            {B_BWD_GROUP, P_METHOD, PREP_AUTO, INT32_MIN, "method", "prepare_async: method = INT32_MIN"},
            {B_BWD, P_MISALIGN, PREP_AUTO, 8, "workspace", "prepare_async AUTO: workspace 8 bytes past 16-byte alignment"},
            {B_BWD, P_MISALIGN, PREP_HOST, 8, "workspace", "prepare_async HOST: workspace 8 bytes past 16-byte alignment"},
            {B_BWD, P_MISALIGN, PREP_DEVICE, 8, "workspace", "prepare_async DEVICE: workspace 8 bytes past 16-byte alignment"},
            {B_BWD_GROUP, P_MISALIGN, PREP_HOST, 4, "workspace", "prepare_async HOST: workspace 4 bytes past 16-byte alignment"},
            {B_BWD_GROUP, P_MISALIGN, PREP_DEVICE, 2, "workspace", "prepare_async DEVICE: workspace 2 bytes past 16-byte alignment"},
            {B_BWD, P_WS_NULL, PREP_HOST, 0, "workspace", "prepare_async: workspace = NULL"},
            {B_BWD, P_SIZE_MINUS_1, PREP_DEVICE, 0, "workspace_size|workspace", "prepare_async: workspace_size = needed - 1"},
            {B_BWD, P_LAUNCHER_NULL, PREP_HOST, 0, "launcher", "prepare_async: launcher = NULL"},
            {B_BWD, P_BATCH_SSK, PREP_HOST, 0, "seqstart_k", "batch-mode prepare_async with only seqstart_k non-null"},
            {B_BWD_GROUP, P_SSQ_NULL, PREP_HOST, 0, "seqstart_q", "group prepare_async: seqstart_q = NULL"},
            {B_BWD_GROUP, P_SSK_NULL, PREP_DEVICE, 0, "seqstart_k", "group prepare_async: seqstart_k = NULL"},
            {B_BWD_GROUP, P_ALLOC_SIZE_0, PREP_HOST, 0, "allocator|struct_size", "prepare_async: allocator struct_size = 0"},
            {B_BWD_GROUP, P_ALLOC_SIZE_BIG, PREP_HOST, 0, "allocator|struct_size", "prepare_async: allocator struct_size = sizeof + 8"},
            {B_BWD_GROUP, P_ALLOC_NO_ALLOCATE, PREP_HOST, 0, "allocator.allocate|allocate", "prepare_async: allocator.allocate = NULL"},
            {B_BWD_GROUP, P_ALLOC_NO_FREE, PREP_HOST, 0, "allocator.free|free", "prepare_async: allocator.free = NULL"},
            {B_BWD_GROUP, P_ALLOC_FAILS, PREP_HOST, 0, "allocator|allocate", "prepare_async: allocator.allocate fails"},
            {B_BWD_GROUP, P_ALLOC_NULL, PREP_HOST, 0, "allocator|allocate", "prepare_async: allocator.allocate returns NULL"},
        };
        for (i = 0; i < sizeof p / sizeof p[0]; ++i) {
            tcase *c = hooked(EXPECT_ERROR, p[i].base, ST_PREPARE, h_prepare, p[i].arg, p[i].value, p[i].fields, p[i].desc);
            c->prep = p[i].prep;
            /* every prepare checks the workspace's alignment; enums and handles: docs/abi.md */
            if (p[i].arg == P_MISALIGN || p[i].arg == P_METHOD || p[i].arg == P_GARBAGE_LAUNCHER) c->statuses = INV;
            if (p[i].arg == P_LAUNCHER_NULL) c->statuses = NULLP;
        }
        /* invalid device seqstarts: the prepare returns OK, the stream's next synchronize reports the
         * cause (INVALID_ARGUMENT from the device kernel of DEVICE and AUTO, ASYNC_FAILURE from the host
         * method), and a following run computes nothing (WORKSPACE_NOT_PREPARED at its synchronize) */
        {
            static const struct {
                int base_det, method, corruption;
                const char *fields, *what;
            } d[] = {
                {0, FMHA_PREPARE_HOST, DS_SSQ_DECREASING, "seqstart_q|max_seqlen_q", "seqstart_q decreasing"},
                {1, FMHA_PREPARE_DEVICE, DS_SSQ_DECREASING, "seqstart_q|max_seqlen_q", "seqstart_q decreasing"},
                {0, FMHA_PREPARE_AUTO, DS_SSQ_DECREASING, "seqstart_q|max_seqlen_q", "seqstart_q decreasing"},
                {0, FMHA_PREPARE_AUTO, DS_SSK_PAST_TOTAL, "seqstart_k|max_seqlen_k", "seqstart_k past the total"},
                {1, FMHA_PREPARE_AUTO, DS_SSK_PAST_TOTAL, "seqstart_k|max_seqlen_k", "seqstart_k past the total"},
                {0, FMHA_PREPARE_DEVICE, DS_SSQ_START_1, "seqstart_q", "seqstart_q[0] = 1"},
                {0, FMHA_PREPARE_HOST, DS_SSK_PAST_TOTAL, "seqstart_k|max_seqlen_k", "seqstart_k past the total"},
                {1, FMHA_PREPARE_AUTO, DS_SSK_LONG, "seqstart_k|max_seqlen_k", "a batch of 13 keys > max_seqlen_k = 12"},
                {1, FMHA_PREPARE_HOST, DS_SSK_LONG, "seqstart_k|max_seqlen_k", "a batch of 13 keys > max_seqlen_k = 12"},
                {0, FMHA_PREPARE_AUTO, DS_SSQ_NEG + 10, "seqstart_q", "seqstart_q[1] = -3, waited for with fmha_device_synchronize"},
                {0, FMHA_PREPARE_HOST, DS_SSQ_DECREASING + 10, "seqstart_q", "seqstart_q decreasing, waited for with fmha_device_synchronize"},
            };
            static const char *const mname[3] = {"AUTO", "HOST", "DEVICE"};
            for (i = 0; i < sizeof d / sizeof d[0]; ++i) {
                char text[200];
                tcase *c;
                snprintf(text, sizeof text, "prepare_async %s, device %s: the synchronize reports %s; a following run computes nothing",
                         mname[d[i].method], d[i].what, d[i].method == FMHA_PREPARE_HOST ? "ASYNC_FAILURE" : "INVALID_ARGUMENT");
                c = custom(EXPECT_ERROR, d[i].base_det ? B_BWD_GROUP_DET : B_BWD_GROUP, c_dev_seq_prepare, d[i].method, d[i].fields,
                           d[i].method == FMHA_PREPARE_HOST ? STATUS_BIT(FMHA_ERR_ASYNC_FAILURE) : INV, text);
                c->value = d[i].corruption;
            }
        }
    }
    /* valid async prepares */
    add(EXPECT_OK, B_BWD_GROUP, ST_RUN, "", "valid: prepare_async HOST")->prep = PREP_HOST;
    add(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, "", "valid: prepare_async DEVICE")->prep = PREP_DEVICE;
    add(EXPECT_OK, B_BWD, ST_RUN, "", "valid: prepare_async AUTO (batch mode)")->prep = PREP_AUTO;
    add(EXPECT_OK, B_BWD_GROUP, ST_RUN, "", "valid: prepare_async AUTO (group mode: the device kernel)")->prep = PREP_AUTO;
    add(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, "", "valid: prepare_async AUTO (group mode, deterministic)")->prep = PREP_AUTO;
    /* a workspace describes itself */
    custom(EXPECT_OK, B_BWD, c_shared_workspace, 0, "", 0,
           "valid: workspaces prepared by another launcher (destroyed since) and by this one (sync, DEVICE, HOST), run on other streams");
    custom(EXPECT_OK, B_BWD_GROUP_DET, c_shared_workspace, 1, "", 0,
           "valid: varlen det: workspaces prepared by another launcher (destroyed since) and by this one, run on other streams");

    /* ---- run ---- */
    /* struct_size: 416 (0.1, before workspace_size) up to sizeof; 417..423 end inside workspace_size
     * (the header says nothing about them: undecided, but accepted means working) */
    {
        static const int64_t bad[] = {0, 8, 408, 415, (int64_t)sizeof(fmha_bwd_args) + 1, (int64_t)sizeof(fmha_bwd_args) + 8, 4096};
        static const int64_t odd[] = {417, 420, 423};
        for (i = 0; i < sizeof bad / sizeof bad[0]; ++i)
            MUT(B_BWD, TG_BA, fmha_bwd_args, struct_size, bad[i], "struct_size|args")->statuses = INV;
        for (i = 0; i < sizeof odd / sizeof odd[0]; ++i) {
            tcase *c = MUT(B_BWD, TG_BA, fmha_bwd_args, struct_size, odd[i], "struct_size|args");
            c->expect = EXPECT_ANY;
            snprintf(c->desc + strlen(c->desc), sizeof c->desc - strlen(c->desc), " (inside workspace_size: may answer an error or work)");
        }
    }
    hooked(EXPECT_OK, B_BWD, ST_RUN, h_run, R_ARGS_V01, 0, "", "valid: a 0.1 caller's fmha_bwd_args (struct_size 416, flush against a guard page)");
    hooked(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, h_run, R_ARGS_V01, 0, "",
           "valid: varlen det: a 0.1 caller's fmha_bwd_args (struct_size 416, flush against a guard page)");
    {
        tcase *c = MUT(B_BWD, TG_BA, fmha_bwd_args, struct_size, 416, "");
        c->expect = EXPECT_OK;
        c->judge = J_CHAIN;
        c->hook = h_run;
        c->arg = R_WSSIZE_1;
        snprintf(c->desc, sizeof c->desc, "bwd: valid: struct_size = 416 with workspace_size = 1 behind it (not read: 0.1 skips the check)");
    }
    /* workspace_size (0.2): smaller than the launcher's size is WORKSPACE_TOO_SMALL; 0 is not checked */
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_run, R_WSSIZE_MINUS_1, 0, "workspace_size", "run: workspace_size = needed - 1")->statuses =
        STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL);
    hooked(EXPECT_ERROR, B_BWD_GROUP_DET, ST_RUN, h_run, R_WSSIZE_1, 0, "workspace_size", "run: workspace_size = 1")->statuses =
        STATUS_BIT(FMHA_ERR_WORKSPACE_TOO_SMALL);
    hooked(EXPECT_OK, B_BWD, ST_RUN, h_run, R_WSSIZE_0, 0, "", "valid: workspace_size = 0 (not checked)");
    hooked(EXPECT_OK, B_BWD_GROUP, ST_RUN, h_run, R_WSSIZE_BIG, 0, "", "valid: workspace_size = needed + 4096 (a larger workspace)");
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_run, R_ARGS_NULL, 0, "args", "run(NULL args)")->statuses = NULLP;
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_run, R_LAUNCHER_NULL, 0, "launcher", "run(NULL launcher)")->statuses = NULLP;
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_run, R_WS_NULL, 0, "workspace", "run: workspace = NULL");
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_run, R_WS_MISALIGNED, 0, "workspace", "run: workspace 8 bytes past 16-byte alignment")->statuses =
        INV;
    /* workspaces not prepared for this run: run returns OK, its synchronize reports WORKSPACE_NOT_PREPARED
     * (host backend), nothing is computed */
    {
        static const struct {
            int base, arg;
            unsigned flags;
            const char *fields, *desc;
        } w[] = {
            {B_BWD, R_WS_OTHER, 0, "workspace", "run with a never-prepared (zero) workspace"},
            {B_BWD_GROUP, R_WS_GARBAGE, 0, "workspace", "run with a never-prepared workspace of random bytes"},
            {B_BWD_DET, R_WS_UNPREPARED, F_NO_PREPARE, "workspace", "run without any prepare"},
            {B_BWD, R_WS_OTHER_TRAITS, 0, "workspace", "run with a workspace prepared by a launcher with other traits (deterministic)"},
            {B_BWD_GROUP_DET, R_WS_OTHER_TRAITS, 0, "workspace",
             "run with a workspace prepared by a launcher with other traits (not deterministic)"},
            {B_BWD_GROUP, R_DEV_SSQ_OTHER, 0, "workspace|seqstart_q",
             "run: device seqstart_q {0,4,5,17} (valid) differs from the prepared {0,5,5,17}"},
        };
        for (i = 0; i < sizeof w / sizeof w[0]; ++i) {
            char text[200];
            tcase *c;
            snprintf(text, sizeof text, "%s: OK, then WORKSPACE_NOT_PREPARED at the synchronize, dq/dk/dv unwritten", w[i].desc);
            c = hooked(EXPECT_ERROR, w[i].base, ST_RUN_SYNC, h_run, w[i].arg, 0, w[i].fields, text);
            c->hook_stage = ST_RUN;
            c->statuses = NOT_PREPARED;
            c->flags = F_UNWRITTEN | w[i].flags;
        }
    }
    hooked(EXPECT_OK, B_BWD, ST_RUN, h_run, R_WS_SAME_TRAITS, 0, "", "valid: a workspace prepared by another launcher with the same traits");
    hooked(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, h_run, R_WS_SAME_TRAITS, 0, "",
           "valid: varlen det: a workspace prepared by another launcher with the same traits");
    hooked(EXPECT_ERROR, B_BWD_GROUP, ST_RUN, h_run, R_DEV_SSQ_CHANGED, 0, "seqstart_q|workspace",
           "run: device seqstart_q {0,6,5,17} differs from the prepared one (nothing computed)")
        ->judge = J_CHAIN;
    table[table_size - 1].flags = F_UNWRITTEN;
    hooked(EXPECT_ERROR, B_BWD_GROUP_DET, ST_RUN, h_run, R_DEV_SSK_DECREASING, 0, "seqstart_k|workspace",
           "run: device seqstart_k decreasing (nothing computed)")
        ->judge = J_CHAIN;
    table[table_size - 1].flags = F_UNWRITTEN;
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_garbage_stream, 0, 0, "stream", "run: stream = 0x1234");
    MUT(B_BWD, TG_BA, fmha_bwd_args, batch, 3, "batch");
    MUT(B_BWD, TG_BA, fmha_bwd_args, batch, 0, "batch");
    MUT(B_BWD, TG_BA, fmha_bwd_args, nhead_q, 2, "nhead_q");
    MUT(B_BWD, TG_BA, fmha_bwd_args, nhead_k, 1, "nhead_k");
    MUT(B_BWD, TG_BA, fmha_bwd_args, hdim_q, 64, "hdim_q");
    MUT(B_BWD, TG_BA, fmha_bwd_args, hdim_v, 16, "hdim_v");
    MUT(B_BWD, TG_BA, fmha_bwd_args, seqlen_q, 15, "seqlen_q");
    MUT(B_BWD, TG_BA, fmha_bwd_args, seqlen_k, 25, "seqlen_k");
    MUT(B_BWD, TG_BA, fmha_bwd_args, max_seqlen_q, 15, "max_seqlen_q");
    MUT(B_BWD, TG_BA, fmha_bwd_args, window_size_left, -2, "window_size_left");
    MUT(B_BWD_GROUP, TG_BA, fmha_bwd_args, seqlen_q, 18, "seqlen_q");
    MUT(B_BWD_GROUP, TG_BA, fmha_bwd_args, max_seqlen_k, 13, "max_seqlen_k");
    MUT(B_BWD_GROUP, TG_BA, fmha_bwd_args, seqstart_k, 0, "seqstart_k");
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_scale, 0, 0, "scale", "run: scale = NaN");
    hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_scale, 2, 0, "scale", "run: scale = -inf");
    for (t = 0; t < NT; ++t) {
        size_t off;
        const char *n = tensor_names[t];
        switch (t) {
        case TQ: off = offsetof(fmha_bwd_args, q); break;
        case TK: off = offsetof(fmha_bwd_args, k); break;
        case TV: off = offsetof(fmha_bwd_args, v); break;
        case TO: off = offsetof(fmha_bwd_args, o); break;
        case TLSE: off = offsetof(fmha_bwd_args, lse); break;
        case TDO: off = offsetof(fmha_bwd_args, d_o); break;
        case TD: off = offsetof(fmha_bwd_args, d); break;
        case TDQ: off = offsetof(fmha_bwd_args, dq); break;
        case TDK: off = offsetof(fmha_bwd_args, dk); break;
        default: off = offsetof(fmha_bwd_args, dv); break;
        }
        snprintf(fields, sizeof fields, "%s.data", n);
        snprintf(desc, sizeof desc, "%s.data", n);
        mut(B_BWD, TG_BA, off + offsetof(fmha_tensor, data), 8, 0, fields, desc);
        for (k = 0; k < 3; ++k) {
            size_t so = off + (k == 0 ? offsetof(fmha_tensor, batch_stride) : k == 1 ? offsetof(fmha_tensor, head_stride)
                                                                                  : offsetof(fmha_tensor, row_stride));
            int lse_like = t == TLSE || t == TD;
            snprintf(desc, sizeof desc, "%s.%s", n, stride_names[k]);
            snprintf(fields, sizeof fields, "%s.%s", n, stride_names[k]);
            if (lse_like && k == 2) {
                mut(B_BWD, TG_BA, so, 8, 2, fields, desc);
                mut(B_BWD, TG_BA, so, 8, 0, fields, desc);
                continue;
            }
            mut(B_BWD, TG_BA, so, 8, -1, fields, desc);
            snprintf(fields, sizeof fields, "%s.%s|%s", n, stride_names[k], n);
            if (k == 0 || (lse_like && k == 1)) mut(B_BWD, TG_BA, so, 8, lse_like ? big / 2 : big, fields, desc)->statuses = INV;
        }
        if (t == TDQ || t == TDV) {
            snprintf(fields, sizeof fields, "%s.row_stride|%s", n, n);
            snprintf(desc, sizeof desc, "%s.row_stride", n);
            mut(B_BWD, TG_BA, off + offsetof(fmha_tensor, row_stride), 8, INT64_MAX, fields, desc)->statuses = INV;
            mut(B_BWD, TG_BA, off + offsetof(fmha_tensor, row_stride), 8, big, fields, desc)->statuses = INV;
        }
        if (t == TK || t == TDO || t == TLSE || t == TD || t == TDQ || t == TDV) {
            snprintf(fields, sizeof fields, "%s.data|%s", n, n);
            snprintf(desc, sizeof desc, "%s.data + %s (misaligned)", n, t == TLSE || t == TD ? "2 bytes" : "1 byte");
            hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_misalign, t, t == TLSE || t == TD ? 2 : 1, fields, desc);
        }
        if (t == TDK || t == TO) {
            snprintf(fields, sizeof fields, "%s.data|%s", n, n);
            snprintf(desc, sizeof desc, "%s.data = UINTPTR_MAX - 4095 (the extent wraps the address space)", n);
            hooked(EXPECT_ERROR, B_BWD, ST_RUN, h_wrap, t, 0, fields, desc);
        }
    }
    /* overlapping outputs (MHA: dq, dk, dv, q, k, v, o, d_o all [2][16][2][32]) */
    {
        struct {
            int dst, src;
            int64_t bytes;
            const char *fields, *desc;
        } o[] = {
            {TDQ, TDK, 0, "dq|dk", "dq.data == dk.data (outputs overlap)"},
            {TDK, TDV, 0, "dk|dv", "dk.data == dv.data"},
            {TDV, TDQ, 0, "dv|dq", "dv.data == dq.data"},
            {TDQ, TDK, 4, "dq|dk", "dq.data = dk.data + 4 bytes (partial overlap)"},
            {TDQ, TQ, 0, "dq|q", "dq.data == q.data (an output overwrites an input)"},
            {TDK, TK, 0, "dk|k", "dk.data == k.data"},
            {TDV, TV, 0, "dv|v", "dv.data == v.data"},
            {TDQ, TDO, 0, "dq|d_o", "dq.data == d_o.data"},
            {TDV, TO, 0, "dv|o", "dv.data == o.data"},
            {TD, TLSE, 0, "d|lse", "d.data == lse.data (scratch overwrites the LSE)"},
            {TD, TDQ, 0, "d|dq", "d.data == dq.data"},
        };
        for (i = 0; i < sizeof o / sizeof o[0]; ++i)
            hooked(EXPECT_ERROR, B_BWD_MHA, ST_RUN, o[i].bytes ? NULL : h_overlap, o[i].dst * 100 + o[i].src, o[i].bytes, o[i].fields,
                   o[i].desc)
                ->layout = o[i].bytes ? l_overlap : NULL;
        hooked(EXPECT_ERROR, B_BWD_MHA, ST_RUN, h_self_overlap, TDQ, 2, "dq.row_stride|dq", "dq.row_stride = 0 (rows overlap)");
        hooked(EXPECT_ERROR, B_BWD_MHA, ST_RUN, h_self_overlap, TDK, 1, "dk.head_stride|dk", "dk.head_stride = 0 (heads overlap)");
        hooked(EXPECT_ERROR, B_BWD_MHA, ST_RUN, h_self_overlap, TDV, 0, "dv.batch_stride|dv", "dv.batch_stride = 0");
        hooked(EXPECT_ERROR, B_BWD_MHA, ST_RUN, h_self_overlap, TD, 1, "d.head_stride|d", "d.head_stride = 0");
    }
    /* valid backward layouts */
    add(EXPECT_OK, B_BWD, ST_RUN, "", "valid: the default problem (every struct flush against a guard page)");
    add(EXPECT_OK, B_BWD_DET, ST_RUN, "", "valid: deterministic");
    add(EXPECT_OK, B_BWD_GROUP, ST_RUN, "", "valid: varlen");
    add(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, "", "valid: varlen deterministic");
    valid_layout(B_BWD_MHA, L_PACKED_DQKV, "q/k/v packed and dq/dk/dv packed, row stride 3*H*D");
    valid_layout(B_BWD_MHA, L_DQKV_HEADS, "dq/dk/dv interleaved per head ([b][s][h][3][d])");
    valid_layout(B_BWD, L_KV_ALIAS, "v.data == k.data");
    valid_layout(B_BWD, L_DO_ALIAS_O, "d_o.data == o.data (inputs alias)");
    valid_layout(B_BWD_DET, L_BHSD, "deterministic, every tensor [b][h][s][d]");
    valid_layout(B_BWD, L_EMPTY_Q, "seqlen_q = 0 with the q-side tensors NULL");
    valid_layout(B_BWD_GROUP_DET, L_PACKED_DQKV, "varlen deterministic, packed qkv and dqkv")->base = B_BWD_GROUP_DET;
    /* group mode: max_seqlen_q/k are clamped to the totals (INT32_MAX is a valid, fast bound) */
    valid_layout(B_BWD_GROUP, L_MAX_Q_HUGE, "varlen: max_seqlen_q = INT32_MAX in the traits and the args");
    valid_layout(B_BWD_GROUP_DET, L_MAX_K_HUGE, "varlen det: max_seqlen_k = INT32_MAX in the traits and the args");
    valid_layout(B_BWD_GROUP_DET, L_MAX_Q_HUGE, "varlen det: max_seqlen_q = INT32_MAX in the traits and the args");
    /* group mode ignores batch_stride */
    hooked(EXPECT_OK, B_BWD_GROUP_DET, ST_RUN, h_batch_stride, TDQ, INT64_MIN, "", "valid: varlen det dq.batch_stride = INT64_MIN (ignored)");
    hooked(EXPECT_OK, B_BWD_GROUP, ST_RUN, h_batch_stride, TD, -1, "", "valid: varlen d.batch_stride = -1 (ignored)");
    hooked(EXPECT_OK, B_BWD_GROUP, ST_RUN, h_batch_stride, TDO, INT64_MAX, "", "valid: varlen d_o.batch_stride = INT64_MAX (ignored)");
    hooked(EXPECT_OK, B_BWD_GROUP, ST_RUN, h_batch_stride, TK, -3, "", "valid: varlen k.batch_stride = -3 (ignored)");

    /* ---- handles ---- */
    {
        static const char *const what[] = {
            "bwd: fmha_bwd_launcher_destroy twice",
            "bwd: workspace_size on a destroyed launcher",
            "bwd: run on a destroyed launcher",
            "bwd: prepare_workspace on a destroyed launcher",
            "bwd: prepare_workspace_async on a destroyed launcher",
            "bwd: workspace_size on launcher 0x1234",
            "bwd: run on launcher 0x1234",
            "bwd: prepare_workspace on launcher 0x1234",
            "bwd: destroy launcher 0x1234",
            "bwd: workspace_size on a pointer to 64 random bytes",
            "bwd: run on a pointer to 64 random bytes",
            "bwd: prepare_workspace on a pointer to 64 random bytes",
            "bwd: destroy a pointer to 64 random bytes",
        };
        for (k = H_DOUBLE_DESTROY; k <= H_RANDOM_DESTROY; ++k)
            custom(EXPECT_ERROR, B_NONE, c_launcher_handle, k, "launcher", STATUS_BIT(FMHA_ERR_INVALID_ARGUMENT), what[k])->flags =
                k <= H_DESTROYED_SIZE ? F_SAMPLE : 0;
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_RELEASER_SIZE, "launcher", INV,
               "bwd: workspace_size on a releaser's handle (then the releaser still works)");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_RELEASER_RUN, "launcher", INV, "bwd: run on a releaser's handle");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_RELEASER_DESTROY, "launcher", INV,
               "bwd: fmha_bwd_launcher_destroy(a releaser's handle) (then the releaser still works)")
            ->flags = F_SAMPLE;
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_GARBAGE_PREPARE_ASYNC, "launcher", INV, "bwd: prepare_workspace_async on launcher 0x1234");
        custom(EXPECT_OK, B_NONE, c_launcher_handle, H_NULL_DESTROY, "", 0, "bwd: valid: destroy(NULL) is a no-op");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_NULL_RUN, "launcher", NULLP, "bwd: run(NULL launcher)");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_NULL_PREPARE_ASYNC, "launcher", NULLP, "bwd: prepare_workspace_async(NULL launcher)");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_NULL_PREPARE, "launcher", NULLP, "bwd: prepare_workspace(NULL launcher)");
        custom(EXPECT_ERROR, B_NONE, c_launcher_handle, H_NULL_SIZE, "launcher", NULLP, "bwd: workspace_size(NULL launcher)");
        custom(EXPECT_OK, B_NONE, c_launcher_race, 0, "", 0,
               "bwd: valid: workspace_size and prepare from 3 threads racing destroy: each OK or INVALID_ARGUMENT, never OK again")
            ->flags = F_SAMPLE;
        custom(EXPECT_OK, B_NONE, c_launcher_handle, H_DESTROY_QUEUED, "", 0,
               "bwd: valid: destroy the launcher while its run is queued on a stream")
            ->flags = F_SAMPLE;
    }
    {
        static const char *const what[] = {
            "releaser: destroy twice",
            "releaser: release on a destroyed releaser",
            "releaser: release on releaser 0x1234",
            "releaser: destroy releaser 0x1234",
            "releaser: release on a pointer to 64 random bytes",
            "releaser: destroy a pointer to 64 random bytes",
            "releaser: create(NULL, NULL)",
            "releaser: create with allocator struct_size = 0",
            "releaser: create with allocator struct_size = sizeof + 64",
            "releaser: create with allocator.free = NULL",
        };
        static const char *const f[] = {"releaser", "releaser", "releaser", "releaser", "releaser", "releaser", "releaser",
                                        "allocator|struct_size", "allocator|struct_size", "allocator.free|free"};
        for (k = RL_DOUBLE_DESTROY; k <= RL_CREATE_NO_FREE; ++k)
            custom(EXPECT_ERROR, B_NONE, c_releaser, k, f[k],
                   k <= RL_RANDOM_DESTROY || k == RL_CREATE_SIZE_0 || k == RL_CREATE_SIZE_BIG ? INV
                   : k == RL_CREATE_NULL_OUT ? NULLP : 0,
                   what[k]);
        custom(EXPECT_ERROR, B_NONE, c_releaser, RL_LAUNCHER_RELEASE, "releaser", INV,
               "releaser: release on a launcher's handle (then the launcher still works)");
        custom(EXPECT_ERROR, B_NONE, c_releaser, RL_LAUNCHER_DESTROY, "releaser", INV,
               "releaser: fmha_pinned_releaser_destroy(a launcher's handle) (then the launcher still works)")
            ->flags = F_SAMPLE;
        custom(EXPECT_OK, B_NONE, c_releaser, RL_CREATE_NO_ALLOCATE, "", 0,
               "releaser: valid: a caller allocator with allocate = NULL (a releaser only frees); one release, freed once");
        custom(EXPECT_OK, B_NONE, c_releaser, RL_RELEASE_NULL_PTR, "", 0, "releaser: valid: release(r, NULL) is ignored");
        custom(EXPECT_OK, B_NONE, c_releaser, RL_DESTROY_NULL, "", 0, "releaser: valid: destroy(NULL) is a no-op");
        custom(EXPECT_OK, B_NONE, c_releaser, RL_CREATE_FLUSH_ALLOCATOR, "", 0,
               "releaser: valid: caller allocator struct flush against a guard page; one release, freed once");
        custom(EXPECT_OK, B_NONE, c_releaser, RL_DEFAULT_RELEASE, "", 0, "releaser: valid: release on the default releaser (NULL)");
        custom(EXPECT_OK, B_NONE, c_releaser_race, 0, "", 0,
               "releaser: valid: releases from 4 threads racing destroy (25 rounds, 6 with --light): each OK and freed once, or "
               "INVALID_ARGUMENT and not freed")
            ->flags = F_SAMPLE;
    }
    custom(EXPECT_OK, B_NONE, c_device_sync_threads, 0, "", 0,
           "runtime: valid: fmha_device_synchronize after a forward on a destroyed private stream, while another thread "
           "calls fmha_device_synchronize in a loop: the output must be complete")
        ->flags = F_HEAVY;
    {
        static const struct {
            int arg;
            const char *fields;
            uint32_t statuses;
            int expect;
            const char *desc;
        } rt[] = {
            {RT_MEMCPY_KIND_0, "kind", INV, EXPECT_ERROR, "runtime: fmha_memcpy kind = 0"},
            {RT_MEMCPY_KIND_4, "kind", INV, EXPECT_ERROR, "runtime: fmha_memcpy kind = 4"},
            {RT_MEMCPY_KIND_NEG, "kind", INV, EXPECT_ERROR, "runtime: fmha_memcpy kind = -1"},
            {RT_MEMCPY_ASYNC_KIND, "kind", INV, EXPECT_ERROR, "runtime: fmha_memcpy_async kind = INT32_MIN"},
            {RT_MEMSET_256, "value", 0, EXPECT_ERROR, "runtime: fmha_memset value = 256"},
            {RT_MEMSET_NEG, "value", 0, EXPECT_ERROR, "runtime: fmha_memset value = -1"},
            {RT_MEMSET_ASYNC_BIG, "value", 0, EXPECT_ERROR, "runtime: fmha_memset_async value = INT32_MAX"},
            {RT_STREAM_DESTROY_GARBAGE, "stream", 0, EXPECT_ERROR, "runtime: fmha_stream_destroy(0x1234)"},
            {RT_STREAM_SYNC_GARBAGE, "stream", 0, EXPECT_ERROR, "runtime: fmha_stream_synchronize(0x1234)"},
            {RT_STREAM_DESTROY_TWICE, "stream", 0, EXPECT_ERROR, "runtime: fmha_stream_destroy twice"},
            {RT_STREAM_DESTROY_DEFAULT, "stream", 0, EXPECT_ERROR, "runtime: fmha_stream_destroy(NULL = the default stream)"},
            {RT_DEVICE_FREE_GARBAGE, "ptr", 0, EXPECT_ERROR, "runtime: fmha_device_free of memory not from fmha"},
            {RT_DEVICE_FREE_TWICE, "ptr", 0, EXPECT_ERROR, "runtime: fmha_device_free twice"},
            {RT_PINNED_FREE_TWICE, "ptr", 0, EXPECT_ERROR, "runtime: fmha_host_free_pinned twice"},
            {RT_CU_COUNT_0, "cu_count", 0, EXPECT_ERROR, "runtime: fmha_host_set_cu_count(0)"},
            {RT_CU_COUNT_BIG, "cu_count", 0, EXPECT_ERROR, "runtime: fmha_host_set_cu_count(INT32_MAX)"},
            {RT_CU_COUNT_OUT_NULL, "count", STATUS_BIT(FMHA_ERR_NULL_POINTER), EXPECT_ERROR, "runtime: fmha_device_cu_count(NULL)"},
            {RT_REGISTRY_NULL_REQUIRED, "required", STATUS_BIT(FMHA_ERR_NULL_POINTER), EXPECT_ERROR,
             "runtime: fmha_registry_json(buffer, 64, NULL)"},
            {RT_REGISTRY_SMALL, "", 0, EXPECT_OK, "runtime: valid: fmha_registry_json into a 7-byte buffer flush against a guard page"},
            {RT_STATUS_STRING, "", 0, EXPECT_OK, "runtime: valid: fmha_status_string(12345) is \"unknown status\""},
            {RT_LAST_ERROR_NULL, "", 0, EXPECT_OK, "runtime: valid: fmha_last_error_message(NULL, 5) returns the length"},
            {RT_MEMCPY_WRAP_SRC, "src", INV, EXPECT_ERROR, "runtime: fmha_memcpy from UINTPTR_MAX - 15 (64 bytes wrap the address space)"},
            {RT_MEMSET_WRAP_DST, "dst", INV, EXPECT_ERROR, "runtime: fmha_memset at UINTPTR_MAX - 15 (64 bytes wrap the address space)"},
            {RT_MEMCPY_WRAP_DST, "dst", INV, EXPECT_ERROR, "runtime: fmha_memcpy to UINTPTR_MAX - 15 (64 bytes wrap the address space)"},
            {RT_MEMCPY_ASYNC_WRAP, "src", INV, EXPECT_ERROR, "runtime: fmha_memcpy_async from UINTPTR_MAX - 31 (64 bytes wrap)"},
            {RT_MEMSET_ASYNC_WRAP, "dst", INV, EXPECT_ERROR, "runtime: fmha_memset_async at UINTPTR_MAX - 15 (64 bytes wrap)"},
            {RT_LOAD_KERNELS, "", 0, EXPECT_OK, "runtime: valid: fmha_load_kernels (nothing to load on the host backend), then a forward"},
            {RT_LAST_ERROR_CLEARED, "", 0, EXPECT_OK, "runtime: valid: a successful call clears the last error message"},
            {RT_MEMCPY_ASYNC_DESTROYED, "stream", 0, EXPECT_ERROR, "runtime: fmha_memcpy_async on a destroyed stream"},
            {RT_MALLOC_NULL_OUT, "ptr", STATUS_BIT(FMHA_ERR_NULL_POINTER), EXPECT_ERROR, "runtime: fmha_device_malloc(NULL, 64)"},
            {RT_MALLOC_HUGE, "", 0, EXPECT_ERROR, "runtime: fmha_device_malloc(SIZE_MAX / 2) fails cleanly"},
            {RT_STREAM_CREATE_NULL, "stream", STATUS_BIT(FMHA_ERR_NULL_POINTER), EXPECT_ERROR, "runtime: fmha_stream_create(NULL)"},
            {RT_MEMCPY_NULL_DST, "dst", STATUS_BIT(FMHA_ERR_NULL_POINTER), EXPECT_ERROR, "runtime: fmha_memcpy(NULL, src, 64)"},
        };
        for (i = 0; i < sizeof rt / sizeof rt[0]; ++i) custom(rt[i].expect, B_NONE, c_runtime, rt[i].arg, rt[i].fields, rt[i].statuses, rt[i].desc);
    }
    require_invalid_argument_for_tensor_rules();
    /* the kv-cache and merge cases (fuzz_kvcache.c) */
    for (k = 0; k < kv_case_count(); ++k) {
        int expect, sampled;
        uint32_t statuses;
        const char *kfields, *kdesc;
        kv_case_info(k, &expect, &statuses, &sampled, &kfields, &kdesc);
        tcase *c = custom(expect, B_NONE, c_kvcache, k, kfields, statuses, kdesc);
        if (sampled) c->flags |= F_SAMPLE;
    }
}

/* The header fixes INVALID_ARGUMENT for extents past the address space, misaligned data and
 * overlapping outputs; those cases are made by hooks. */
static void require_invalid_argument_for_tensor_rules(void) {
    int i;
    for (i = 0; i < table_size; ++i) {
        tcase *c = &table[i];
        if (c->expect != EXPECT_ERROR || c->statuses != 0) continue;
        if (c->hook == h_overlap || c->hook == h_self_overlap || c->layout == l_overlap || c->hook == h_wrap || c->hook == h_misalign)
            c->statuses = INV;
    }
}

int targeted_count(void) {
    build();
    return table_size;
}

int targeted_heavy(int index) {
    build();
    return (table[index].flags & F_HEAVY) != 0;
}

int targeted_always_sampled(int index) {
    build();
    return (table[index].flags & F_SAMPLE) != 0;
}

/* ---- running one case ---------------------------------------------------------------------------- */

void targeted_run(int index, uint64_t seed, case_record *rec) {
    static run_ctx ctx;
    run_ctx *r = &ctx;
    const tcase *c;
    build();
    c = &table[index];
    memset(r, 0, sizeof *r);
    r->c = c;
    r->rec = rec;
    r->rng = rng_mix(seed, (uint64_t)index);
    rec->expect = c->expect;
    rec->statuses = c->statuses;
    rec->correct = -1;
    rec->forbidden = -1;
    snprintf(rec->fields, sizeof rec->fields, "%s", c->fields);
    snprintf(rec->desc, sizeof rec->desc, "%s", c->desc);
    rec->phase = 0;
    report(rec);
    if (c->stage == ST_CUSTOM) {
        c->hook(r);
    } else {
        int op_bwd = c->base >= B_BWD;
        int group = c->base == B_FWD_GROUP || c->base == B_BWD_GROUP || c->base == B_BWD_GROUP_DET;
        int det = c->base == B_BWD_DET || c->base == B_BWD_GROUP_DET;
        setup_default(&r->s, op_bwd, group, det);
        if (c->base == B_FWD_MHA || c->base == B_BWD_MHA) {
            r->s.hk = r->s.hq = 2;
            r->s.sq = r->s.sk = 16;
            r->s.max_sq = r->s.max_sk = 16;
            r->s.mask = FMHA_MASK_NONE;
            r->s.wl = r->s.wr = -1;
        }
        if (c->layout && (c->arg == L_PACKED_QKV || c->arg == L_PACKED_DQKV) && group) {
            /* packed qkv needs equal q and k lengths */
            int b;
            for (b = 0; b < r->s.batch; ++b) r->s.lens_k[b] = r->s.lens_q[b];
            r->s.sk = r->s.sq;
            r->s.max_sk = r->s.max_sq;
            r->s.hk = r->s.hq;
        }
        setup_default_layout(&r->s);
        if (c->layout) c->layout(r);
        setup_alloc(&r->s, &r->rng);
        run_chain(r);
    }
    rec->phase = 2;
    if (rec->expect == EXPECT_OK && rec->correct < 0 && rec->status == FMHA_OK && c->stage == ST_CUSTOM) rec->correct = 1;
    report(rec);
}

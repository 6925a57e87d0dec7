/*
 * The soak: N threads (16) for S seconds doing small forward and backward calls — batch and varlen,
 * deterministic and not — on shared and private streams and on shared and private launchers,
 * destroying launchers while their work is still queued, running with workspaces that another launcher
 * (with the same traits) prepared, preparing workspaces synchronously and on streams, waiting with
 * stream and device synchronization, and handing pinned buffers to the default, a shared
 * (periodically replaced: releases race its destroy) and private releasers. Every output is NaN-poisoned before its call
 * and checked against the float64 reference of attention_reference.h (relative error < 2e-2, as the
 * examples use); deterministic backward results must be bitwise equal across repeats; every buffer
 * released with a counted allocator must be freed exactly once, and every release must answer FMHA_OK
 * or (the releaser was destroyed: the buffer stays the caller's) FMHA_ERR_INVALID_ARGUMENT.
 *
 * And the exit-under-load trial: threads hammer asynchronous work while the main thread calls exit(0).
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double soak_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- failures ------------------------------------------------------------------------------------ */

static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long failures;

static void fail(int thread, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#include <stdarg.h>
static void fail(int thread, const char *fmt, ...) {
    va_list ap;
    long n = atomic_fetch_add(&failures, 1);
    if (n >= 40) return;
    pthread_mutex_lock(&print_lock);
    printf("soak FAILURE (thread %d): ", thread);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    pthread_mutex_unlock(&print_lock);
}

static const char *msg(char *buf, size_t n) {
    last_message(buf, n);
    return buf;
}

#define CALL(thread, what, call)                                                                        \
    do {                                                                                                \
        fmha_status st_ = (call);                                                                       \
        if (st_ != FMHA_OK) {                                                                           \
            char m_[400];                                                                               \
            fail(thread, "%s: %s returned %d (%s): %s", what, #call, (int)st_, fmha_status_string(st_), \
                 msg(m_, sizeof m_));                                                                   \
            goto out;                                                                                   \
        }                                                                                               \
    } while (0)

/* ---- the counted pinned allocator ---------------------------------------------------------------- */

static atomic_long counted_frees, counted_releases, refused_releases;

static fmha_status counted_allocate(void *user, size_t bytes, void **ptr) {
    (void)user;
    return fmha_host_malloc_pinned(ptr, bytes);
}

static void counted_free(void *user, void *ptr) {
    (void)user;
    atomic_fetch_add(&counted_frees, 1);
    fmha_host_free_pinned(ptr);
}

static fmha_pinned_allocator counted_allocator = {sizeof(fmha_pinned_allocator), NULL, counted_allocate, counted_free};

/* The staging allocator of the asynchronous prepares: every allocation must come back (through the
 * library's releaser) exactly once. */
static atomic_long staging_allocs, staging_frees;

static fmha_status staging_allocate(void *user, size_t bytes, void **ptr) {
    fmha_status st;
    (void)user;
    st = fmha_host_malloc_pinned(ptr, bytes);
    if (st == FMHA_OK) atomic_fetch_add(&staging_allocs, 1);
    return st;
}

static void staging_free(void *user, void *ptr) {
    (void)user;
    atomic_fetch_add(&staging_frees, 1);
    fmha_host_free_pinned(ptr);
}

static fmha_pinned_allocator staging_allocator = {sizeof(fmha_pinned_allocator), NULL, staging_allocate, staging_free};

/* The shared releaser, replaced every few milliseconds. Handles are checked ids: a worker may use one
 * that the swapper is destroying or has destroyed (the release then answers INVALID_ARGUMENT). */
static _Atomic(fmha_pinned_releaser *) shared_releaser;
static atomic_int stop_all;

/* ---- shared launchers ---------------------------------------------------------------------------- */

typedef struct {
    setup shape; /* the problem (no buffers) */
    fmha_bwd_launcher *launcher;
    void *ws;
    size_t ws_size;
    fmha_stream_t stream;
} shared_config;

static shared_config configs[4];
static fmha_stream_t shared_streams[2];

static void config_shape(setup *s, int which) {
    memset(s, 0, sizeof *s);
    s->op_bwd = 1;
    s->wl = -1;
    s->wr = 0;
    switch (which) {
    case 0:
        s->batch = 2, s->sq = 24, s->sk = 40, s->hq = 4, s->hk = 2, s->dq = s->dv = 32;
        s->mask = FMHA_MASK_TOP_LEFT, s->dtype = FMHA_DTYPE_BF16, s->det = 0;
        break;
    case 1:
        s->batch = 1, s->sq = 33, s->sk = 33, s->hq = 2, s->hk = 1, s->dq = s->dv = 64;
        s->mask = FMHA_MASK_BOTTOM_RIGHT, s->dtype = FMHA_DTYPE_FP16, s->det = 1;
        break;
    case 2: {
        static const int32_t lq[3] = {5, 0, 17}, lk[3] = {9, 12, 17};
        int b;
        s->group = 1, s->batch = 3, s->hq = 2, s->hk = 2, s->dq = s->dv = 32;
        s->mask = FMHA_MASK_NONE, s->wr = -1, s->dtype = FMHA_DTYPE_BF16, s->det = 0;
        for (b = 0; b < 3; ++b) s->lens_q[b] = lq[b], s->lens_k[b] = lk[b], s->sq += lq[b], s->sk += lk[b];
        s->max_sq = 17, s->max_sk = 17;
        break;
    }
    default: {
        static const int32_t lq[2] = {20, 7}, lk[2] = {13, 30};
        int b;
        s->group = 1, s->batch = 2, s->hq = 4, s->hk = 1, s->dq = s->dv = 64;
        s->mask = FMHA_MASK_BOTTOM_RIGHT, s->dtype = FMHA_DTYPE_BF16, s->det = 1;
        for (b = 0; b < 2; ++b) s->lens_q[b] = lq[b], s->lens_k[b] = lk[b], s->sq += lq[b], s->sk += lk[b];
        s->max_sq = 20, s->max_sk = 30;
        break;
    }
    }
    if (!s->group) s->max_sq = s->sq, s->max_sk = s->sk;
}

static int shared_setup(uint64_t *rng) {
    int i;
    char m[400];
    if (fmha_stream_create(&shared_streams[0]) != FMHA_OK || fmha_stream_create(&shared_streams[1]) != FMHA_OK) {
        printf("soak: stream_create failed: %s\n", msg(m, sizeof m));
        return 0;
    }
    for (i = 0; i < 4; ++i) {
        shared_config *c = &configs[i];
        setup tmp;
        size_t bytes = 0;
        config_shape(&c->shape, i);
        tmp = c->shape;
        setup_default_layout(&tmp);
        setup_alloc(&tmp, rng);
        c->stream = shared_streams[i % 2];
        if (fmha_bwd_launcher_create(tmp.bt, &c->launcher) != FMHA_OK ||
            fmha_bwd_launcher_workspace_size(c->launcher, &bytes) != FMHA_OK || fmha_device_malloc(&c->ws, bytes) != FMHA_OK ||
            fmha_bwd_launcher_prepare_workspace(c->launcher, c->ws, bytes, tmp.group ? tmp.ssq : NULL, tmp.group ? tmp.ssk : NULL) !=
                FMHA_OK) {
            printf("soak: shared launcher %d: %s\n", i, msg(m, sizeof m));
            return 0;
        }
        c->ws_size = bytes;
        setup_free(&tmp);
    }
    return 1;
}

/* ---- operations ---------------------------------------------------------------------------------- */

typedef struct {
    int id;
    uint64_t rng;
    long ops[5];
} worker;

static void random_shape(setup *s, uint64_t *rng, int op_bwd) {
    static const int heads[3][2] = {{2, 1}, {2, 2}, {4, 2}};
    int h = rng_int(rng, 0, 2), b;
    memset(s, 0, sizeof *s);
    s->op_bwd = op_bwd;
    s->group = rng_chance(rng, 40);
    s->det = op_bwd && rng_chance(rng, 50);
    s->dtype = rng_chance(rng, 50) ? FMHA_DTYPE_BF16 : FMHA_DTYPE_FP16;
    s->hq = heads[h][0];
    s->hk = heads[h][1];
    s->dq = s->dv = rng_chance(rng, 60) ? 32 : 64;
    s->mask = rng_int(rng, 0, 2);
    s->wl = -1;
    s->wr = s->mask == FMHA_MASK_NONE ? -1 : 0;
    if (!s->group) {
        s->batch = rng_int(rng, 1, 2);
        s->sq = rng_int(rng, 1, 40);
        s->sk = rng_int(rng, 1, 40);
        s->max_sq = s->sq;
        s->max_sk = s->sk;
    } else {
        s->batch = rng_int(rng, 1, 3);
        for (b = 0; b < s->batch; ++b) {
            s->lens_q[b] = rng_int(rng, 0, 24);
            s->lens_k[b] = rng_int(rng, 1, 24);
            s->sq += s->lens_q[b];
            s->sk += s->lens_k[b];
            if (s->lens_q[b] > s->max_sq) s->max_sq = s->lens_q[b];
            if (s->lens_k[b] > s->max_sk) s->max_sk = s->lens_k[b];
        }
    }
}

static const char *describe(const setup *s, char *buf, size_t n) {
    snprintf(buf, n, "%s %s%s batch %d heads %d/%d d %d seqlen %d/%d mask %d %s", s->op_bwd ? "bwd" : "fwd",
             s->group ? "varlen" : "batch", s->det ? " det" : "", s->batch, s->hq, s->hk, s->dq, s->sq, s->sk, s->mask,
             s->dtype ? "bf16" : "fp16");
    return buf;
}

/* Waits for `stream` in one of the ways the API offers; a private stream may be destroyed first
 * (its work still completes) and waited for with fmha_device_synchronize. */
static fmha_status wait_for(worker *w, fmha_stream_t *stream, int private_stream) {
    int how = rng_int(&w->rng, 0, 3);
    if (private_stream && how == 0) {
        fmha_status st = fmha_stream_destroy(*stream);
        *stream = NULL;
        if (st != FMHA_OK) return st;
        return fmha_device_synchronize();
    }
    if (how == 1) return fmha_device_synchronize();
    return fmha_stream_synchronize(*stream);
}

static void check(worker *w, const setup *s, int backward, const char *what) {
    char note[600] = "", d[200];
    if (setup_check(s, backward, note, sizeof note) == 0) fail(w->id, "%s (%s): wrong result: %s", what, describe(s, d, sizeof d), note);
}

static void op_forward(worker *w) {
    setup s;
    fmha_stream_t stream = NULL;
    int private_stream = 0, choice = rng_int(&w->rng, 0, 2);
    random_shape(&s, &w->rng, 0);
    setup_default_layout(&s);
    setup_alloc(&s, &w->rng);
    if (choice == 0) {
        CALL(w->id, "forward", fmha_stream_create(&stream));
        private_stream = 1;
    } else if (choice == 1) {
        stream = shared_streams[rng_int(&w->rng, 0, 1)];
    }
    setup_poison(&s, 0);
    CALL(w->id, "forward", fmha_fwd(s.ft, s.fa, stream));
    CALL(w->id, "forward", wait_for(w, &stream, private_stream));
    check(w, &s, 0, "forward");
out:
    if (private_stream && stream) fmha_stream_destroy(stream);
    setup_free(&s);
}

/* A backward with a shared configuration's workspace on its stream (runs with one workspace are
 * serialized by that stream), with this thread's own tensors: on the shared launcher, or on a fresh
 * launcher with the same traits (the workspace describes itself), destroyed while its run is queued. */
static void op_shared_backward(worker *w) {
    int which = rng_int(&w->rng, 0, 3);
    shared_config *c = &configs[which];
    setup s = c->shape;
    unsigned char *first[3] = {0};
    size_t bytes[3] = {0};
    int t[3] = {TDQ, TDK, TDV}, i, repeat;
    fmha_bwd_launcher *fresh = NULL;
    setup_default_layout(&s);
    setup_alloc(&s, &w->rng);
    s.stream = c->stream;
    s.ba->workspace = c->ws;
    s.ba->workspace_size = rng_chance(&w->rng, 50) ? c->ws_size : 0;
    setup_poison(&s, 0);
    CALL(w->id, "shared backward: forward", fmha_fwd(s.ft, s.fa, s.stream));
    for (repeat = 0; repeat < (s.det ? 2 : 1); ++repeat) {
        setup_poison(&s, 1);
        if (rng_chance(&w->rng, 40)) {
            CALL(w->id, "shared workspace, fresh launcher", fmha_bwd_launcher_create(s.bt, &fresh));
            CALL(w->id, "shared workspace, fresh launcher", fmha_bwd_launcher_run(fresh, s.ba, s.stream));
            CALL(w->id, "shared workspace, fresh launcher", fmha_bwd_launcher_destroy(fresh));
            fresh = NULL;
        } else {
            CALL(w->id, "shared backward", fmha_bwd_launcher_run(c->launcher, s.ba, s.stream));
        }
        CALL(w->id, "shared backward", fmha_stream_synchronize(s.stream));
        if (repeat == 0) {
            check(w, &s, 1, "shared-launcher backward");
            if (s.det)
                for (i = 0; i < 3; ++i) {
                    uint64_t b = 0;
                    tensor_extent(&s, t[i], &b);
                    bytes[i] = (size_t)b;
                    first[i] = (unsigned char *)malloc(bytes[i] + 1);
                    memcpy(first[i], s.t[t[i]].data, bytes[i]);
                }
        } else {
            for (i = 0; i < 3; ++i)
                if (memcmp(first[i], s.t[t[i]].data, bytes[i]) != 0) {
                    char d[200];
                    fail(w->id, "shared deterministic backward (%s): %s differs bitwise between two runs", describe(&s, d, sizeof d),
                         tensor_names[t[i]]);
                    break;
                }
        }
    }
out:
    if (fresh) fmha_bwd_launcher_destroy(fresh);
    for (i = 0; i < 3; ++i) free(first[i]);
    setup_free(&s);
}

/* A backward with a private launcher, destroyed while its work is queued; its workspace prepared by
 * it or by a helper launcher with the same traits (destroyed right after the prepare). */
static void op_private_backward(worker *w) {
    setup s;
    fmha_bwd_launcher *launcher = NULL, *helper = NULL, *preparer;
    fmha_stream_t stream = NULL;
    int private_stream = 0, method = rng_int(&w->rng, 0, 4), i, t[3] = {TDQ, TDK, TDV};
    void *ws = NULL;
    size_t ws_size = 0, bytes[3] = {0};
    unsigned char *first[3] = {0};
    random_shape(&s, &w->rng, 1);
    setup_default_layout(&s);
    setup_alloc(&s, &w->rng);
    if (rng_chance(&w->rng, 50)) {
        CALL(w->id, "private backward", fmha_stream_create(&stream));
        private_stream = 1;
    } else {
        stream = shared_streams[rng_int(&w->rng, 0, 1)];
    }
    s.stream = stream;
    setup_poison(&s, 0);
    CALL(w->id, "private backward: forward", fmha_fwd(s.ft, s.fa, stream));
    CALL(w->id, "private backward", fmha_bwd_launcher_create(s.bt, &launcher));
    CALL(w->id, "private backward", fmha_bwd_launcher_workspace_size(launcher, &ws_size));
    CALL(w->id, "private backward", fmha_device_malloc(&ws, ws_size));
    s.ba->workspace = ws;
    s.ba->workspace_size = rng_chance(&w->rng, 70) ? ws_size : 0;
    preparer = launcher;
    if (rng_chance(&w->rng, 30)) {
        CALL(w->id, "private backward: helper launcher", fmha_bwd_launcher_create(s.bt, &helper));
        preparer = helper;
    }
    if (method == 0) {
        CALL(w->id, "private backward", fmha_stream_synchronize(stream)); /* the sync prepare is not ordered with the stream */
        CALL(w->id, "private backward",
             fmha_bwd_launcher_prepare_workspace(preparer, ws, ws_size, s.group ? s.ssq : NULL, s.group ? s.ssk : NULL));
    } else {
        CALL(w->id, "private backward",
             fmha_bwd_launcher_prepare_workspace_async(preparer, ws, ws_size, s.group ? s.ssq : NULL, s.group ? s.ssk : NULL, stream,
                                                       method == 4 ? &staging_allocator : NULL,
                                                       method == 4 ? FMHA_PREPARE_HOST : method - 1));
    }
    if (helper) {
        CALL(w->id, "private backward: destroy the helper launcher", fmha_bwd_launcher_destroy(helper));
        helper = NULL;
    }
    setup_poison(&s, 1);
    CALL(w->id, "private backward", fmha_bwd_launcher_run(launcher, s.ba, stream));
    if (s.det) {
        CALL(w->id, "private backward", fmha_stream_synchronize(stream));
        for (i = 0; i < 3; ++i) {
            uint64_t b = 0;
            tensor_extent(&s, t[i], &b);
            bytes[i] = (size_t)b;
            first[i] = (unsigned char *)malloc(bytes[i] + 1);
            memcpy(first[i], s.t[t[i]].data, bytes[i]);
        }
        setup_poison(&s, 1);
        CALL(w->id, "private backward (repeat)", fmha_bwd_launcher_run(launcher, s.ba, stream));
    }
    /* destroyed while the (last) run is still queued */
    CALL(w->id, "private backward", fmha_bwd_launcher_destroy(launcher));
    launcher = NULL;
    CALL(w->id, "private backward", wait_for(w, &stream, private_stream));
    check(w, &s, 1, "private-launcher backward");
    if (s.det)
        for (i = 0; i < 3; ++i)
            if (memcmp(first[i], s.t[t[i]].data, bytes[i]) != 0) {
                char d[200];
                fail(w->id, "private deterministic backward (%s): %s differs bitwise between two runs", describe(&s, d, sizeof d),
                     tensor_names[t[i]]);
                break;
            }
out:
    if (helper) fmha_bwd_launcher_destroy(helper);
    if (launcher) fmha_bwd_launcher_destroy(launcher);
    if (stream) fmha_stream_synchronize(stream);
    if (private_stream && stream) fmha_stream_destroy(stream);
    fmha_device_free(ws);
    for (i = 0; i < 3; ++i) free(first[i]);
    setup_free(&s);
}

static void op_releaser(worker *w) {
    fmha_pinned_releaser *mine = NULL;
    int i, n = rng_int(&w->rng, 4, 32);
    CALL(w->id, "releaser", fmha_pinned_releaser_create(&counted_allocator, &mine));
    for (i = 0; i < n; ++i) {
        void *p = NULL;
        int target = rng_int(&w->rng, 0, 2);
        CALL(w->id, "releaser", fmha_host_malloc_pinned(&p, (size_t)rng_int(&w->rng, 1, 4096)));
        if (target == 0) {
            CALL(w->id, "releaser (default)", fmha_pinned_releaser_release(NULL, p));
        } else if (target == 1) {
            CALL(w->id, "releaser (private)", fmha_pinned_releaser_release(mine, p));
            atomic_fetch_add(&counted_releases, 1);
        } else {
            /* no coordination with the swapper: OK frees p exactly once; INVALID_ARGUMENT (destroyed)
             * leaves it to us */
            fmha_pinned_releaser *rel = atomic_load(&shared_releaser);
            fmha_status st;
            if (rng_chance(&w->rng, 25)) usleep((useconds_t)rng_int(&w->rng, 0, 6000)); /* the swapper may destroy it meanwhile */
            st = fmha_pinned_releaser_release(rel, p);
            if (st == FMHA_OK) {
                atomic_fetch_add(&counted_releases, 1);
            } else if (st == FMHA_ERR_INVALID_ARGUMENT) {
                atomic_fetch_add(&refused_releases, 1);
                fmha_host_free_pinned(p);
            } else {
                char m[300];
                fail(w->id, "release on the shared releaser: %d (%s): %s", (int)st, fmha_status_string(st), msg(m, sizeof m));
                fmha_host_free_pinned(p);
            }
        }
    }
out:
    if (mine) {
        fmha_status st = fmha_pinned_releaser_destroy(mine);
        if (st != FMHA_OK) fail(w->id, "releaser destroy: %d", (int)st);
    }
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    while (!atomic_load(&stop_all)) {
        int op = rng_int(&w->rng, 0, 9);
        if (op < 3) op_forward(w), w->ops[0]++;
        else if (op < 5) op_shared_backward(w), w->ops[1]++;
        else if (op < 8) op_private_backward(w), w->ops[2]++;
        else op_releaser(w), w->ops[3]++;
    }
    return NULL;
}

/* Replaces the shared releaser every few milliseconds: the old one is destroyed while releases on it
 * may be in flight or about to start. */
static void *swapper_main(void *arg) {
    long *swaps = (long *)arg;
    while (!atomic_load(&stop_all)) {
        fmha_pinned_releaser *fresh = NULL, *old;
        fmha_status st;
        if (fmha_pinned_releaser_create(&counted_allocator, &fresh) != FMHA_OK) {
            char m[300];
            fail(-1, "shared releaser create: %s", msg(m, sizeof m));
            break;
        }
        old = atomic_exchange(&shared_releaser, fresh);
        st = fmha_pinned_releaser_destroy(old);
        if (st != FMHA_OK) fail(-1, "shared releaser destroy: %d", (int)st);
        ++*swaps;
        usleep(3000);
    }
    return NULL;
}

/* Calls fmha_device_synchronize every few hundred microseconds (any thread may, at any time). */
static void *device_sync_main(void *arg) {
    long *calls = (long *)arg;
    while (!atomic_load(&stop_all)) {
        fmha_status st = fmha_device_synchronize();
        if (st != FMHA_OK) {
            char m[300];
            fail(-2, "fmha_device_synchronize: %d (%s): %s", (int)st, fmha_status_string(st), msg(m, sizeof m));
        }
        ++*calls;
        usleep(300);
    }
    return NULL;
}

int soak_main(double seconds, int threads, uint64_t seed) {
    static worker workers[64];
    pthread_t ids[64], swapper, syncer;
    long sync_calls = 0;
    uint64_t rng = rng_mix(seed, 777);
    long totals[4] = {0, 0, 0, 0}, swaps = 0;
    double t0 = soak_now();
    int i;
    fmha_pinned_releaser *first = NULL;
    if (threads > 64) threads = 64;
    printf("soak: %d worker threads (+ a releaser swapper and a device-synchronize thread) for %.0f s (seed %llu)\n", threads,
           seconds, (unsigned long long)seed);
    fflush(stdout);
    if (!shared_setup(&rng)) return CHILD_EXIT_FAILED;
    if (fmha_pinned_releaser_create(&counted_allocator, &first) != FMHA_OK) return CHILD_EXIT_FAILED;
    atomic_store(&shared_releaser, first);
    for (i = 0; i < threads; ++i) {
        workers[i].id = i;
        workers[i].rng = rng_mix(seed, 5000 + (uint64_t)i);
        pthread_create(&ids[i], NULL, worker_main, &workers[i]);
    }
    pthread_create(&swapper, NULL, swapper_main, &swaps);
    pthread_create(&syncer, NULL, device_sync_main, &sync_calls);
    while (soak_now() - t0 < seconds) usleep(20000);
    atomic_store(&stop_all, 1);
    for (i = 0; i < threads; ++i) pthread_join(ids[i], NULL);
    pthread_join(swapper, NULL);
    pthread_join(syncer, NULL);
    if (fmha_pinned_releaser_destroy(atomic_load(&shared_releaser)) != FMHA_OK) fail(-1, "last shared releaser destroy failed");
    for (i = 0; i < 4; ++i) {
        fmha_bwd_launcher_destroy(configs[i].launcher);
    }
    if (fmha_device_synchronize() != FMHA_OK) fail(-1, "final fmha_device_synchronize failed");
    for (i = 0; i < 4; ++i) fmha_device_free(configs[i].ws);
    fmha_stream_destroy(shared_streams[0]);
    fmha_stream_destroy(shared_streams[1]);
    for (i = 0; i < threads; ++i) {
        int k;
        for (k = 0; k < 4; ++k) totals[k] += workers[i].ops[k];
    }
    {
        /* staging buffers go back through the library's releaser thread: give it a moment */
        double until = soak_now() + 5.0;
        while (atomic_load(&staging_frees) != atomic_load(&staging_allocs) && soak_now() < until) usleep(10000);
        if (atomic_load(&staging_frees) != atomic_load(&staging_allocs))
            fail(-1, "the caller allocator of prepare_workspace_async allocated %ld staging buffers, %ld were freed",
                 atomic_load(&staging_allocs), atomic_load(&staging_frees));
    }
    if (atomic_load(&counted_frees) != atomic_load(&counted_releases))
        fail(-1, "releasers freed %ld buffers with the counted allocator, %ld were released (each must be freed exactly once)",
             atomic_load(&counted_frees), atomic_load(&counted_releases));
    printf("soak: %ld forward, %ld shared-launcher backward, %ld private-launcher backward, %ld releaser ops; %ld counted "
           "releases, %ld refused by a destroyed shared releaser, %ld shared-releaser swaps, %ld caller-allocated staging "
           "buffers, %ld device synchronizations by the sync thread; %ld failures in %.1f s\n",
           totals[0], totals[1], totals[2], totals[3], atomic_load(&counted_releases), atomic_load(&refused_releases), swaps,
           atomic_load(&staging_allocs), sync_calls, atomic_load(&failures),
           soak_now() - t0);
    fflush(stdout);
    return atomic_load(&failures) == 0 ? 0 : CHILD_EXIT_FAILED;
}

/* ---- exit under load ----------------------------------------------------------------------------- */

typedef struct {
    int id;
    uint64_t rng;
} hammer;

static atomic_long hammer_calls;

static void *hammer_main(void *arg) {
    hammer *h = (hammer *)arg;
    setup s;
    fmha_stream_t stream = NULL;
    fmha_pinned_releaser *rel = NULL;
    random_shape(&s, &h->rng, 1);
    setup_default_layout(&s);
    setup_alloc(&s, &h->rng);
    fmha_stream_create(&stream);
    for (;;) {
        fmha_bwd_launcher *launcher = NULL;
        size_t ws_size = 0;
        void *ws = NULL, *p = NULL;
        int k;
        fmha_fwd(s.ft, s.fa, stream);
        atomic_fetch_add(&hammer_calls, 1);
        if (fmha_bwd_launcher_create(s.bt, &launcher) == FMHA_OK && fmha_bwd_launcher_workspace_size(launcher, &ws_size) == FMHA_OK &&
            fmha_device_malloc(&ws, ws_size) == FMHA_OK) {
            /* the workspace is never freed: queued work may use it until the process is gone */
            s.ba->workspace = ws;
            fmha_bwd_launcher_prepare_workspace_async(launcher, ws, ws_size, s.group ? s.ssq : NULL, s.group ? s.ssk : NULL, stream,
                                                      rng_chance(&h->rng, 50) ? &staging_allocator : NULL, FMHA_PREPARE_HOST);
            fmha_bwd_launcher_run(launcher, s.ba, stream);
        }
        if (launcher) fmha_bwd_launcher_destroy(launcher);
        if (rel == NULL) fmha_pinned_releaser_create(&counted_allocator, &rel);
        for (k = 0; k < 4; ++k) {
            if (fmha_host_malloc_pinned(&p, 256) == FMHA_OK) fmha_pinned_releaser_release(k & 1 ? rel : NULL, p);
        }
        if (rng_chance(&h->rng, 20)) {
            fmha_pinned_releaser_destroy(rel);
            rel = NULL;
        }
        if (rng_chance(&h->rng, 30)) fmha_stream_synchronize(stream);
    }
    return NULL;
}

void exit_load_child(int threads, int delay_ms, uint64_t seed) {
    static hammer hammers[32];
    pthread_t id;
    int i;
    if (threads > 32) threads = 32;
    for (i = 0; i < threads; ++i) {
        hammers[i].id = i;
        hammers[i].rng = rng_mix(seed, (uint64_t)i);
        pthread_create(&id, NULL, hammer_main, &hammers[i]);
    }
    usleep((useconds_t)delay_ms * 1000u);
    printf("exit under load: %d threads, exit(0) after %d ms with %ld iterations issued\n", threads, delay_ms,
           atomic_load(&hammer_calls));
    exit(0);
}

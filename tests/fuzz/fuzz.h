/*
 * fmha_fuzz: a fuzz harness for fmha's C ABI (see README.md in this directory).
 *
 * Shared declarations of the harness's translation units:
 *
 *   fuzz_main.c    command line, the fork-per-case driver and judge, the summary
 *   fuzz_guard.c   guard-paged buffers (mmap + PROT_NONE) and the fault classifier (SIGSEGV/SIGBUS)
 *   fuzz_setup.c   a valid attention problem (tensors, structs, launcher) and its float64 check
 *   fuzz_cases.c   the targeted cases: one forbidden field each, plus valid layouts that must work
 *   fuzz_kvcache.c the targeted cases of the kv-cache operation and of the merge
 *   fuzz_random.c  random cases and the cheap "does the header allow this call" classifier
 *   fuzz_soak.c    the 16-thread soak and the exit-under-load test
 */
#ifndef FMHA_FUZZ_H
#define FMHA_FUZZ_H

#include <fmha.h>

#include <stddef.h>
#include <stdint.h>

/* ---- exit codes of a case child ---------------------------------------------------------------- */
#define CHILD_EXIT_DONE 0
#define CHILD_EXIT_OOB 42   /* SIGSEGV/SIGBUS inside a guard page */
#define CHILD_EXIT_CRASH 43 /* SIGSEGV/SIGBUS elsewhere */
#define CHILD_EXIT_FAILED 44 /* soak / exit-load: the checks failed (details on the pipe) */
#define CHILD_EXIT_VALGRIND 99 /* valgrind --error-exitcode=99: a memory error */

/* ---- what a case expects ------------------------------------------------------------------------- */
enum expect {
    EXPECT_ERROR = 0, /* forbidden input: non-OK status whose message names one of `fields` */
    EXPECT_OK = 1,    /* valid input: OK status and correct results */
    EXPECT_ANY = 2,   /* random: any status; OK on a call known to be forbidden is a silent accept */
};

/* The record a case child writes to its result pipe (twice or more: the latest complete one counts).
 * Smaller than PIPE_BUF, so every write is atomic. */
typedef struct {
    int32_t phase;     /* 0 described, 1 judged call returned, 2 finished */
    int32_t expect;    /* enum expect */
    int32_t status;    /* status of the judged call (phase >= 1) */
    int32_t correct;   /* EXPECT_OK / random valid: 1 results correct, 0 wrong, -1 not checked */
    int32_t forbidden; /* EXPECT_ANY: 1 forbidden by the header, 0 allowed, -1 undecided */
    uint32_t statuses; /* EXPECT_ERROR: bit s set = status s acceptable (0 = any non-OK) */
    char fields[96];   /* '|'-separated names, one of which the message must contain */
    char desc[360];    /* what the case does */
    char message[1200]; /* fmha_last_error_message of the judged call */
    char note[1200];    /* anything else (later statuses, result errors) */
} case_record;

#define STATUS_BIT(s) (1u << (unsigned)(s))

/* ---- guard pages (fuzz_guard.c) ------------------------------------------------------------------ */

/* `size` bytes placed flush against a trailing PROT_NONE page (a leading one sits before the mapping),
 * start aligned down to `align` (so up to align-1 bytes of slack when size is not a multiple). Size 0
 * returns the first byte of the trailing guard page. Aborts the child on mmap failure. */
void *gp_alloc(size_t size, size_t align, const char *name);
/* gp_alloc filled with `byte`. */
void *gp_alloc_fill(size_t size, size_t align, const char *name, int byte);
/* Unmaps a buffer from gp_alloc (its guard pages too) and forgets it. */
void gp_free(void *ptr);
/* Installs the SIGSEGV/SIGBUS classifier (guard page -> exit CHILD_EXIT_OOB, else CHILD_EXIT_CRASH),
 * printing the fault to stderr first. Call in every child. */
void guard_install(void);
/* Forgets every guard range (a fresh child). */
void guard_reset(void);

/* ---- random numbers ------------------------------------------------------------------------------ */
uint64_t rng_next(uint64_t *state);
uint64_t rng_mix(uint64_t seed, uint64_t index); /* a case's seed from the run's seed and its index */
int rng_int(uint64_t *state, int lo, int hi);    /* uniform in [lo, hi] */
int rng_chance(uint64_t *state, int percent);

/* ---- a valid problem (fuzz_setup.c) -------------------------------------------------------------- */
enum { TQ, TK, TV, TO, TLSE, TDO, TD, TDQ, TDK, TDV, NT };
extern const char *const tensor_names[NT];

/* Where a tensor lives: buffer index (>= 0), or BUF_NULL (data = NULL), or BUF_RAW (data = raw). */
#define BUF_NULL (-1)
#define BUF_RAW (-2)
#define MAX_BUFFERS 12

typedef struct {
    int buf;
    size_t offset; /* bytes from the buffer's start */
    int64_t batch_stride, head_stride, row_stride;
    uintptr_t raw;
} tensor_plan;

typedef struct {
    /* shape */
    int op_bwd; /* 0 forward only, 1 forward then backward */
    int group, det, dtype, mask, wl, wr;
    int batch, hq, hk, dq, dv;
    int sq, sk;         /* batch mode: per batch; group mode: totals */
    int max_sq, max_sk; /* group mode bounds (batch mode: sq, sk) */
    float scale;
    int32_t lens_q[16], lens_k[16]; /* group mode physical lengths (batch <= 16) */
    /* layout */
    tensor_plan plan[NT];
    int nbuf;
    /* allocated */
    unsigned char *bufs[MAX_BUFFERS];
    size_t buf_bytes[MAX_BUFFERS];
    int32_t *ssq, *ssk; /* seqstarts [batch + 1] (guard-paged; host and "device" copies alike) */
    fmha_tensor t[NT];
    fmha_fwd_traits *ft;
    fmha_fwd_args *fa;
    fmha_bwd_traits *bt;
    fmha_bwd_args *ba;
    fmha_bwd_launcher *launcher;
    void *ws;
    size_t ws_size;
    fmha_stream_t stream;
} setup;

/* Element bytes, heads, rows and columns of tensor `i` in `s`. */
int tensor_elem_bytes(const setup *s, int i);
int tensor_heads(const setup *s, int i);
int tensor_rows(const setup *s, int i);
int tensor_cols(const setup *s, int i);
/* Byte extent of tensor `i` under the header's rules: 0 if an extent is 0; -1 if it is >= 2^63 bytes
 * or a stride is negative (then *bytes is unchanged). Group mode ignores batch_stride. */
int tensor_extent(const setup *s, int i, uint64_t *bytes);

/* A default valid configuration (see fuzz_setup.c), in s (zeroed first). */
void setup_default(setup *s, int op_bwd, int group, int det);
/* Default layouts: every tensor in its own buffer, BSHD (THD in group mode); lse/d [b][h][s]. */
void setup_default_layout(setup *s);
/* Allocates the buffers (sized from the plans), the seqstarts and the structs, fills inputs with
 * random values, poisons outputs with NaN, and fills the structs with valid values. */
void setup_alloc(setup *s, uint64_t *rng);
/* Unmaps everything setup_alloc mapped. */
void setup_free(setup *s);
/* Refreshes s->t[] from the plans and buffers and copies them into fa/ba. */
void setup_sync_tensors(setup *s);
/* Poisons the outputs of the forward (o, lse) or of the backward (d, dq, dk, dv) with NaN bytes. */
void setup_poison(setup *s, int backward);
/* The bytes of tensor i's elements that no longer hold the NaN poison of setup_poison (0 = the tensor
 * was left unwritten; tensors outside their buffers count 0). */
long setup_written(const setup *s, int i);
/* Runs the forward with s->ft/s->fa on s->stream and synchronizes; returns the first non-OK status. */
fmha_status setup_run_forward(setup *s);
/* Checks the forward's O and LSE (and with `backward` dQ/dK/dV) against attention_reference.h.
 * Returns 1 if correct, 0 if wrong (reason in note), -1 if not checkable (windows, hdim_q != hdim_v). */
int setup_check(const setup *s, int backward, char *note, size_t note_size);
/* Copies the last error message of this thread into buf. */
void last_message(char *buf, size_t size);

/* ---- cases (fuzz_cases.c, fuzz_random.c) --------------------------------------------------------- */
int targeted_count(void);
int targeted_heavy(int index);
int targeted_always_sampled(int index);
/* Set by --light (the valgrind sample): slow cases do fewer rounds. */
extern int fuzz_light;
/* Set by --no-mutate: random cases are valid problems only (checks the classifier and the results). */
extern int fuzz_no_mutate;
void targeted_run(int index, uint64_t seed, case_record *rec);
void random_run(uint64_t seed, case_record *rec);
/* The kv-cache and merge cases (fuzz_kvcache.c), appended to the targeted table by fuzz_cases.c. */
int kv_case_count(void);
void kv_case_info(int i, int *expect, uint32_t *statuses, int *sampled, const char **fields, const char **desc);
void kv_case_run(int i, uint64_t rng, case_record *rec);
/* A random kv-cache case (fuzz_random.c draws one in 8 of its cases). */
void kv_random_run(uint64_t seed, case_record *rec);
/* Writes the record to the result pipe (fd set by the driver in the child). */
void report(const case_record *rec);
extern int report_fd;

/* snprintf-append to a fixed buffer. */
void appendf(char *buf, size_t size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- soak and exit under load (fuzz_soak.c) ------------------------------------------------------ */
/* Runs in a child; returns the child's exit code (0 = all checks passed); details on stdout. */
int soak_main(double seconds, int threads, uint64_t seed);
/* The child of one exit-under-load trial: starts threads hammering async work and calls exit(0)
 * after `delay_ms`. Never returns. */
void exit_load_child(int threads, int delay_ms, uint64_t seed);

#endif /* FMHA_FUZZ_H */

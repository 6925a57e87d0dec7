/*
 * Guard-paged buffers and the fault classifier.
 *
 * Every buffer a case hands to the library (tensors, seqstarts, workspace, argument structs) is an
 * mmap of PROT_NONE | data pages | PROT_NONE, with the data placed flush against the trailing guard
 * page. A SIGSEGV/SIGBUS whose address lies in one of those guard pages is an out-of-bounds access of
 * the library ("oob"); any other fault is a "crash".
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_GUARDED 1024

typedef struct {
    uintptr_t map;       /* mapping start (leading guard page) */
    size_t map_bytes;    /* whole mapping */
    uintptr_t data;      /* what gp_alloc returned */
    size_t size;         /* bytes asked for */
    uintptr_t tail;      /* trailing guard page */
    char name[24];
} guarded;

static guarded table[MAX_GUARDED];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int table_used;
static size_t page_size;

void guard_reset(void) {
    table_used = 0;
}

static size_t page(void) {
    if (page_size == 0) page_size = (size_t)sysconf(_SC_PAGESIZE);
    return page_size;
}

void *gp_alloc(size_t size, size_t align, const char *name) {
    size_t p = page(), data_pages, slot;
    unsigned char *map;
    uintptr_t end, data;
    if (align == 0) align = 1;
    data_pages = (size + align + p - 1) / p;
    if (data_pages == 0) data_pages = 1;
    map = (unsigned char *)mmap(NULL, (data_pages + 2) * p, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "gp_alloc(%zu, %s): mmap failed\n", size, name);
        abort();
    }
    if (mprotect(map + p, data_pages * p, PROT_READ | PROT_WRITE) != 0) {
        fprintf(stderr, "gp_alloc(%zu, %s): mprotect failed\n", size, name);
        abort();
    }
    end = (uintptr_t)(map + p + data_pages * p);
    data = (end - size) & ~(uintptr_t)(align - 1);
    pthread_mutex_lock(&table_lock);
    for (slot = 0; slot < (size_t)table_used; ++slot)
        if (table[slot].map == 0) break;
    if (slot < MAX_GUARDED) {
        guarded *g = &table[slot];
        g->map = (uintptr_t)map;
        g->map_bytes = (data_pages + 2) * p;
        g->data = data;
        g->size = size;
        g->tail = end;
        snprintf(g->name, sizeof g->name, "%s", name ? name : "?");
        if ((int)slot >= table_used) table_used = (int)slot + 1;
    }
    pthread_mutex_unlock(&table_lock);
    return (void *)data;
}

void *gp_alloc_fill(size_t size, size_t align, const char *name, int byte) {
    void *ptr = gp_alloc(size, align, name);
    memset(ptr, byte, size);
    return ptr;
}

void gp_free(void *ptr) {
    int i;
    if (ptr == NULL) return;
    pthread_mutex_lock(&table_lock);
    for (i = 0; i < table_used; ++i) {
        if (table[i].map != 0 && table[i].data == (uintptr_t)ptr) {
            uintptr_t map = table[i].map;
            size_t bytes = table[i].map_bytes;
            table[i].map = 0;
            pthread_mutex_unlock(&table_lock);
            munmap((void *)map, bytes);
            return;
        }
    }
    pthread_mutex_unlock(&table_lock);
}

/* --- async-signal-safe formatting --------------------------------------------------------------- */

static size_t put_str(char *out, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) out[at++] = *s++;
    return at;
}

static size_t put_hex(char *out, size_t at, size_t cap, uintptr_t v) {
    char digits[2 + 2 * sizeof v];
    int n = 0, i;
    do {
        digits[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v && n < (int)sizeof digits);
    at = put_str(out, at, cap, "0x");
    for (i = n - 1; i >= 0 && at + 1 < cap; --i) out[at++] = digits[i];
    return at;
}

static size_t put_dec(char *out, size_t at, size_t cap, uintptr_t v) {
    char digits[24];
    int n = 0, i;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < (int)sizeof digits);
    for (i = n - 1; i >= 0 && at + 1 < cap; --i) out[at++] = digits[i];
    return at;
}

static void on_fault(int sig, siginfo_t *info, void *context) {
    uintptr_t addr = (uintptr_t)info->si_addr;
    size_t p = page(), at = 0;
    char line[256];
    int i, hit = -1, leading = 0;
    (void)context;
    for (i = 0; i < table_used; ++i) {
        const guarded *g = &table[i];
        if (g->map == 0) continue;
        if (addr >= g->tail && addr < g->tail + p) {
            hit = i;
            break;
        }
        if (addr >= g->map && addr < g->map + p) {
            hit = i;
            leading = 1;
            break;
        }
    }
    at = put_str(line, at, sizeof line, sig == SIGBUS ? "FAULT: SIGBUS at " : "FAULT: SIGSEGV at ");
    at = put_hex(line, at, sizeof line, addr);
    if (hit >= 0) {
        const guarded *g = &table[hit];
        if (leading) {
            at = put_str(line, at, sizeof line, ", in the leading guard page of '");
            at = put_str(line, at, sizeof line, g->name);
            at = put_str(line, at, sizeof line, "' (");
            at = put_dec(line, at, sizeof line, g->data - addr);
            at = put_str(line, at, sizeof line, " bytes before its start)");
        } else {
            at = put_str(line, at, sizeof line, ", in the trailing guard page of '");
            at = put_str(line, at, sizeof line, g->name);
            at = put_str(line, at, sizeof line, "' (byte ");
            at = put_dec(line, at, sizeof line, addr - g->data);
            at = put_str(line, at, sizeof line, " of a ");
            at = put_dec(line, at, sizeof line, g->size);
            at = put_str(line, at, sizeof line, "-byte buffer)");
        }
    } else {
        at = put_str(line, at, sizeof line, ", not in a guard page");
    }
    at = put_str(line, at, sizeof line, "\n");
    if (write(2, line, at) < 0) {
        /* nothing to do */
    }
    _exit(hit >= 0 ? CHILD_EXIT_OOB : CHILD_EXIT_CRASH);
}

void guard_install(void) {
    static unsigned char alt_stack[1 << 16];
    struct sigaction action;
    stack_t stack;
    stack.ss_sp = alt_stack;
    stack.ss_size = sizeof alt_stack;
    stack.ss_flags = 0;
    sigaltstack(&stack, NULL);
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, NULL);
    sigaction(SIGBUS, &action, NULL);
}

/* --- random numbers ------------------------------------------------------------------------------ */

uint64_t rng_next(uint64_t *state) {
    /* splitmix64 */
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t rng_mix(uint64_t seed, uint64_t index) {
    uint64_t state = seed ^ (index * 0xD1B54A32D192ED03ull);
    rng_next(&state);
    return rng_next(&state);
}

int rng_int(uint64_t *state, int lo, int hi) {
    uint64_t span = (uint64_t)((int64_t)hi - (int64_t)lo + 1);
    return (int)((int64_t)lo + (int64_t)(rng_next(state) % span));
}

int rng_chance(uint64_t *state, int percent) {
    return (int)(rng_next(state) % 100) < percent;
}

/*
 * fmha_fuzz: the driver. Every case runs in a forked child; the parent (which never calls fmha, so
 * that every child starts from a fresh library) collects the child's result record, its stderr and
 * its exit status, and judges:
 *
 *   clean          the expected outcome (forbidden input: non-OK status naming the field; valid
 *                  input: OK and correct results; random: anything but the failures below)
 *   silent-accept  FMHA_OK for an input the header forbids
 *   crash          abort or any signal, a fault outside guard pages, an unexpected exit code
 *   oob            a fault inside a guard page, or a valgrind error (exit code 99)
 *   hang           the per-case timeout (alarm in the child, SIGKILL from the parent)
 *   unnamed        non-OK, but the message does not name the field (reported, not a failure)
 *   wrong          a valid input rejected, wrong/lost results, or a status other than the one required
 *
 * Usage: fmha_fuzz [all|cases|soak|exit-load] [options]   (see usage())
 */
#define _GNU_SOURCE
#include "fuzz.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int report_fd = -1;
int fuzz_light = 0;
int fuzz_no_mutate = 0;

void report(const case_record *rec) {
    if (report_fd >= 0) {
        ssize_t n = write(report_fd, rec, sizeof *rec);
        (void)n;
    }
}

enum verdict { V_CLEAN, V_SILENT, V_CRASH, V_OOB, V_HANG, V_UNNAMED, V_WRONG, V_COUNT };
static const char *const verdict_names[V_COUNT] = {"clean", "silent-accept", "crash", "oob", "hang", "unnamed", "wrong"};

typedef struct {
    /* options */
    const char *mode;
    uint64_t seed;
    long max_cases;      /* -1: no limit */
    double seconds;      /* budget of the cases part */
    int jobs;
    int timeout;         /* per case, seconds */
    long only_case;      /* -1: all */
    int no_fork;
    long sample;         /* > 0: a sample of this many cases */
    double soak_seconds;
    int soak_threads;
    int exit_repeats;
    int verbose;
    int random_only;
    const char *argv0;
    /* results */
    long counts[V_COUNT];
    long run;
    long random_valid_rejected;
    long random_forbidden, random_allowed;
    int soak_failed, soak_ran;
    int exit_failed, exit_ran;
} options;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- fields in messages -------------------------------------------------------------------------- */

static int ident(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Whether `message` names one of the '|'-separated `fields` as a token (not part of a longer
 * identifier: "q" matches "q.data" and "q:" but not "seqstart_q"). */
static int names_field(const char *message, const char *fields) {
    char copy[128], *save = NULL, *name;
    if (fields[0] == 0) return 1;
    snprintf(copy, sizeof copy, "%s", fields);
    for (name = strtok_r(copy, "|", &save); name; name = strtok_r(NULL, "|", &save)) {
        size_t n = strlen(name);
        const char *at = message;
        while ((at = strstr(at, name)) != NULL) {
            char before = at == message ? ' ' : at[-1], after = at[n];
            if (!ident(before) && before != '.' && !ident(after)) return 1;
            ++at;
        }
    }
    return 0;
}

/* ---- one child ----------------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    long index;
    int res_fd, err_fd;
    double deadline;
    int killed;
    unsigned char partial[sizeof(case_record)];
    size_t partial_len;
    case_record rec;
    int have_rec;
    char err[3000];
    size_t err_len;
    int res_open, err_open;
    int exited;
    int status;
} job;

static void child_run_case(const options *o, long index) {
    case_record rec;
    long targeted = targeted_count();
    memset(&rec, 0, sizeof rec);
    guard_reset();
    guard_install();
    alarm((unsigned)o->timeout);
    if (index < targeted) targeted_run((int)index, o->seed, &rec);
    else random_run(rng_mix(o->seed, (uint64_t)index), &rec);
}

/* ---- judging ------------------------------------------------------------------------------------- */

/* Random failures are many and alike: they are grouped by verdict, the field the classifier blamed
 * and the judged call (or the failing step); the first few of each group are printed in full. */
#define MAX_GROUPS 400
#define PRINT_PER_GROUP 3
typedef struct {
    int verdict;
    char key[200];
    long count;
    long first_case;
} group;
static group groups[MAX_GROUPS];
static int ngroups;

static int group_of(int v, const case_record *r, const char *why, long index) {
    char key[200], call[80] = "", reason[100] = "allowed by the classifier";
    const char *j = strstr(r->note, "judged: "), *c = strstr(r->note, "classifier: ");
    int i;
    if (j) {
        size_t n = strcspn(j + 8, ";");
        snprintf(call, sizeof call, "%.*s", (int)(n < 79 ? n : 79), j + 8);
    }
    if (c && (c = strchr(c, '(')) != NULL) {
        size_t n = strcspn(c + 1, ")");
        snprintf(reason, sizeof reason, "%.*s", (int)(n < 99 ? n : 99), c + 1);
    }
    snprintf(key, sizeof key, "%s | %s | %s", call[0] ? call : "-", reason, why);
    for (i = 0; i < ngroups; ++i)
        if (groups[i].verdict == v && strcmp(groups[i].key, key) == 0) return ++groups[i].count > PRINT_PER_GROUP ? 0 : 1;
    if (ngroups < MAX_GROUPS) {
        groups[ngroups].verdict = v;
        snprintf(groups[ngroups].key, sizeof groups[ngroups].key, "%s", key);
        groups[ngroups].count = 1;
        groups[ngroups].first_case = index;
        ngroups++;
    }
    return 1;
}

static void print_groups(void) {
    int i, any = 0;
    for (i = 0; i < ngroups; ++i) {
        if (!any) printf("random-case failures by group (verdict: count | judged call | the classifier's reason | outcome; first case):\n");
        any = 1;
        printf("  %s: %ld | %s; first case %ld\n", verdict_names[groups[i].verdict], groups[i].count, groups[i].key, groups[i].first_case);
    }
}

static void print_detail(const options *o, const job *j, int v, const char *why) {
    const case_record *r = &j->rec;
    printf("[%s] case %ld: %s\n", verdict_names[v], j->index, j->have_rec ? r->desc : "(no record: the child died before describing the case)");
    if (why && why[0]) printf("    outcome: %s\n", why);
    if (j->have_rec) {
        if (r->fields[0]) printf("    field:   %s\n", r->fields);
        if (r->phase >= 1)
            printf("    status:  %d (%s)\n", (int)r->status, fmha_status_string(r->status));
        if (r->message[0]) printf("    message: %s\n", r->message);
        if (r->note[0]) printf("    note:    %s\n", r->note);
    }
    if (j->err_len > 0) {
        const char *e = j->err;
        printf("    stderr:  ");
        for (; *e; ++e) {
            putchar(*e);
            if (*e == '\n' && e[1]) printf("             ");
        }
        if (j->err[j->err_len - 1] != '\n') putchar('\n');
    }
    printf("    repro:   %s cases --seed %llu --case %ld%s\n", o->argv0, (unsigned long long)o->seed, j->index,
           fuzz_light ? " --light" : "");
}

static void judge(options *o, job *j) {
    const case_record *r = &j->rec;
    char why[400] = "";
    int v = V_CLEAN;
    int finished = j->have_rec && r->phase >= 2;
    if (j->killed) {
        v = V_HANG;
        snprintf(why, sizeof why, "no exit within %d s (+5): killed", o->timeout);
    } else if (WIFSIGNALED(j->status)) {
        int sig = WTERMSIG(j->status);
        v = sig == SIGALRM ? V_HANG : V_CRASH;
        snprintf(why, sizeof why, "%s (signal %d: %s)", sig == SIGALRM ? "timeout (alarm)" : sig == SIGABRT ? "abort" : "killed by a signal",
                 sig, strsignal(sig));
    } else if (WIFEXITED(j->status) && WEXITSTATUS(j->status) != CHILD_EXIT_DONE) {
        int code = WEXITSTATUS(j->status);
        if (code == CHILD_EXIT_OOB) {
            v = V_OOB;
            snprintf(why, sizeof why, "fault in a guard page (exit %d)", code);
        } else if (code == CHILD_EXIT_VALGRIND) {
            /* a fault the handler classified (its line is in stderr), or an invalid access valgrind saw */
            if (strstr(j->err, "FAULT:") && strstr(j->err, "not in a guard page")) {
                v = V_CRASH;
                snprintf(why, sizeof why, "valgrind reported an invalid access, then a fault outside the guard pages (exit 99)");
            } else {
                v = V_OOB;
                snprintf(why, sizeof why, "valgrind reported a memory error (exit 99)");
            }
        } else if (code == CHILD_EXIT_CRASH) {
            v = V_CRASH;
            snprintf(why, sizeof why, "fault outside the guard pages (exit %d)", code);
        } else {
            v = V_CRASH;
            snprintf(why, sizeof why, "unexpected exit code %d", code);
        }
    } else if (!finished) {
        v = V_CRASH;
        snprintf(why, sizeof why, "exited 0 without finishing the case");
    }
    if (v != V_CLEAN && j->have_rec && r->phase >= 1 && r->status == FMHA_OK && r->expect == EXPECT_ERROR)
        appendf(why, sizeof why, "; the judged call had returned FMHA_OK (silently accepted) before that");
    if (v == V_CLEAN) {
        if (r->correct == 0) {
            v = V_WRONG;
            snprintf(why, sizeof why, "%s", r->status == FMHA_OK ? "wrong or lost results" : "a valid step failed, or a check after the judged call (see note)");
        } else if (r->expect == EXPECT_ERROR) {
            if (r->status == FMHA_OK) {
                v = V_SILENT;
                snprintf(why, sizeof why, "FMHA_OK for a forbidden input");
            } else if (r->statuses && !(r->statuses & STATUS_BIT(r->status))) {
                v = V_WRONG;
                snprintf(why, sizeof why, "status %d (%s) is not the required one", (int)r->status, fmha_status_string(r->status));
            } else if (!names_field(r->message, r->fields)) {
                v = V_UNNAMED;
                snprintf(why, sizeof why, "non-OK, but the message does not name %s", r->fields);
            }
        } else if (r->expect == EXPECT_OK) {
            if (r->status != FMHA_OK) {
                v = V_WRONG;
                snprintf(why, sizeof why, "a valid input was rejected");
            }
        } else {
            if (r->forbidden == 1) o->random_forbidden++;
            else if (r->forbidden == 0) o->random_allowed++;
            if (r->status == FMHA_OK && r->forbidden == 1) {
                v = V_SILENT;
                snprintf(why, sizeof why, "FMHA_OK for a call the header forbids (%s)", r->fields);
            } else if (r->status != FMHA_OK && r->statuses && !(r->statuses & STATUS_BIT(r->status))) {
                v = V_WRONG;
                snprintf(why, sizeof why, "status %d (%s) is not the required one", (int)r->status, fmha_status_string(r->status));
            } else if (r->status != FMHA_OK && r->forbidden == 0) {
                o->random_valid_rejected++;
                if (o->verbose) print_detail(o, j, V_CLEAN, "random call the classifier thinks valid was rejected (informational)");
            }
        }
    }
    o->counts[v]++;
    o->run++;
    if (v != V_CLEAN && v != V_UNNAMED && r->expect == EXPECT_ANY && j->have_rec && !o->verbose) {
        /* a shortened outcome keeps the groups few (addresses and counts vary) */
        char short_why[80];
        snprintf(short_why, sizeof short_why, "%s", v == V_SILENT ? "FMHA_OK" : v == V_CRASH || v == V_OOB || v == V_HANG ? verdict_names[v] : why);
        if (group_of(v, r, short_why, j->index)) print_detail(o, j, v, why);
    } else if (v != V_CLEAN || o->verbose > 1) {
        print_detail(o, j, v, why);
    }
    fflush(stdout);
}

/* ---- the loop ------------------------------------------------------------------------------------ */

static void drain(job *j, int which) {
    for (;;) {
        if (which == 0) {
            ssize_t n = read(j->res_fd, j->partial + j->partial_len, sizeof j->partial - j->partial_len);
            if (n > 0) {
                j->partial_len += (size_t)n;
                if (j->partial_len == sizeof j->partial) {
                    memcpy(&j->rec, j->partial, sizeof j->rec);
                    j->have_rec = 1;
                    j->partial_len = 0;
                }
                continue;
            }
            if (n == 0) {
                j->res_open = 0;
                close(j->res_fd);
            }
            return;
        } else {
            char buf[1024];
            ssize_t n = read(j->err_fd, buf, sizeof buf);
            if (n > 0) {
                size_t room = sizeof j->err - 1 - j->err_len, take = (size_t)n < room ? (size_t)n : room;
                memcpy(j->err + j->err_len, buf, take);
                j->err_len += take;
                j->err[j->err_len] = 0;
                continue;
            }
            if (n == 0) {
                j->err_open = 0;
                close(j->err_fd);
            }
            return;
        }
    }
}

/* Runs the cases in `list` (n of them) with up to o->jobs children at once. */
static void run_cases(options *o, const long *list, long n, double stop_at) {
    job *jobs = (job *)calloc((size_t)o->jobs, sizeof(job));
    int *busy = (int *)calloc((size_t)o->jobs, sizeof(int));
    long next = 0, running = 0;
    while ((next < n && now() < stop_at) || running > 0) {
        struct pollfd fds[64];
        int map[64], which[64], nfds = 0, k;
        for (k = 0; k < o->jobs && next < n && now() < stop_at; ++k) {
            if (busy[k]) continue;
            {
                int res[2], err[2];
                job *j = &jobs[k];
                if (pipe(res) != 0 || pipe(err) != 0) {
                    perror("pipe");
                    exit(2);
                }
                fflush(stdout);
                fflush(stderr);
                memset(j, 0, sizeof *j);
                j->index = list[next++];
                j->pid = fork();
                if (j->pid < 0) {
                    perror("fork");
                    exit(2);
                }
                if (j->pid == 0) {
                    close(res[0]);
                    close(err[0]);
                    dup2(err[1], 1);
                    dup2(err[1], 2);
                    close(err[1]);
                    report_fd = res[1];
                    child_run_case(o, j->index);
                    exit(CHILD_EXIT_DONE);
                }
                close(res[1]);
                close(err[1]);
                j->res_fd = res[0];
                j->err_fd = err[0];
                j->res_open = j->err_open = 1;
                j->deadline = now() + o->timeout + 5;
                busy[k] = 1;
                running++;
            }
        }
        for (k = 0; k < o->jobs; ++k) {
            if (!busy[k]) continue;
            if (jobs[k].res_open) {
                fds[nfds].fd = jobs[k].res_fd;
                fds[nfds].events = POLLIN;
                map[nfds] = k;
                which[nfds++] = 0;
            }
            if (jobs[k].err_open) {
                fds[nfds].fd = jobs[k].err_fd;
                fds[nfds].events = POLLIN;
                map[nfds] = k;
                which[nfds++] = 1;
            }
        }
        if (nfds > 0) {
            int ready = poll(fds, (nfds_t)nfds, 50);
            if (ready < 0 && errno != EINTR) {
                perror("poll");
                exit(2);
            }
            for (k = 0; k < nfds && ready > 0; ++k)
                if (fds[k].revents) drain(&jobs[map[k]], which[k]);
        } else {
            usleep(2000);
        }
        for (k = 0; k < o->jobs; ++k) {
            job *j = &jobs[k];
            if (!busy[k]) continue;
            if (!j->exited) {
                pid_t got = waitpid(j->pid, &j->status, WNOHANG);
                if (got == j->pid) j->exited = 1;
            }
            if (!j->exited && now() > j->deadline) {
                kill(j->pid, SIGKILL);
                waitpid(j->pid, &j->status, 0);
                j->exited = 1;
                j->killed = 1;
            }
            if (j->exited && (j->killed || (!j->res_open && !j->err_open))) {
                if (j->res_open) close(j->res_fd);
                if (j->err_open) close(j->err_fd);
                judge(o, j);
                busy[k] = 0;
                running--;
            } else if (j->exited && now() > j->deadline + 2) {
                /* a grandchild (none expected) keeps the pipes open */
                if (j->res_open) close(j->res_fd);
                if (j->err_open) close(j->err_fd);
                j->res_open = j->err_open = 0;
            }
        }
    }
    free(jobs);
    free(busy);
}

/* ---- soak and exit under load, each in a child --------------------------------------------------- */

/* Forks fn(arg) with stdout/stderr captured; waits up to `limit` seconds. Returns 0 on a clean exit,
 * 1 otherwise (with the reason and the output printed). */
typedef void (*child_fn)(const options *o, int arg);

static int run_child(const options *o, child_fn fn, int arg, double limit, const char *what, int print_output) {
    int out[2];
    pid_t pid;
    char buf[4096];
    size_t cap = 1 << 16, len = 0;
    char *text = (char *)malloc(cap);
    double deadline = now() + limit;
    int status = 0, exited = 0, killed = 0, open = 1, failed;
    if (pipe(out) != 0) return 1;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        close(out[0]);
        dup2(out[1], 1);
        dup2(out[1], 2);
        close(out[1]);
        guard_reset();
        guard_install();
        fn(o, arg);
        exit(CHILD_EXIT_CRASH); /* not reached */
    }
    close(out[1]);
    while (open || !exited) {
        struct pollfd p;
        if (open) {
            p.fd = out[0];
            p.events = POLLIN;
            if (poll(&p, 1, 50) > 0) {
                ssize_t n = read(out[0], buf, sizeof buf);
                if (n > 0) {
                    if (len + (size_t)n + 1 > cap) {
                        cap = 2 * (len + (size_t)n + 1);
                        text = (char *)realloc(text, cap);
                    }
                    memcpy(text + len, buf, (size_t)n);
                    len += (size_t)n;
                } else {
                    open = 0;
                }
            }
        } else {
            usleep(5000);
        }
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1;
        if (!exited && now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            exited = killed = 1;
        }
        if (exited && open && now() > deadline + 2) open = 0;
    }
    close(out[0]);
    text[len] = 0;
    failed = killed || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (print_output || failed) {
        if (len > 0) fputs(text, stdout);
        if (len > 0 && text[len - 1] != '\n') putchar('\n');
    }
    if (failed) {
        if (killed) printf("%s: FAILED: hang (no exit within %.0f s, killed)\n", what, limit);
        else if (WIFSIGNALED(status)) printf("%s: FAILED: crash (signal %d: %s)\n", what, WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (WEXITSTATUS(status) == CHILD_EXIT_OOB) printf("%s: FAILED: oob (fault in a guard page)\n", what);
        else if (WEXITSTATUS(status) == CHILD_EXIT_VALGRIND) printf("%s: FAILED: valgrind reported an error\n", what);
        else printf("%s: FAILED: exit status %d\n", what, WEXITSTATUS(status));
    }
    free(text);
    return failed;
}

static void soak_child(const options *o, int arg) {
    (void)arg;
    exit(soak_main(o->soak_seconds, o->soak_threads, o->seed));
}

static void exit_child(const options *o, int trial) {
    static const int delays[] = {50, 10, 120, 50, 30, 80};
    exit_load_child(8, delays[trial % 6], rng_mix(o->seed, 1000000u + (uint64_t)trial));
}

/* ---- main ---------------------------------------------------------------------------------------- */

static int compare_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static void usage(const char *argv0) {
    printf("usage: %s [all|cases|soak|exit-load] [options]\n"
           "  all (default)     the cases, then the exit-under-load trials, then the soak\n"
           "  --seed N          seed (default: time-based, printed)\n"
           "  --seconds S       budget of the cases: every targeted case, then random ones until S (default 60)\n"
           "  --cases N         at most N cases (targeted first, then random)\n"
           "  --sample N        a sample of N cases (2/3 targeted: the race and use-after-destroy ones first, then evenly\n"
           "                    spaced from a seeded offset; 1/3 random, which get the last quarter of --seconds)\n"
           "  --case I          only case I (as printed in a failure's repro line)\n"
           "  --jobs J          children at once (default 2)\n"
           "  --timeout T       per-case timeout in seconds (default 10)\n"
           "  --light           fewer rounds in the slow cases (for valgrind)\n"
           "  --no-fork         run the cases in this process (debugging one case)\n"
           "  --random-only     skip the targeted cases\n"
           "  --no-mutate       random cases without mutations (valid problems, results checked)\n"
           "  --soak-seconds S  soak duration (default 25); --threads N (default 16)\n"
           "  --exit-repeats N  exit-under-load trials (default 5)\n"
           "  -v                also print the random calls the classifier thought valid but were rejected\n",
           argv0);
}

int main(int argc, char **argv) {
    static options o;
    int i, failed;
    long targeted;
    double started = now();
    memset(&o, 0, sizeof o);
    o.mode = "all";
    o.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    o.max_cases = -1;
    o.seconds = 60;
    o.jobs = 2;
    o.timeout = 10;
    o.only_case = -1;
    o.soak_seconds = 25;
    o.soak_threads = 16;
    o.exit_repeats = 5;
    o.argv0 = argv[0];
    for (i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEXT() (v ? (++i, v) : (usage(argv[0]), exit(2), ""))
        if (!strcmp(a, "all") || !strcmp(a, "cases") || !strcmp(a, "soak") || !strcmp(a, "exit-load")) o.mode = a;
        else if (!strcmp(a, "--seed")) o.seed = strtoull(NEXT(), NULL, 0);
        else if (!strcmp(a, "--seconds")) o.seconds = atof(NEXT());
        else if (!strcmp(a, "--cases")) o.max_cases = atol(NEXT());
        else if (!strcmp(a, "--sample")) o.sample = atol(NEXT());
        else if (!strcmp(a, "--case")) o.only_case = atol(NEXT());
        else if (!strcmp(a, "--jobs")) o.jobs = atoi(NEXT());
        else if (!strcmp(a, "--timeout")) o.timeout = atoi(NEXT());
        else if (!strcmp(a, "--light")) fuzz_light = 1;
        else if (!strcmp(a, "--no-fork")) o.no_fork = 1;
        else if (!strcmp(a, "--soak-seconds")) o.soak_seconds = atof(NEXT());
        else if (!strcmp(a, "--threads")) o.soak_threads = atoi(NEXT());
        else if (!strcmp(a, "--exit-repeats")) o.exit_repeats = atoi(NEXT());
        else if (!strcmp(a, "-v")) o.verbose++;
        else if (!strcmp(a, "--random-only")) o.random_only = 1;
        else if (!strcmp(a, "--no-mutate")) fuzz_no_mutate = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(argv[0]);
            return 0;
        } else {
            fprintf(stderr, "fmha_fuzz: unknown argument %s\n", a);
            usage(argv[0]);
            return 2;
        }
#undef NEXT
    }
    if (o.jobs < 1) o.jobs = 1;
    if (o.jobs > 16) o.jobs = 16;
    targeted = targeted_count();
    printf("fmha_fuzz: mode %s, seed %llu (reproduce with --seed %llu), %ld targeted cases\n", o.mode,
           (unsigned long long)o.seed, (unsigned long long)o.seed, targeted);
    fflush(stdout);

    if (!strcmp(o.mode, "all") || !strcmp(o.mode, "cases")) {
        long cap = 1000000, n = 0, *list = NULL;
        double stop_at = started + o.seconds;
        if (o.max_cases >= 0) cap = o.max_cases;
        list = (long *)calloc((size_t)(cap > 0 ? cap : 1), sizeof(long));
        if (list == NULL) return 2;
        if (o.only_case >= 0) {
            list[n++] = o.only_case;
            stop_at = now() + 1e9;
        } else if (o.sample > 0) {
            long want_t = o.sample * 2 / 3, k, always;
            uint64_t st = o.seed;
            long step = want_t > 0 ? (targeted + want_t - 1) / want_t : 1, offset = (long)(rng_next(&st) % (uint64_t)step);
            if (step < 1) step = 1;
            /* the always-sampled cases (races, use after destroy) first, so that the budget never cuts them */
            for (k = 0; k < targeted && n < cap; ++k)
                if (targeted_always_sampled((int)k)) list[n++] = k;
            always = n;
            for (k = offset; k < targeted && n < cap && n < want_t; k += step)
                if ((!fuzz_light || !targeted_heavy((int)k)) && !targeted_always_sampled((int)k)) list[n++] = k;
            /* the rest in index order */
            qsort(list + always, (size_t)(n - always), sizeof *list, compare_long);
            for (k = 0; n < o.sample && n < cap; ++k) list[n++] = targeted + k;
            stop_at = started + (o.seconds > 0 ? o.seconds : 1e9);
        } else {
            long k;
            for (k = 0; k < targeted && n < cap && !o.random_only; ++k) list[n++] = k;
            for (k = 0; n < cap; ++k) list[n++] = targeted + k;
            /* the targeted cases always run; the random ones fill the budget */
        }
        if (o.no_fork) {
            long k;
            for (k = 0; k < n; ++k) {
                case_record rec;
                memset(&rec, 0, sizeof rec);
                guard_install();
                if (list[k] < targeted) targeted_run((int)list[k], o.seed, &rec);
                else random_run(rng_mix(o.seed, (uint64_t)list[k]), &rec);
                printf("case %ld: %s\n  status %d, message: %s\n  note: %s\n  correct %d forbidden %d fields %s\n", list[k],
                       rec.desc, (int)rec.status, rec.message, rec.note, (int)rec.correct, (int)rec.forbidden, rec.fields);
            }
            return 0;
        }
        {
            /* targeted first regardless of the budget, then random until stop_at */
            long nt = 0;
            while (nt < n && list[nt] < targeted) ++nt;
            /* a sample keeps the last quarter of its budget for its random cases */
            run_cases(&o, list, nt, o.only_case >= 0 ? stop_at : o.sample > 0 ? stop_at - 0.25 * (stop_at - started) : 1e18);
            if (n > nt) run_cases(&o, list + nt, n - nt, stop_at);
        }
        free(list);
        print_groups();
        printf("cases: %ld run in %.1f s (%ld targeted available); random calls judged forbidden %ld, allowed %ld\n", o.run,
               now() - started, targeted, o.random_forbidden, o.random_allowed);
    }

    if (!strcmp(o.mode, "all") || !strcmp(o.mode, "exit-load")) {
        double t0 = now();
        for (i = 0; i < o.exit_repeats; ++i) {
            char what[64];
            snprintf(what, sizeof what, "exit under load, trial %d", i);
            o.exit_failed += run_child(&o, exit_child, i, 20.0, what, o.verbose);
            o.exit_ran++;
        }
        printf("exit under load: %d/%d trials exited cleanly (status 0) in %.1f s\n", o.exit_ran - o.exit_failed, o.exit_ran,
               now() - t0);
    }

    if (!strcmp(o.mode, "all") || !strcmp(o.mode, "soak")) {
        double t0 = now();
        o.soak_failed = run_child(&o, soak_child, 0, o.soak_seconds + 90.0, "soak", 1);
        o.soak_ran = 1;
        printf("soak: %s (%d threads, %.1f s)\n", o.soak_failed ? "FAILED" : "ok", o.soak_threads, now() - t0);
    }

    failed = o.counts[V_SILENT] + o.counts[V_CRASH] + o.counts[V_OOB] + o.counts[V_HANG] + o.counts[V_WRONG] > 0 ||
             o.soak_failed || o.exit_failed;
    printf("seed %llu; %ld unnamed (non-OK, message does not name the field; not a failure), %ld wrong (valid input "
           "rejected, wrong results, or a status other than required), %ld random calls the classifier took for valid were "
           "rejected (informational)%s%s\n",
           (unsigned long long)o.seed, o.counts[V_UNNAMED], o.counts[V_WRONG], o.random_valid_rejected,
           o.exit_ran ? (o.exit_failed ? "; exit under load FAILED" : "; exit under load ok") : "",
           o.soak_ran ? (o.soak_failed ? "; soak FAILED" : "; soak ok") : "");
    printf("%ld cases, %ld clean, %ld silent-accept, %ld crash, %ld oob, %ld hang\n", o.run, o.counts[V_CLEAN],
           o.counts[V_SILENT], o.counts[V_CRASH], o.counts[V_OOB], o.counts[V_HANG]);
    return failed ? 1 : 0;
}

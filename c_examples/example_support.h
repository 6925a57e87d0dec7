/*
 * What every example does on failure: print the call, its status and the library's thread-local
 * message, and leave through the example's cleanup with exit status 1 (77 when a GPU build runs
 * without a GPU, which ctest reports as skipped).
 */
#ifndef FMHA_EXAMPLES_SUPPORT_H
#define FMHA_EXAMPLES_SUPPORT_H

#include <fmha.h>
#include <stdio.h>

#define EXIT_NO_DEVICE 77

static int report(const char *what, fmha_status status) {
    char message[512];
    fmha_last_error_message(message, sizeof message);
    fprintf(stderr, "%s failed: %s (%d): %s\n", what, fmha_status_string(status), (int)status, message);
    return status == FMHA_ERR_NO_DEVICE ? EXIT_NO_DEVICE : 1;
}

/* Runs an fmha call; on failure reports it and jumps to `cleanup` with `exit_code` set. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        fmha_status try_status_ = (call);                                                          \
        if (try_status_ != FMHA_OK) {                                                              \
            exit_code = report(#call, try_status_);                                                \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

#endif

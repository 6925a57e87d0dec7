/*
 * A tiny test harness for the C ABI tests: CHECK macros that count and report, and a summary line
 * "N passed, M failed". Valid C99 and C++11 (every test is also compiled as C++).
 */
#ifndef FMHA_TEST_CHECK_H
#define FMHA_TEST_CHECK_H

#include <fmha.h>

#include <stdio.h>
#include <string.h>

/* Exit status for "nothing could run" (a GPU build without a device); ctest's SKIP_RETURN_CODE. */
#define CHECK_EXIT_SKIPPED 77

static int check_passed = 0;
static int check_failed = 0;

/* The calling thread's last error message (fmha_last_error_message), in a static buffer. */
static inline const char *check_message(void) {
    static char buffer[1024];
    fmha_last_error_message(buffer, sizeof buffer);
    return buffer;
}

static inline void check_record(int ok, const char *file, int line, const char *what) {
    if (ok) {
        ++check_passed;
    } else {
        ++check_failed;
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", file, line, what);
    }
}

#define CHECK(cond) check_record((cond) ? 1 : 0, __FILE__, __LINE__, #cond)

/* CHECK_STATUS(call, expected): the call returns `expected`; on failure prints both statuses and
 * the library's message. */
#define CHECK_STATUS(call, expected)                                                                       \
    do {                                                                                                   \
        fmha_status check_got_ = (call);                                                                   \
        fmha_status check_want_ = (expected);                                                              \
        check_record(check_got_ == check_want_, __FILE__, __LINE__, #call " == " #expected);              \
        if (check_got_ != check_want_)                                                                     \
            fprintf(stderr, "    returned %d (%s), expected %d (%s); message: \"%s\"\n", (int)check_got_, \
                    fmha_status_string(check_got_), (int)check_want_, fmha_status_string(check_want_),     \
                    check_message());                                                                      \
    } while (0)

/* CHECK_MESSAGE_HAS(text): the thread's last error message contains `text`. */
#define CHECK_MESSAGE_HAS(text)                                                                            \
    do {                                                                                                   \
        const char *check_text_ = check_message();                                                         \
        check_record(strstr(check_text_, (text)) != NULL, __FILE__, __LINE__, "message contains \"" text "\""); \
        if (strstr(check_text_, (text)) == NULL) fprintf(stderr, "    message: \"%s\"\n", check_text_);   \
    } while (0)

/* CHECK_FAILS_WITH(call, expected, text): the call returns `expected` and its message names `text`. */
#define CHECK_FAILS_WITH(call, expected, text) \
    do {                                       \
        CHECK_STATUS(call, expected);          \
        CHECK_MESSAGE_HAS(text);               \
    } while (0)

/* Whether the runtime helpers can run: always on the host backend; on a GPU build only with a device
 * (otherwise FMHA_ERR_NO_DEVICE, which is then the expected answer). */
static inline int check_have_device(void) {
    int32_t count = 0;
    fmha_status status = fmha_device_cu_count(&count);
    if (fmha_backend() == FMHA_BACKEND_HOST) {
        CHECK_STATUS(status, FMHA_OK);
        return status == FMHA_OK;
    }
    if (status == FMHA_ERR_NO_DEVICE) {
        printf("no device (%s): device tests skipped\n", check_message());
        return 0;
    }
    CHECK_STATUS(status, FMHA_OK);
    return status == FMHA_OK;
}

/* Prints "N passed, M failed" and returns the exit status. */
static inline int check_summary(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed == 0 ? 0 : 1;
}

#endif /* FMHA_TEST_CHECK_H */

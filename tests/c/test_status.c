/*
 * Version queries, status codes and strings, and the thread-local error message
 * (fmha_version, fmha_version_number, fmha_backend, fmha_status_string, fmha_last_error_message).
 */
#include "check.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

static void test_version(void) {
    const char *version = fmha_version();
    char expected[32];
    CHECK(version != NULL);
    CHECK(version != NULL && strcmp(version, FMHA_VERSION_STRING) == 0);
    CHECK(fmha_version_number() == FMHA_VERSION_NUMBER);
    CHECK(FMHA_VERSION_NUMBER == FMHA_VERSION_MAJOR * 10000 + FMHA_VERSION_MINOR * 100 + FMHA_VERSION_PATCH);
    snprintf(expected, sizeof expected, "%d.%d.%d", FMHA_VERSION_MAJOR, FMHA_VERSION_MINOR, FMHA_VERSION_PATCH);
    CHECK(strcmp(FMHA_VERSION_STRING, expected) == 0);
    CHECK(fmha_version() == version); /* a static string */
    CHECK(fmha_backend() == FMHA_BACKEND_HOST || fmha_backend() == FMHA_BACKEND_CUDA ||
          fmha_backend() == FMHA_BACKEND_ROCM);
    CHECK(FMHA_BACKEND_HOST == 0 && FMHA_BACKEND_CUDA == 1 && FMHA_BACKEND_ROCM == 2);
}

static void test_status_values(void) {
    /* The numeric values are ABI: they never change. */
    CHECK(FMHA_OK == 0);
    CHECK(FMHA_ERR_INVALID_ARGUMENT == 1);
    CHECK(FMHA_ERR_UNSUPPORTED == 2);
    CHECK(FMHA_ERR_DEVICE_RUNTIME == 3);
    CHECK(FMHA_ERR_OUT_OF_MEMORY == 4);
    CHECK(FMHA_ERR_WORKSPACE_TOO_SMALL == 5);
    CHECK(FMHA_ERR_WORKSPACE_NOT_PREPARED == 6);
    CHECK(FMHA_ERR_NO_DEVICE == 7);
    CHECK(FMHA_ERR_NULL_POINTER == 8);
    CHECK(FMHA_ERR_INTERNAL == 9);
    CHECK(FMHA_ERR_ASYNC_FAILURE == 10);
    CHECK(FMHA_MEMCPY_HOST_TO_DEVICE == 1 && FMHA_MEMCPY_DEVICE_TO_HOST == 2 && FMHA_MEMCPY_DEVICE_TO_DEVICE == 3);
    CHECK(sizeof(fmha_status) == 4);
}

static void test_status_strings(void) {
    static const fmha_status codes[] = {
        FMHA_OK,           FMHA_ERR_INVALID_ARGUMENT,    FMHA_ERR_UNSUPPORTED,
        FMHA_ERR_DEVICE_RUNTIME, FMHA_ERR_OUT_OF_MEMORY, FMHA_ERR_WORKSPACE_TOO_SMALL,
        FMHA_ERR_WORKSPACE_NOT_PREPARED, FMHA_ERR_NO_DEVICE, FMHA_ERR_NULL_POINTER,
        FMHA_ERR_INTERNAL, FMHA_ERR_ASYNC_FAILURE,
    };
    static const fmha_status unknown[] = {-1, 11, 12, 100, 1000, INT32_MIN, INT32_MAX};
    const size_t count = sizeof codes / sizeof codes[0];
    const char *unknown_text = fmha_status_string(-1);
    size_t i, j;

    CHECK(unknown_text != NULL && strcmp(unknown_text, "unknown status") == 0);
    for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
        const char *text = fmha_status_string(unknown[i]);
        CHECK(text != NULL && strcmp(text, "unknown status") == 0);
    }
    CHECK(strcmp(fmha_status_string(FMHA_OK), "success") == 0);
    for (i = 0; i < count; ++i) {
        const char *text = fmha_status_string(codes[i]);
        CHECK(text != NULL);
        if (text == NULL) continue;
        CHECK(strlen(text) > 0);
        CHECK(strcmp(text, "unknown status") != 0);
        CHECK(fmha_status_string(codes[i]) == text); /* static strings */
        for (j = 0; j < i; ++j) CHECK(strcmp(text, fmha_status_string(codes[j])) != 0);
    }
    CHECK(strstr(fmha_status_string(FMHA_ERR_NULL_POINTER), "null") != NULL);
    CHECK(strstr(fmha_status_string(FMHA_ERR_NO_DEVICE), "device") != NULL);
}

/* Makes the calling thread's last call fail with FMHA_ERR_NULL_POINTER (works without a device). */
static void fail_with_null_pointer(void) {
    CHECK_STATUS(fmha_device_malloc(NULL, 64), FMHA_ERR_NULL_POINTER);
}

static void test_last_error_message(int have_device) {
    char buffer[256];
    char small[16];
    size_t length, again;

    fail_with_null_pointer();
    length = fmha_last_error_message(NULL, 0);
    CHECK(length > 0);
    CHECK(length < sizeof buffer);
    CHECK(fmha_last_error_message(NULL, 1000) == length); /* NULL buffer: any length, just the size */

    /* The full message, NUL-terminated; the return value is its length without the NUL. */
    memset(buffer, 'X', sizeof buffer);
    CHECK(fmha_last_error_message(buffer, sizeof buffer) == length);
    CHECK(strlen(buffer) == length);
    CHECK(strstr(buffer, "ptr") != NULL);
    CHECK(buffer[length] == '\0' && buffer[length + 1] == 'X');

    /* Exactly enough room. */
    memset(small, 'X', sizeof small);
    if (length + 1 <= sizeof small) {
        CHECK(fmha_last_error_message(small, length + 1) == length);
        CHECK(strcmp(small, buffer) == 0);
    }

    /* Truncation: `length - 1` bytes are written plus a NUL; nothing beyond `length`. */
    memset(small, 'X', sizeof small);
    CHECK(fmha_last_error_message(small, 5) == length);
    CHECK(small[4] == '\0');
    CHECK(strncmp(small, buffer, 4) == 0);
    CHECK(small[5] == 'X');

    memset(small, 'X', sizeof small);
    CHECK(fmha_last_error_message(small, 1) == length);
    CHECK(small[0] == '\0' && small[1] == 'X');

    /* Length 0: nothing is written, even with a buffer. */
    memset(small, 'X', sizeof small);
    CHECK(fmha_last_error_message(small, 0) == length);
    CHECK(small[0] == 'X');

    /* Reading the message (or a status string) does not clear it. */
    again = fmha_last_error_message(NULL, 0);
    CHECK(again == length);
    (void)fmha_status_string(FMHA_ERR_INTERNAL);
    (void)fmha_version();
    CHECK(fmha_last_error_message(NULL, 0) == length);

    /* A later failure replaces the message. */
    CHECK_STATUS(fmha_stream_create(NULL), FMHA_ERR_NULL_POINTER);
    CHECK_MESSAGE_HAS("stream");
    CHECK(strstr(check_message(), "ptr") == NULL);

    /* A successful call clears it. */
    if (have_device) {
        CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
        CHECK(fmha_last_error_message(NULL, 0) == 0);
        memset(small, 'X', sizeof small);
        CHECK(fmha_last_error_message(small, sizeof small) == 0);
        CHECK(small[0] == '\0');
    }
}

struct thread_result {
    size_t length_at_start;
    fmha_status status;
    char message[256];
};

static void *thread_main(void *arg) {
    struct thread_result *result = (struct thread_result *)arg;
    result->length_at_start = fmha_last_error_message(NULL, 0);
    result->status = fmha_memset(NULL, 300, 16); /* fails: no device, bad value or null pointer */
    fmha_last_error_message(result->message, sizeof result->message);
    return NULL;
}

/* The message is per thread: another thread's failure does not touch this thread's message. */
static void test_message_is_thread_local(void) {
    char before[256], after[256];
    struct thread_result result;
    pthread_t thread;

    fail_with_null_pointer();
    fmha_last_error_message(before, sizeof before);
    memset(&result, 0, sizeof result);
    CHECK(pthread_create(&thread, NULL, thread_main, &result) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(result.length_at_start == 0); /* a new thread starts with no message */
    CHECK(result.status != FMHA_OK);
    CHECK(strlen(result.message) > 0);
    CHECK(strcmp(result.message, before) != 0);
    fmha_last_error_message(after, sizeof after);
    CHECK(strcmp(after, before) == 0);
}

int main(void) {
    int have_device;
    printf("fmha %s, backend %d\n", fmha_version(), (int)fmha_backend());
    have_device = check_have_device();
    test_version();
    test_status_values();
    test_status_strings();
    test_last_error_message(have_device);
    test_message_is_thread_local();
    return check_summary();
}

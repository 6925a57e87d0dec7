/*
 * Bad inputs to every exported function: each gets a clear status and a message naming the
 * offending argument, and nothing crashes.
 */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

/* Null out-pointers: FMHA_ERR_NULL_POINTER on every backend, with or without a device. */
static void test_null_out_pointers(void) {
    CHECK_FAILS_WITH(fmha_device_malloc(NULL, 64), FMHA_ERR_NULL_POINTER, "ptr");
    CHECK_FAILS_WITH(fmha_device_malloc(NULL, 0), FMHA_ERR_NULL_POINTER, "ptr");
    CHECK_FAILS_WITH(fmha_host_malloc_pinned(NULL, 64), FMHA_ERR_NULL_POINTER, "ptr");
    CHECK_FAILS_WITH(fmha_stream_create(NULL), FMHA_ERR_NULL_POINTER, "stream");
    CHECK_FAILS_WITH(fmha_device_cu_count(NULL), FMHA_ERR_NULL_POINTER, "count");
}

static void test_set_cu_count(void) {
    int32_t before = 0, after = 0;
    if (fmha_backend() != FMHA_BACKEND_HOST) {
        /* GPU builds use the device's CU count; no device needed to say so. */
        CHECK_STATUS(fmha_host_set_cu_count(8), FMHA_ERR_UNSUPPORTED);
        CHECK_STATUS(fmha_host_set_cu_count(0), FMHA_ERR_UNSUPPORTED);
        CHECK(strlen(check_message()) > 0);
        return;
    }
    CHECK_STATUS(fmha_device_cu_count(&before), FMHA_OK);
    CHECK_FAILS_WITH(fmha_host_set_cu_count(0), FMHA_ERR_INVALID_ARGUMENT, "cu_count");
    CHECK_FAILS_WITH(fmha_host_set_cu_count(-1), FMHA_ERR_INVALID_ARGUMENT, "cu_count");
    CHECK_FAILS_WITH(fmha_host_set_cu_count(4097), FMHA_ERR_INVALID_ARGUMENT, "cu_count");
    CHECK_FAILS_WITH(fmha_host_set_cu_count(INT32_MIN), FMHA_ERR_INVALID_ARGUMENT, "cu_count");
    CHECK_STATUS(fmha_device_cu_count(&after), FMHA_OK);
    CHECK(after == before); /* a refused value changes nothing */
    CHECK_STATUS(fmha_host_set_cu_count(8), FMHA_OK);
    CHECK_STATUS(fmha_device_cu_count(&after), FMHA_OK);
    CHECK(after == 8);
    CHECK_STATUS(fmha_host_set_cu_count(before), FMHA_OK);
}

static void test_bad_copy_kinds(void) {
    static const int32_t kinds[] = {0, 4, -1, 42, INT32_MAX, INT32_MIN};
    unsigned char host[64];
    void *d = NULL;
    size_t i;
    memset(host, 0x42, sizeof host);
    CHECK_STATUS(fmha_device_malloc(&d, sizeof host), FMHA_OK);
    if (d == NULL) return;
    CHECK_STATUS(fmha_memset(d, 0, sizeof host), FMHA_OK);
    for (i = 0; i < sizeof kinds / sizeof kinds[0]; ++i) {
        CHECK_FAILS_WITH(fmha_memcpy(d, host, sizeof host, kinds[i]), FMHA_ERR_INVALID_ARGUMENT, "kind");
        CHECK_FAILS_WITH(fmha_memcpy_async(d, host, sizeof host, kinds[i], NULL), FMHA_ERR_INVALID_ARGUMENT, "kind");
    }
    /* Nothing was copied. */
    CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(host, d, sizeof host, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    for (i = 0; i < sizeof host; ++i)
        if (host[i] != 0) break;
    CHECK(i == sizeof host);
    CHECK_STATUS(fmha_device_free(d), FMHA_OK);
}

static void test_bad_memset_values(void) {
    static const int32_t values[] = {300, 256, -1, -128, INT32_MAX, INT32_MIN};
    void *d = NULL;
    size_t i;
    CHECK_STATUS(fmha_device_malloc(&d, 64), FMHA_OK);
    if (d == NULL) return;
    for (i = 0; i < sizeof values / sizeof values[0]; ++i) {
        CHECK_FAILS_WITH(fmha_memset(d, values[i], 64), FMHA_ERR_INVALID_ARGUMENT, "value");
        CHECK_FAILS_WITH(fmha_memset_async(d, values[i], 64, NULL), FMHA_ERR_INVALID_ARGUMENT, "value");
    }
    CHECK_STATUS(fmha_memset(d, 255, 64), FMHA_OK);
    CHECK_STATUS(fmha_memset(d, 0, 64), FMHA_OK);
    CHECK_STATUS(fmha_device_free(d), FMHA_OK);
}

static void test_default_stream_cannot_be_destroyed(void) {
    CHECK_FAILS_WITH(fmha_stream_destroy(NULL), FMHA_ERR_INVALID_ARGUMENT, "stream");
    /* ... and still works afterwards. */
    CHECK_STATUS(fmha_stream_synchronize(NULL), FMHA_OK);
}

/* The host backend keeps tables of its allocations and streams, so stale and foreign handles are
 * errors there (GPU runtimes leave some of these undefined). */
static void test_host_backend_handles(void) {
    void *d = NULL, *p = NULL;
    fmha_stream_t s = NULL;
    int on_stack = 0;
    unsigned char host[16];

    CHECK_STATUS(fmha_device_malloc(&d, 128), FMHA_OK);
    CHECK_STATUS(fmha_device_free(d), FMHA_OK);
    CHECK_FAILS_WITH(fmha_device_free(d), FMHA_ERR_INVALID_ARGUMENT, "ptr"); /* double free */
    CHECK_FAILS_WITH(fmha_device_free(&on_stack), FMHA_ERR_INVALID_ARGUMENT, "ptr"); /* not from fmha */

    CHECK_STATUS(fmha_host_malloc_pinned(&p, 128), FMHA_OK);
    CHECK_STATUS(fmha_host_free_pinned(p), FMHA_OK);
    CHECK_FAILS_WITH(fmha_host_free_pinned(p), FMHA_ERR_INVALID_ARGUMENT, "ptr");
    CHECK_FAILS_WITH(fmha_host_free_pinned(&on_stack), FMHA_ERR_INVALID_ARGUMENT, "ptr");

    CHECK_STATUS(fmha_stream_create(&s), FMHA_OK);
    CHECK_STATUS(fmha_stream_destroy(s), FMHA_OK);
    CHECK_FAILS_WITH(fmha_stream_destroy(s), FMHA_ERR_INVALID_ARGUMENT, "stream");
    CHECK_FAILS_WITH(fmha_stream_synchronize(s), FMHA_ERR_INVALID_ARGUMENT, "stream");
    CHECK_FAILS_WITH(fmha_memset_async(host, 0, sizeof host, s), FMHA_ERR_INVALID_ARGUMENT, "stream");
    CHECK_FAILS_WITH(fmha_memcpy_async(host, host + 8, 8, FMHA_MEMCPY_DEVICE_TO_DEVICE, (fmha_stream_t)(uintptr_t)0x123457),
                     FMHA_ERR_INVALID_ARGUMENT, "stream");

    /* Null data pointers with a non-zero size. */
    CHECK_FAILS_WITH(fmha_memcpy(NULL, host, 8, FMHA_MEMCPY_HOST_TO_DEVICE), FMHA_ERR_NULL_POINTER, "dst");
    CHECK_FAILS_WITH(fmha_memcpy(host, NULL, 8, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_ERR_NULL_POINTER, "src");
    CHECK_FAILS_WITH(fmha_memcpy_async(NULL, host, 8, FMHA_MEMCPY_HOST_TO_DEVICE, NULL), FMHA_ERR_NULL_POINTER, "dst");
    CHECK_FAILS_WITH(fmha_memset(NULL, 0, 8), FMHA_ERR_NULL_POINTER, "dst");
    CHECK_FAILS_WITH(fmha_memset_async(NULL, 0, 8, NULL), FMHA_ERR_NULL_POINTER, "dst");
    /* ... which are fine with a zero size. */
    CHECK_STATUS(fmha_memcpy(NULL, NULL, 0, FMHA_MEMCPY_DEVICE_TO_DEVICE), FMHA_OK);
    CHECK_STATUS(fmha_memset(NULL, 0, 0), FMHA_OK);

    /* An impossible allocation fails cleanly (and leaves the out-pointer alone or NULL). */
    d = NULL;
    CHECK(fmha_device_malloc(&d, SIZE_MAX) != FMHA_OK);
    CHECK(strlen(check_message()) > 0);
    CHECK(d == NULL);
}

/* On a GPU build without a device, every call that needs the device says so. */
static void test_no_device(void) {
    void *p = NULL;
    fmha_stream_t s = NULL;
    int32_t count = 0;
    CHECK_FAILS_WITH(fmha_device_malloc(&p, 64), FMHA_ERR_NO_DEVICE, "");
    CHECK(strlen(check_message()) > 0);
    CHECK(p == NULL);
    CHECK_STATUS(fmha_host_malloc_pinned(&p, 64), FMHA_ERR_NO_DEVICE);
    CHECK_STATUS(fmha_stream_create(&s), FMHA_ERR_NO_DEVICE);
    CHECK_STATUS(fmha_device_cu_count(&count), FMHA_ERR_NO_DEVICE);
    CHECK_STATUS(fmha_device_synchronize(), FMHA_ERR_NO_DEVICE);
    CHECK_STATUS(fmha_stream_synchronize(NULL), FMHA_ERR_NO_DEVICE);
}

int main(void) {
    int have_device;
    printf("fmha %s, backend %d\n", fmha_version(), (int)fmha_backend());
    have_device = check_have_device();
    test_null_out_pointers();
    test_set_cu_count();
    if (have_device) {
        test_bad_copy_kinds();
        test_bad_memset_values();
        test_default_stream_cannot_be_destroyed();
        if (fmha_backend() == FMHA_BACKEND_HOST) test_host_backend_handles();
    } else {
        test_no_device();
    }
    return check_summary();
}

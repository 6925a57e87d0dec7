/*
 * 01_device_roundtrip: the runtime helpers every fmha program uses, identical on every backend.
 *
 *   device memory and page-locked (pinned) host memory, a stream, asynchronous copies
 *   host -> device -> device -> host on that stream, one synchronize, a check of the result,
 *   a memset, and what a failed call looks like (status, status string, thread-local message).
 *
 * Exit status: 0 on success, 1 on a failure, 77 when a GPU build runs on a machine without a GPU
 * (FMHA_ERR_NO_DEVICE; ctest reports the example as skipped).
 */
#include <fmha.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_support.h"

int main(void) {
    enum { COUNT = 1 << 20 }; /* 1 Mi floats = 4 MiB */
    const size_t bytes = COUNT * sizeof(float);
    int exit_code = 0;
    int32_t cu_count = 0;
    void *pinned_in = NULL, *pinned_out = NULL; /* page-locked host memory */
    void *device_a = NULL, *device_b = NULL;
    float *host_in, *host_out;
    fmha_stream_t stream = NULL;
    unsigned char *check = NULL;
    size_t i;

    printf("fmha %s, backend %d\n", fmha_version(), (int)fmha_backend());

    /* The first call that needs the device tells whether there is one. */
    TRY(fmha_device_cu_count(&cu_count));
    printf("compute units: %d\n", (int)cu_count);

    TRY(fmha_host_malloc_pinned(&pinned_in, bytes));
    TRY(fmha_host_malloc_pinned(&pinned_out, bytes));
    host_in = (float *)pinned_in;
    host_out = (float *)pinned_out;
    TRY(fmha_device_malloc(&device_a, bytes));
    TRY(fmha_device_malloc(&device_b, bytes));
    TRY(fmha_stream_create(&stream));

    for (i = 0; i < COUNT; ++i) {
        host_in[i] = (float)i * 0.5f - 1000.0f;
        host_out[i] = -1.0f;
    }

    /* Three copies queued on one stream run in order; nothing waits until the synchronize. */
    TRY(fmha_memcpy_async(device_a, host_in, bytes, FMHA_MEMCPY_HOST_TO_DEVICE, stream));
    TRY(fmha_memcpy_async(device_b, device_a, bytes, FMHA_MEMCPY_DEVICE_TO_DEVICE, stream));
    TRY(fmha_memcpy_async(host_out, device_b, bytes, FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    TRY(fmha_stream_synchronize(stream));

    for (i = 0; i < COUNT; ++i) {
        if (host_out[i] != host_in[i]) {
            fprintf(stderr, "round trip mismatch at %zu: %g != %g\n", i, (double)host_out[i], (double)host_in[i]);
            exit_code = 1;
            goto cleanup;
        }
    }
    printf("round trip host -> device -> device -> host of %zu bytes: ok\n", bytes);

    /* memset sets bytes: 0x7f in every byte of a float. Then a synchronous copy back. */
    TRY(fmha_memset_async(device_b, 0x7f, bytes, stream));
    TRY(fmha_stream_synchronize(stream));
    check = (unsigned char *)malloc(bytes);
    if (check == NULL) {
        fprintf(stderr, "out of host memory\n");
        exit_code = 1;
        goto cleanup;
    }
    TRY(fmha_memcpy(check, device_b, bytes, FMHA_MEMCPY_DEVICE_TO_HOST));
    for (i = 0; i < bytes; ++i) {
        if (check[i] != 0x7f) {
            fprintf(stderr, "memset mismatch at byte %zu: 0x%02x\n", i, check[i]);
            exit_code = 1;
            goto cleanup;
        }
    }
    printf("memset of %zu bytes: ok\n", bytes);

    /* A failing call: 42 is not an FMHA_MEMCPY_* kind. The status says what kind of error, the
     * thread-local message says which argument and why. Nothing is copied. */
    {
        fmha_status status = fmha_memcpy(device_a, device_b, bytes, 42);
        size_t length = fmha_last_error_message(NULL, 0); /* NULL buffer: just the length */
        char message[256];
        fmha_last_error_message(message, sizeof message); /* truncated if longer, always NUL-terminated */
        printf("expected error: fmha_memcpy(kind = 42) -> %d \"%s\": %s (%zu bytes)\n", (int)status,
               fmha_status_string(status), message, length);
        if (status != FMHA_ERR_INVALID_ARGUMENT || strstr(message, "kind") == NULL) {
            fprintf(stderr, "unexpected status or message for an invalid copy kind\n");
            exit_code = 1;
            goto cleanup;
        }
    }

cleanup:
    free(check);
    /* Freeing NULL is a no-op, so the cleanup needs no bookkeeping. The stream is destroyed only
     * if it was created: NULL means the default stream, which cannot be destroyed. When there is
     * no device at all, the earlier failure is what gets reported. */
    if (exit_code != EXIT_NO_DEVICE) {
        fmha_status status;
        if (stream != NULL && (status = fmha_stream_destroy(stream)) != FMHA_OK) exit_code = report("fmha_stream_destroy", status);
        if ((status = fmha_device_free(device_a)) != FMHA_OK) exit_code = report("fmha_device_free(a)", status);
        if ((status = fmha_device_free(device_b)) != FMHA_OK) exit_code = report("fmha_device_free(b)", status);
        if ((status = fmha_host_free_pinned(pinned_in)) != FMHA_OK) exit_code = report("fmha_host_free_pinned(in)", status);
        if ((status = fmha_host_free_pinned(pinned_out)) != FMHA_OK) exit_code = report("fmha_host_free_pinned(out)", status);
        if (exit_code == 0) printf("all resources freed: ok\n");
    }
    return exit_code;
}

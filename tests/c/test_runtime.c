/*
 * The runtime helpers' happy paths: device and pinned allocations, synchronous and asynchronous
 * copies in every direction, memsets, streams (created ones and the default stream), device
 * synchronize, the CU count (and the host backend's settable CU count).
 *
 * Needs a device: on a GPU build without one, it exits 77 (skipped).
 */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

enum { BYTES = 1 << 20 };

static void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
    size_t i;
    for (i = 0; i < n; ++i) p[i] = (unsigned char)((i * 131u + seed * 7u + (i >> 8)) & 0xffu);
}

static int all_bytes(const unsigned char *p, size_t n, unsigned char value) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != value) return 0;
    return 1;
}

static void test_cu_count(void) {
    int32_t count = -1;
    CHECK_STATUS(fmha_device_cu_count(&count), FMHA_OK);
    CHECK(count > 0);
    if (fmha_backend() == FMHA_BACKEND_HOST) {
        int32_t original = count;
        CHECK_STATUS(fmha_host_set_cu_count(8), FMHA_OK);
        CHECK_STATUS(fmha_device_cu_count(&count), FMHA_OK);
        CHECK(count == 8);
        CHECK_STATUS(fmha_host_set_cu_count(1), FMHA_OK);
        CHECK_STATUS(fmha_device_cu_count(&count), FMHA_OK);
        CHECK(count == 1);
        CHECK_STATUS(fmha_host_set_cu_count(4096), FMHA_OK);
        CHECK_STATUS(fmha_device_cu_count(&count), FMHA_OK);
        CHECK(count == 4096);
        CHECK_STATUS(fmha_host_set_cu_count(original), FMHA_OK);
        CHECK_STATUS(fmha_device_cu_count(&count), FMHA_OK);
        CHECK(count == original);
    } else {
        CHECK_STATUS(fmha_host_set_cu_count(8), FMHA_ERR_UNSUPPORTED);
    }
}

static void test_allocations(void) {
    static const size_t sizes[] = {1, 3, 256, 4096, 65537, BYTES};
    size_t i;
    void *p;

    for (i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        p = NULL;
        CHECK_STATUS(fmha_device_malloc(&p, sizes[i]), FMHA_OK);
        CHECK(p != NULL);
        CHECK(((uintptr_t)p % 256) == 0); /* documented alignment */
        CHECK_STATUS(fmha_device_free(p), FMHA_OK);

        p = NULL;
        CHECK_STATUS(fmha_host_malloc_pinned(&p, sizes[i]), FMHA_OK);
        CHECK(p != NULL);
        if (p != NULL) {
            memset(p, 0x5a, sizes[i]); /* pinned memory is ordinary host memory to the CPU */
            CHECK(((unsigned char *)p)[sizes[i] - 1] == 0x5a);
        }
        CHECK_STATUS(fmha_host_free_pinned(p), FMHA_OK);
    }

    /* Zero bytes is a valid request; whatever it returns can be freed. */
    p = NULL;
    CHECK_STATUS(fmha_device_malloc(&p, 0), FMHA_OK);
    CHECK_STATUS(fmha_device_free(p), FMHA_OK);
    p = NULL;
    CHECK_STATUS(fmha_host_malloc_pinned(&p, 0), FMHA_OK);
    CHECK_STATUS(fmha_host_free_pinned(p), FMHA_OK);

    /* Freeing NULL is a no-op. */
    CHECK_STATUS(fmha_device_free(NULL), FMHA_OK);
    CHECK_STATUS(fmha_host_free_pinned(NULL), FMHA_OK);
}

/* Synchronous copies in every direction, from pageable host memory. */
static void test_sync_copies(void) {
    unsigned char *in = (unsigned char *)malloc(BYTES);
    unsigned char *out = (unsigned char *)malloc(BYTES);
    void *a = NULL, *b = NULL;

    CHECK(in != NULL && out != NULL);
    if (in == NULL || out == NULL) goto done;
    fill_pattern(in, BYTES, 1);
    memset(out, 0, BYTES);
    CHECK_STATUS(fmha_device_malloc(&a, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_device_malloc(&b, BYTES), FMHA_OK);
    if (a == NULL || b == NULL) goto done;

    CHECK_STATUS(fmha_memcpy(a, in, BYTES, FMHA_MEMCPY_HOST_TO_DEVICE), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(b, a, BYTES, FMHA_MEMCPY_DEVICE_TO_DEVICE), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, b, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(memcmp(in, out, BYTES) == 0);

    /* A copy of part of a buffer, at offsets. */
    memset(out, 0, BYTES);
    CHECK_STATUS(fmha_memcpy((unsigned char *)b + 1000, (unsigned char *)a + 17, 5000, FMHA_MEMCPY_DEVICE_TO_DEVICE), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, b, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(memcmp(out, in, 1000) == 0);
    CHECK(memcmp(out + 1000, in + 17, 5000) == 0);
    CHECK(memcmp(out + 6000, in + 6000, BYTES - 6000) == 0);

    /* Zero-byte copies succeed and touch nothing. */
    CHECK_STATUS(fmha_memcpy(a, in, 0, FMHA_MEMCPY_HOST_TO_DEVICE), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, a, 0, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(b, a, 0, FMHA_MEMCPY_DEVICE_TO_DEVICE), FMHA_OK);

done:
    CHECK_STATUS(fmha_device_free(a), FMHA_OK);
    CHECK_STATUS(fmha_device_free(b), FMHA_OK);
    free(in);
    free(out);
}

static void test_memset(void) {
    unsigned char *out = (unsigned char *)malloc(BYTES);
    void *d = NULL;
    CHECK(out != NULL);
    CHECK_STATUS(fmha_device_malloc(&d, BYTES), FMHA_OK);
    if (out == NULL || d == NULL) goto done;

    CHECK_STATUS(fmha_memset(d, 0xab, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, d, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(all_bytes(out, BYTES, 0xab));

    /* The extreme byte values, and a sub-range. */
    CHECK_STATUS(fmha_memset(d, 0, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_memset((unsigned char *)d + 100, 255, 50), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, d, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(all_bytes(out, 100, 0));
    CHECK(all_bytes(out + 100, 50, 255));
    CHECK(all_bytes(out + 150, BYTES - 150, 0));

    /* Asynchronous, on the default stream (NULL). */
    CHECK_STATUS(fmha_memset_async(d, 0x11, BYTES, NULL), FMHA_OK);
    CHECK_STATUS(fmha_stream_synchronize(NULL), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, d, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(all_bytes(out, BYTES, 0x11));

    CHECK_STATUS(fmha_memset(d, 0x22, 0), FMHA_OK);
    CHECK_STATUS(fmha_memset_async(d, 0x22, 0, NULL), FMHA_OK);
    CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
    CHECK_STATUS(fmha_memcpy(out, d, 1, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_OK);
    CHECK(out[0] == 0x11);

done:
    CHECK_STATUS(fmha_device_free(d), FMHA_OK);
    free(out);
}

/* A round trip through pinned memory with asynchronous work on `stream` (NULL = default stream). */
static void roundtrip_on(fmha_stream_t stream, unsigned seed) {
    void *in = NULL, *out = NULL, *a = NULL, *b = NULL;
    CHECK_STATUS(fmha_host_malloc_pinned(&in, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_host_malloc_pinned(&out, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_device_malloc(&a, BYTES), FMHA_OK);
    CHECK_STATUS(fmha_device_malloc(&b, BYTES), FMHA_OK);
    if (in != NULL && out != NULL && a != NULL && b != NULL) {
        fill_pattern((unsigned char *)in, BYTES, seed);
        memset(out, 0, BYTES);
        CHECK_STATUS(fmha_memcpy_async(a, in, BYTES, FMHA_MEMCPY_HOST_TO_DEVICE, stream), FMHA_OK);
        CHECK_STATUS(fmha_memset_async(b, 0xee, BYTES, stream), FMHA_OK);
        CHECK_STATUS(fmha_memcpy_async(b, a, BYTES / 2, FMHA_MEMCPY_DEVICE_TO_DEVICE, stream), FMHA_OK);
        CHECK_STATUS(fmha_memcpy_async(out, b, BYTES, FMHA_MEMCPY_DEVICE_TO_HOST, stream), FMHA_OK);
        CHECK_STATUS(fmha_stream_synchronize(stream), FMHA_OK);
        CHECK(memcmp(out, in, BYTES / 2) == 0);
        CHECK(all_bytes((const unsigned char *)out + BYTES / 2, BYTES / 2, 0xee));
    }
    CHECK_STATUS(fmha_device_free(a), FMHA_OK);
    CHECK_STATUS(fmha_device_free(b), FMHA_OK);
    CHECK_STATUS(fmha_host_free_pinned(in), FMHA_OK);
    CHECK_STATUS(fmha_host_free_pinned(out), FMHA_OK);
}

static void test_streams(void) {
    enum { STREAMS = 4 };
    fmha_stream_t streams[STREAMS];
    void *host[STREAMS], *device[STREAMS];
    int i;

    roundtrip_on(NULL, 3);

    {
        fmha_stream_t s = NULL;
        CHECK_STATUS(fmha_stream_create(&s), FMHA_OK);
        CHECK(s != NULL);
        roundtrip_on(s, 4);
        CHECK_STATUS(fmha_stream_synchronize(s), FMHA_OK); /* nothing queued: returns at once */
        CHECK_STATUS(fmha_stream_destroy(s), FMHA_OK);
    }

    /* Several streams with work in flight at once, then one device-wide synchronize. */
    for (i = 0; i < STREAMS; ++i) {
        streams[i] = NULL;
        host[i] = NULL;
        device[i] = NULL;
        CHECK_STATUS(fmha_stream_create(&streams[i]), FMHA_OK);
        CHECK_STATUS(fmha_host_malloc_pinned(&host[i], BYTES), FMHA_OK);
        CHECK_STATUS(fmha_device_malloc(&device[i], BYTES), FMHA_OK);
    }
    for (i = 0; i < STREAMS; ++i) CHECK(streams[i] != NULL && host[i] != NULL && device[i] != NULL);
    for (i = 0; i < STREAMS; ++i) {
        if (streams[i] == NULL || host[i] == NULL || device[i] == NULL) continue;
        CHECK_STATUS(fmha_memset_async(device[i], 0x30 + i, BYTES, streams[i]), FMHA_OK);
        CHECK_STATUS(fmha_memcpy_async(host[i], device[i], BYTES, FMHA_MEMCPY_DEVICE_TO_HOST, streams[i]), FMHA_OK);
    }
    CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
    for (i = 0; i < STREAMS; ++i)
        if (host[i] != NULL) CHECK(all_bytes((const unsigned char *)host[i], BYTES, (unsigned char)(0x30 + i)));

    /* Work queued before a stream is destroyed still completes, and fmha_device_synchronize waits
     * for it like cudaDeviceSynchronize does (frameworks destroy streams and then synchronize). */
    for (i = 0; i < STREAMS; ++i) {
        if (streams[i] == NULL || host[i] == NULL || device[i] == NULL) continue;
        CHECK_STATUS(fmha_memset_async(device[i], 0x60 + i, BYTES, streams[i]), FMHA_OK);
        CHECK_STATUS(fmha_memcpy_async(host[i], device[i], BYTES, FMHA_MEMCPY_DEVICE_TO_HOST, streams[i]), FMHA_OK);
        CHECK_STATUS(fmha_stream_destroy(streams[i]), FMHA_OK);
    }
    CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
    for (i = 0; i < STREAMS; ++i) {
        if (host[i] != NULL) CHECK(all_bytes((const unsigned char *)host[i], BYTES, (unsigned char)(0x60 + i)));
        CHECK_STATUS(fmha_host_free_pinned(host[i]), FMHA_OK);
        CHECK_STATUS(fmha_device_free(device[i]), FMHA_OK);
    }

    CHECK_STATUS(fmha_stream_synchronize(NULL), FMHA_OK);
    CHECK_STATUS(fmha_device_synchronize(), FMHA_OK);
}

int main(void) {
    printf("fmha %s, backend %d\n", fmha_version(), (int)fmha_backend());
    if (!check_have_device()) {
        check_summary();
        return check_failed == 0 ? CHECK_EXIT_SKIPPED : 1;
    }
    test_cu_count();
    test_allocations();
    test_sync_copies();
    test_memset();
    test_streams();
    return check_summary();
}

/*
 * 00_version: which fmha is this? Prints the library's version and backend and checks that the
 * header this program was compiled with matches the library it runs with.
 *
 * Exit status: 0 on success, 1 when the header and the library disagree.
 */
#include <fmha.h>

#include <stdio.h>
#include <string.h>

static const char *backend_name(int32_t backend) {
    switch (backend) {
    case FMHA_BACKEND_HOST: return "host (CPU executor; device memory is host memory)";
    case FMHA_BACKEND_CUDA: return "cuda (NVIDIA)";
    case FMHA_BACKEND_ROCM: return "rocm (AMD)";
    default: return "unknown";
    }
}

int main(void) {
    const char *library_version = fmha_version();
    uint32_t library_number = fmha_version_number();

    printf("fmha library %s (version number %u)\n", library_version, (unsigned)library_number);
    printf("fmha header  %s (version number %u)\n", FMHA_VERSION_STRING, (unsigned)FMHA_VERSION_NUMBER);
    printf("backend      %s\n", backend_name(fmha_backend()));

    /* A program compiled against this header needs a library with the same ABI major version and
     * at least the header's version. This example is stricter and wants the exact same version. */
    if (library_number != FMHA_VERSION_NUMBER || strcmp(library_version, FMHA_VERSION_STRING) != 0) {
        fprintf(stderr, "error: header/library version mismatch: header %s (%u), library %s (%u)\n",
                FMHA_VERSION_STRING, (unsigned)FMHA_VERSION_NUMBER, library_version, (unsigned)library_number);
        return 1;
    }
    printf("header and library agree\n");
    return 0;
}

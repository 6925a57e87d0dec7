// C prototypes of every kernel launch stub compiled from hip/. Rust declares the same prototypes in
// src/runtime/launch.rs. Each stub enqueues its kernel on `stream` (a cudaStream_t / hipStream_t) and
// returns the runtime's error code of the launch (0 = success). Stubs are internal: the cdylib does
// not export them.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Sets `count` 32-bit words at `dst` to `value`.
int32_t fmha_hip_fill_u32(void* dst, uint32_t value, uint64_t count, void* stream);

#ifdef __cplusplus
}
#endif

// C prototypes of every kernel launch stub compiled from hip/. Rust declares the same prototypes in
// src/runtime/launch.rs. Each stub enqueues its kernel on `stream` (a cudaStream_t / hipStream_t) and
// returns the runtime's error code of the launch (0 = success). Stubs are internal: the cdylib does
// not export them.
#pragma once

#include <stdint.h>

#include "bwd/bwd_params.h"
#include "bwd/prepare_params.h"
#include "fwd/fwd_params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Loads each translation unit's code module onto the current device (one kernel of each; the rest of a
// loaded module's kernels load without waiting for the device). Returns the first error code, or 0.
int32_t fmha_hip_load_fill(void);
int32_t fmha_hip_load_prepare(void);
int32_t fmha_hip_load_forward(void);
int32_t fmha_hip_load_backward(void);

// Sets `count` 32-bit words at `dst` to `value`.
int32_t fmha_hip_fill_u32(void* dst, uint32_t value, uint64_t count, void* stream);

// Builds the backward workspace's metadata region at `workspace` from the device arrays `seqstart_q`
// and `seqstart_k` (`[batch + 1]` each in group mode, null in batch mode), in one thread, without
// host synchronization (bwd/prepare_workspace.h). `*params_host` is copied into the launch; invalid
// seqstarts leave an all-zero region ("not prepared").
int32_t fmha_hip_prepare_workspace(void* workspace, const int32_t* seqstart_q, const int32_t* seqstart_k,
                                   const fmha_prepare_params* params_host, void* stream);

// Runs the attention forward described by `*params` (an instance the registry listed).
int32_t fmha_hip_fwd(const fmha_fwd_params* params, void* stream);

// Runs the backward described by `*params` (an instance the registry listed) on a workspace prepared
// for it: dot_do_o, dq_acc zeroing, dq_dk_dv, convert_dq.
int32_t fmha_hip_bwd(const fmha_bwd_params* params, void* stream);

#ifdef __cplusplus
}
#endif

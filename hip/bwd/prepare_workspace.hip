// The graph-capture-safe workspace prepare (spec ck_fmha_bwd.md §4.3, CK gen C's
// FmhaBwdPrepareWorkspaceKernel): one thread builds the metadata region from the device seqstarts,
// so preparing is a plain kernel on the caller's stream, with no device-to-host copy, no host
// function and no pinned staging buffer. The routine is bwd/prepare_workspace.h, the same code the
// tests run on the CPU against the Rust prepare.
#include "arch/thread.h"
#include "bwd/prepare_workspace.h"
#include "launch.h"

namespace fmha {

// The table is a sequential scan over batches and CUs (each CU's start depends on the previous
// batches' work), a few thousand steps at most: one thread, no LDS, and nothing to gain from more.
__global__ void __launch_bounds__(1) prepare_workspace_kernel(uint8_t* workspace, const int32_t* seqstart_q,
                                                              const int32_t* seqstart_k, fmha_prepare_params params) {
  if (arch::block_index_x() != 0 || arch::thread_index() != 0) return;
  // Per-lane pointers: the seqstart loads, the stores and all arithmetic on the seqstarts run on the
  // vector unit, leaving the scalar registers to the loop state (no spills; see arch/registers.h).
  // The status has nowhere to go: a failure leaves the region zero, which `run` reports as "not prepared".
  (void)prepare::prepare_metadata(arch::in_vector_registers(workspace), arch::in_vector_registers(seqstart_q),
                                  arch::in_vector_registers(seqstart_k), params);
}

}  // namespace fmha

extern "C" int32_t fmha_hip_prepare_workspace(const fmha_prepare_args* args, void* stream) {
  // hipErrorInvalidValue / cudaErrorInvalidValue: nothing to launch on.
  constexpr int32_t kInvalidValue = 1;
  if (args == nullptr || args->workspace == 0) return kInvalidValue;
  fmha::prepare_workspace_kernel<<<dim3(1), dim3(1), 0, static_cast<hipStream_t>(stream)>>>(
      reinterpret_cast<uint8_t*>(args->workspace), reinterpret_cast<const int32_t*>(args->seqstart_q),
      reinterpret_cast<const int32_t*>(args->seqstart_k), args->params);
  return static_cast<int32_t>(hipGetLastError());
}

extern "C" int32_t fmha_hip_load_prepare(void) { return fmha::arch::load_module(fmha::prepare_workspace_kernel); }

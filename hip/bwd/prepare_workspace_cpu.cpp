// bwd/prepare_workspace.h built for the host CPU, in every backend: the tests compare its bytes with
// the Rust `workspace::prepare_metadata`, so the one C++ routine the GPU prepare kernel runs is
// checked in every CI run, without a GPU.
#include "bwd/prepare_workspace.h"

#include <stddef.h>

// Writes the metadata region described by `args->params` at the host address `args->workspace`
// (`params.metadata_bytes` bytes). Returns 0, or the fmha_status of the failure: the region is then all
// zeros (nothing is written when the workspace is null or the params are not a valid layout's).
extern "C" int32_t fmha_cpu_prepare_workspace(const fmha_prepare_args* args, void* /*unused*/) {
  using namespace fmha::prepare;
  if (args == nullptr || args->workspace == 0) return kNullPointer;
  if (args->params.metadata_bytes < 0) return kWorkspaceTooSmall;
  return prepare_metadata(reinterpret_cast<uint8_t*>(args->workspace),
                          reinterpret_cast<const int32_t*>(args->seqstart_q),
                          reinterpret_cast<const int32_t*>(args->seqstart_k), args->params);
}

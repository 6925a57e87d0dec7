// bwd/prepare_workspace.h built for the host CPU, in every backend: the tests compare its bytes with
// the Rust `workspace::prepare_metadata`, so the one C++ routine the GPU prepare kernel runs is
// checked in every CI run, without a GPU.
#include "bwd/prepare_workspace.h"

#include <stddef.h>

// Writes the metadata region described by `params` into `metadata` (`len` bytes, at least
// `params->metadata_bytes`). Returns 0, or the fmha_status of the failure: the region is then all zeros
// (nothing is written when `metadata` is too small, null, or `params` are not a valid layout's).
extern "C" int32_t fmha_cpu_prepare_workspace(uint8_t* metadata, size_t len, const int32_t* seqstart_q,
                                              const int32_t* seqstart_k, const fmha_prepare_params* params) {
  using namespace fmha::prepare;
  if (metadata == nullptr || params == nullptr) return kNullPointer;
  if (params->metadata_bytes < 0 || static_cast<uint64_t>(params->metadata_bytes) > len) return kWorkspaceTooSmall;
  return prepare_metadata(metadata, seqstart_q, seqstart_k, *params);
}

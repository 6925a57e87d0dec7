// How the backward's work units send their dQ partials to dq_acc (WorkspaceParams::ordered_dq, chosen by
// the launcher: src/bwd/dq_scheme.rs): added in any order (non-deterministic); into the persistent
// schedule's split slots, each slot summed in a fixed order and the slots summed by convert_dq
// (deterministic, CK's scheme); or added in turn into one dq_acc, the writers of each q tile counted by a
// semaphore (deterministic, FlashAttention-3's ordered scheme, bwd/dq_order.h; the NVIDIA kernel only).
#pragma once

#include "arch/registers.h"
#include "launch.h"

namespace fmha {

enum class DqScheme { kAtomic, kSplitSlots, kOrdered };

FMHA_HOST_DEVICE inline DqScheme dq_scheme(const fmha_bwd_params& p) {
  if (!p.deterministic) return DqScheme::kAtomic;
  return p.ordered_dq ? DqScheme::kOrdered : DqScheme::kSplitSlots;
}

// WorkspaceParams::split_slots.
FMHA_HOST_DEVICE inline bool split_slots(const fmha_bwd_params& p) { return dq_scheme(p) == DqScheme::kSplitSlots; }

}  // namespace fmha

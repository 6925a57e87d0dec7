// The backward kernels' view of a prepared workspace (src/workspace/): the header check, the
// per-batch dq_acc block, and the group-mode schedule records. Reads only; the layout offsets come
// from the host in fmha_bwd_params, the values from the bytes the prepare wrote.
#pragma once

#include <stdint.h>

#include "arch/registers.h"
#include "bwd/dq_scheme.h"
#include "bwd/prepare_workspace.h"
#include "launch.h"

namespace fmha {

// The metadata region's records (launch.h, generated from src/schedule/records.rs).
using CuState = fmha_cu_state;
using BatchState = fmha_batch_state;

FMHA_DEVICE inline const uint8_t* metadata(const fmha_bwd_params& p) {
  return reinterpret_cast<const uint8_t*>(p.workspace);
}

FMHA_DEVICE inline float* dq_acc_region(const fmha_bwd_params& p) {
  return reinterpret_cast<float*>(p.workspace + static_cast<uint64_t>(p.metadata_bytes));
}

// Whether the header says "prepared" (the first stage clears it when the fingerprint disagrees with
// the run's seqstarts, so every later stage of the run, and later runs, see "not prepared").
FMHA_DEVICE inline bool workspace_prepared(const fmha_bwd_params& p) {
  return *reinterpret_cast<const volatile uint32_t*>(metadata(p)) == prepare::kMagic;
}

// One thread: the fingerprint of the run's seqstarts against the header; on disagreement the header
// is cleared, so that nothing of this run is computed from metadata made for other sequences.
FMHA_DEVICE inline void check_workspace_fingerprint(const fmha_bwd_params& p) {
  uint8_t* region = reinterpret_cast<uint8_t*>(p.workspace);
  const int32_t* q = reinterpret_cast<const int32_t*>(p.seqstart_q);
  const int32_t* k = reinterpret_cast<const int32_t*>(p.seqstart_k);
  uint64_t h = prepare::absorb_seqstart(p.fingerprint_params, q, p.batch);
  h = prepare::absorb_seqstart(h, k, p.batch);
  const uint32_t magic = *reinterpret_cast<const uint32_t*>(region);
  const uint64_t stored = *reinterpret_cast<const uint64_t*>(region + 8);
  if (magic != prepare::kMagic || stored != h) *reinterpret_cast<uint32_t*>(region) = 0;
}

FMHA_DEVICE inline int32_t nsplits_of(const fmha_bwd_params& p, int32_t b) {
  return reinterpret_cast<const int32_t*>(metadata(p) + p.nsplits_offset)[b];
}

FMHA_DEVICE inline int64_t dq_acc_offset(const fmha_bwd_params& p, int32_t b) {
  return reinterpret_cast<const int64_t*>(metadata(p) + p.dq_acc_offsets_offset)[b];
}

FMHA_DEVICE inline CuState cu_state(const fmha_bwd_params& p, int32_t cu) {
  return reinterpret_cast<const CuState*>(metadata(p) + p.cu_state_offset)[cu];
}

FMHA_DEVICE inline BatchState batch_state(const fmha_bwd_params& p, int32_t b) {
  return reinterpret_cast<const BatchState*>(metadata(p) + p.batch_state_offset)[b];
}

// Whether the split-slot dq_dk_dv kernel of this platform writes every row of a split slot in a
// worker's first unit there (WorkUnit::first_in_slot), as the host executor does: the NVIDIA kernel.
// The AMD kernel adds in every unit, into slots zeroed before it (CK's rule, §3.5).
#if defined(FMHA_PLATFORM_NVIDIA)
constexpr bool kFirstUnitWritesSlot = true;
#else
constexpr bool kFirstUnitWritesSlot = false;
#endif

// 4-byte words a run zeroes from the start of dq_acc before dq_dk_dv (WorkspaceLayout::needs_zero_dq_acc
// and zero_dq_acc_elements): none with split slots in batch mode where first units write their slots
// (convert_dq reads only written ones), the used prefix with split slots in group mode, else the whole
// region, and the ordered scheme's semaphores after it.
FMHA_HOST_DEVICE inline bool dq_acc_needs_zeroing(const fmha_bwd_params& p) {
  return !split_slots(p) || p.group_mode || !kFirstUnitWritesSlot;
}

// The most words dq_acc_words_to_zero returns (dq_acc and the semaphores), which the host sizes the
// zeroing grid by: it cannot read the group-mode prefix's length from device memory.
FMHA_HOST_DEVICE inline int64_t dq_acc_words_bound(const fmha_bwd_params& p) {
  return p.dq_acc_elements + p.dq_semaphore_words;
}

FMHA_DEVICE inline int64_t dq_acc_words_to_zero(const fmha_bwd_params& p) {
  if (!dq_acc_needs_zeroing(p)) return 0;
  if (!(split_slots(p) && p.group_mode)) return dq_acc_words_bound(p);
  const int64_t used = dq_acc_offset(p, p.batch);
  return used < p.dq_acc_elements ? used : p.dq_acc_elements;
}

// `WorkspaceLayout::dq_acc_block`: batch b's block is [nhead_k][nsplits][rows][group * hdim_q] fp32 (the
// work unit is one kv head; its query heads share a row of group * hdim_q).
struct DqAccBlock {
  int64_t base, rows, row_elements;
  int32_t nsplits;

  FMHA_DEVICE int64_t index(int32_t head, int32_t split, int64_t row, int64_t col) const {
    return base + ((int64_t(head) * nsplits + split) * rows + row) * row_elements + col;
  }
};

FMHA_DEVICE inline DqAccBlock dq_acc_block(const fmha_bwd_params& p, int32_t b) {
  DqAccBlock a;
  const int64_t heads = p.nhead_k;
  a.row_elements = int64_t(p.nhead_q / p.nhead_k) * p.hdim_q;
  if (!p.group_mode) {
    a.nsplits = nsplits_of(p, 0);
    a.rows = p.seqlen_q;
    a.base = int64_t(b) * heads * a.nsplits * a.rows * a.row_elements;
  } else if (!split_slots(p)) {
    const int32_t* s = reinterpret_cast<const int32_t*>(p.seqstart_q);
    a.nsplits = 1;
    a.rows = s[b + 1] - s[b];
    a.base = int64_t(s[b]) * heads * a.row_elements;
  } else {
    const int64_t lo = dq_acc_offset(p, b), hi = dq_acc_offset(p, b + 1);
    a.nsplits = nsplits_of(p, b);
    a.base = lo;
    const int64_t per_row = heads * a.nsplits * a.row_elements;
    a.rows = per_row > 0 ? (hi - lo) / per_row : 0;
  }
  return a;
}

}  // namespace fmha

// What every dq_dk_dv kernel (NVIDIA wgmma, AMD MFMA) does around its tile math: which work units a
// workgroup runs (one per grid cell, or its persistent-schedule range in deterministic mode), and,
// within a unit, which q tiles of which query heads it visits and which of them need per-element
// mask tests. The arch kernels supply only the per-unit compute.
#pragma once

#include <stdint.h>

#include "arch/thread.h"
#include "launch.h"
#include "bwd/dq_order.h"
#include "bwd/schedule.h"
#include "bwd/workspace_view.h"
#include "common/sequence.h"
#include "common/zero_floats.h"

namespace fmha {

// The rows of one q tile of one query head: where its Q, dO, LSE and D start.
struct QTile {
  int i0;  // first row (logical, within the batch)
  int h;   // query head
};

// The q tiles of a unit's K tile [j0, j0 + kBlockN): the query rows any key of the tile keeps
// (mask.rs `query_range`), in kBlockM-aligned tiles, for each query head of the kv head's group.
//
// Rows and keys are 32-bit here (a batch's lengths are int32): the fields stay live across a unit's
// q tiles, next to the dK/dV accumulators, where the GPU kernels have no register to spare. Values
// that the mask can push outside [0, sq] are clamped into it with the same meaning.
//
// kRotated (the ordered dQ's unmasked walks, bwd/dq_order.h's rotated_walks): where `rotated`, the walk
// starts at step `rotation` (the unit's K tile) and wraps around.
template <int kBlockM, int kBlockN, bool kMasked, bool kRotated = false>
struct UnitQTiles {
  BatchRows rows;
  ResolvedMask mask;
  int64_t steps;  // tiles_per_head · group
  int batch;      // the batch index of the tensor addresses (0 in group mode)
  int j0, j1;     // the unit's keys [j0, j1), j1 clipped to the batch's keys
  int i_start, tiles_per_head;
  int group, first_head;
  // 1: walk the steps last to first. (An int, as every field is 4 or 8 bytes: the struct has no padding
  // bytes, so the AMD emulation can check that all lanes of a wave hold the same walk.)
  int reversed;
  // q tiles that start at or past interior_lo and end at or before interior_hi keep every element:
  // from the first row that keeps the unit's last key to the last row that keeps its first key
  // (clamped to [-1, sq]).
  int interior_lo, interior_hi;
  int rotated, rotation;

  __device__ UnitQTiles(const fmha_bwd_params& p, const WorkUnit& unit) {
    rows = batch_rows(p, unit.batch);
    batch = p.group_mode ? 0 : unit.batch;
    group = p.nhead_q / p.nhead_k;
    first_head = unit.head * group;
    const int64_t key0 = int64_t(unit.k_tile) * kBlockN;
    j0 = key0 < rows.sk ? static_cast<int>(key0) : rows.sk;
    j1 = key0 + kBlockN < rows.sk ? static_cast<int>(key0) + kBlockN : rows.sk;
    mask = resolve_mask(p.mask_type, p.window_left, p.window_right, rows.sq, rows.sk);
    int64_t i_lo = 0, i_hi = rows.sq;
    if (kMasked) {
      const int64_t lo = j0 - mask.off - mask.right, hi = int64_t(j1) - 1 - mask.off + mask.left + 1;
      i_lo = lo > 0 ? lo : 0;
      i_hi = hi < rows.sq ? hi : rows.sq;
    }
    const bool any = key0 < rows.sk && i_lo < i_hi;
    i_start = any ? static_cast<int>(i_lo / kBlockM * kBlockM) : 0;
    tiles_per_head = any ? static_cast<int>((i_hi - i_start + kBlockM - 1) / kBlockM) : 0;
    steps = int64_t(tiles_per_head) * group;
    // Deterministic mode: a worker runs consecutive K tiles of one head, each streaming the head's
    // Q, dO and dq_acc rows, more than the L2 keeps for every worker at once (an H200 read 59 % of its
    // DRAM bandwidth). Walking every other unit backwards starts each unit on the rows the previous
    // one touched last. (Non-deterministic units of a head run side by side and share the rows in
    // L2 when they walk in step.) The order is fixed per unit, so the sums stay reproducible.
    reversed = split_slots(p) && (unit.k_tile & 1) ? 1 : 0;
    interior_lo = clamp_row(int64_t(j0) + kBlockN - 1 - mask.off - mask.right, rows.sq);
    interior_hi = clamp_row(j0 - mask.off + mask.left, rows.sq);
    rotated = kRotated && rotated_walks(kMasked, k_tiles(), steps, p.num_cus) ? 1 : 0;
    rotation = rotated ? unit.k_tile : 0;
  }

  // K tiles with keys of the unit's batch.
  __device__ int k_tiles() const { return (rows.sk + kBlockN - 1) / kBlockN; }

  // The step of tile `t` in the unrotated walk.
  __device__ int step_of(const QTile& t) const { return (t.h - first_head) * tiles_per_head + (t.i0 - i_start) / kBlockM; }

  // Whether the unit has keys at all (a tile past this batch's keys: padding or a shorter batch).
  __device__ bool has_keys() const { return j0 < rows.sk; }

  __device__ static int clamp_row(int64_t row, int sq) {
    return static_cast<int>(row < -1 ? -1 : (row > sq ? sq : row));
  }

  // Step `step` (< steps) of the walk; a unit with no steps gets its first row, unused.
  __device__ QTile tile(int64_t step) const {
    if (steps == 0) return QTile{i_start, first_head};
    if (reversed) step = steps - 1 - step;
    if constexpr (kRotated) step = (step + rotation) % steps;
    QTile t;
    t.h = first_head + static_cast<int>(step / tiles_per_head);
    t.i0 = i_start + static_cast<int>(step % tiles_per_head) * kBlockM;
    return t;
  }

  // The tile after `t` in step order: tile(step + 1) for t = tile(step), without its 64-bit division.
  __device__ QTile next(const QTile& t) const {
    QTile n = t;
    if (!reversed) {
      n.i0 += kBlockM;
      if (n.i0 >= i_start + tiles_per_head * kBlockM) {
        n.i0 = i_start;
        ++n.h;
        if (kRotated && n.h == first_head + group) n.h = first_head;
      }
    } else {
      n.i0 -= kBlockM;
      if (n.i0 < i_start) {
        n.i0 = i_start + (tiles_per_head - 1) * kBlockM;
        --n.h;
      }
    }
    return n;
  }

  // A workgroup's first unit in its split slot (WorkUnit::first_in_slot) writes all of the slot where the
  // arch kernel supports it (kFirstUnitWritesSlot): its steps store their dQ partials, and this zeroes
  // the rows no step visits ([0, i_start) and the rows past the last tile, every query head's
  // columns), so that no pass zeroes the slot beforehand. `slot` is row 0 of the unit's slot, rows of
  // `row_elements` (16-byte aligned); `thread` of the kThreads that zero.
  template <int kThreads>
  __device__ void zero_unvisited_rows(float* slot, int64_t row_elements, int thread) const {
    const int end = i_start + tiles_per_head * kBlockM;
    const int lo = steps > 0 ? i_start : rows.sq, hi = steps > 0 && end < rows.sq ? end : rows.sq;
    zero_floats(slot, int64_t(lo) * row_elements, thread, kThreads);
    zero_floats(slot + int64_t(hi) * row_elements, int64_t(rows.sq - hi) * row_elements, thread, kThreads);
  }

  // Whether the q tile needs the per-element test: keys past the batch's end, or rows the mask cuts.
  __device__ bool edge(const QTile& t) const {
    return int64_t(j0) + kBlockN > rows.sk ||
           (kMasked && (t.i0 < interior_lo || int64_t(t.i0) + kBlockM - 1 > interior_hi));
  }
};

// Calls run(unit) for each unit of this workgroup: with kSplitSlots (deterministic split slots)
// the grid is the persistent one and the workgroup walks its schedule range; otherwise the grid is
// (K tiles, kv heads, batches) and the workgroup's cell is its unit (under a causal mask the first K
// tiles see the most query rows, so the natural order starts the longest units first, except for the
// ordered dQ's turns).
template <bool kSplitSlots, typename Run>
__device__ inline void for_each_unit(const fmha_bwd_params& p, bool masked, Run&& run) {
  if constexpr (kSplitSlots) {
    const int32_t worker = static_cast<int32_t>(arch::block_index_x());
    if (p.group_mode) {
      for_each_group_job(p, worker, masked, run);
    } else {
      for_each_batch_job(p, worker, masked, run);
    }
  } else {
    WorkUnit unit;
    // The ordered dQ (bwd/dq_order.h) launches masked K tiles last to first: a unit then waits only for
    // the turns of units launched before it.
    const uint32_t x = arch::block_index_x();
    unit.k_tile = static_cast<int32_t>(p.ordered_dq && masked ? arch::grid_blocks_x() - 1 - x : x);
    unit.head = static_cast<int32_t>(arch::block_index_y());
    unit.batch = static_cast<int32_t>(arch::block_index_z());
    unit.split = 0;
    unit.first_in_slot = 0;
    run(unit);
  }
}

// The grid of a dq_dk_dv launch, matching for_each_unit; x = 0 means nothing to launch.
struct UnitGrid {
  uint32_t x, y, z;
};

inline UnitGrid dq_dk_dv_grid(const fmha_bwd_params& p, bool split_slots, int block_n) {
  if (split_slots) return UnitGrid{static_cast<uint32_t>(p.num_cus), 1, 1};
  const uint32_t tiles = p.max_seqlen_k > 0 ? static_cast<uint32_t>((p.max_seqlen_k + block_n - 1) / block_n) : 0;
  return UnitGrid{tiles, static_cast<uint32_t>(p.nhead_k), static_cast<uint32_t>(p.batch)};
}

}  // namespace fmha

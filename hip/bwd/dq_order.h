// The ordered deterministic dQ (the NVIDIA kernel's scheme; src/launch/dq_order.rs and
// WorkspaceLayout::dq_semaphore are the Rust twins): every unit adds its dQ partial of a q tile into the
// one dq_acc in its turn, the writers of each (batch, query head, q tile) counted by an int32 semaphore
// after the dq_acc region, zeroed with it.
#pragma once

#include <stdint.h>

#include "arch/registers.h"
#include "launch.h"

namespace fmha {

// Whether the unmasked units of one (batch, kv head), `k_tiles` of them (those with keys), each walking
// `steps` q tiles, start their walks rotated, unit k at step k: then the writers of a q tile reach it one
// step apart instead of queueing behind each other. A unit may wait for units launched after it, so all
// of a (batch, kv head)'s units must be resident at once (one per compute unit): at most half the device's
// compute units, a margin for a device shared with other processes (MPS), whose count it still reports.
FMHA_HOST_DEVICE inline bool rotated_walks(bool masked, int64_t k_tiles, int64_t steps, int64_t num_cus) {
  return !masked && k_tiles <= steps && k_tiles <= num_cus / 2;
}

// Rotated walks: the turn of K tile `k_tile` at step `step` of the unrotated walk (the tile's index among
// the unit's q tiles, query head major): the order in which the units reach it, step (step - k) mod steps.
FMHA_HOST_DEVICE inline int64_t rotated_write_turn(int64_t k_tiles, int64_t k_tile, int64_t step) {
  if (k_tile > step) return step + k_tiles - k_tile;
  return (step < k_tiles - 1 ? step : k_tiles - 1) - k_tile;
}

// The turn of K tile `k_tile` among the units that add to q tile `q_tile` (rows [q_tile · m0, ...) of
// sq), where the walks are not rotated: unmasked its index; masked, counted down from the last K tile
// whose keys the tile's rows keep (row i keeps keys up to i + off + right), so that the diagonal unit,
// which starts on this tile, goes first. For units that visit the tile.
FMHA_HOST_DEVICE inline int64_t dq_write_turn(bool masked, int64_t off, int64_t right, int64_t sq, int64_t sk,
                                              int64_t m0, int64_t n0, int64_t k_tile, int64_t q_tile) {
  if (!masked) return k_tile;
  const int64_t rows_end = (q_tile + 1) * m0 < sq ? (q_tile + 1) * m0 : sq;
  const int64_t keys_end = rows_end + off + right < sk ? rows_end + off + right : sk;
  return (keys_end + n0 - 1) / n0 - 1 - k_tile;
}

// The semaphore of query head `head`'s q tile `tile` of batch `b`, whose rows start at `q_start` (group
// mode): per (batch, head, tile) in batch mode; group mode places a sequence's tiles at
// q_start / m0 + b, past its predecessors' whatever its start against m0.
FMHA_HOST_DEVICE inline int64_t dq_semaphore(const fmha_bwd_params& p, int64_t b, int64_t q_start, int64_t head,
                                             int64_t tile) {
  const int64_t tiles = (int64_t(p.seqlen_q) + p.m0 - 1) / p.m0;
  return p.group_mode ? head * (tiles + p.batch) + q_start / p.m0 + b + tile
                      : (b * p.nhead_q + head) * tiles + tile;
}

}  // namespace fmha

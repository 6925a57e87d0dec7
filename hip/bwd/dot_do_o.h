// Stage 1 of the backward: D[i] = Σ_d dO[i, d] · O[i, d] per query row, fp32, in the LSE layout
// (host twin: src/launch/host/backward/dot_do_o.rs), and the zeroing of the dq_acc elements stage 2 adds
// into without writing them first (FlashAttention-3's preprocess does both: one launch fewer). Block 0's
// first thread also checks the workspace's fingerprint against the run's seqstarts (workspace_view.h)
// before the later stages read the metadata. Head dims are multiples of 8 and rows 16-byte aligned (the
// registry's rule), so a lane reads 16-byte vectors; kLanesPerRow lanes share a row.
#pragma once

#include "arch/convert.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/workspace_view.h"
#include "common/sequence.h"
#include "common/zero_floats.h"

namespace fmha {

constexpr int kDotThreads = 256;
constexpr int kDotLanesPerRow = 8;
constexpr int kDotRows = 64;  // rows per block
// The zeroing's share: blocks enough for a 16-byte store per thread, at most this many.
constexpr int64_t kMaxZeroBlocks = 4096;

// (q tiles of `rows_per_block` rows, query heads, batches): the grid of the row stages (dot_do_o, convert_dq).
inline dim3 row_tiles_grid(const fmha_bwd_params& p, int rows_per_block) {
  const int tiles = (p.max_seqlen_q + rows_per_block - 1) / rows_per_block;
  return dim3(tiles > 0 ? tiles : 1, p.nhead_q, p.batch);
}

// This stage's grid: row_tiles_grid's, with more q tiles where the zeroing wants more blocks than that
// (blocks past a sequence's rows only zero).
inline dim3 dot_do_o_grid(const fmha_bwd_params& p) {
  dim3 grid = row_tiles_grid(p, kDotRows);
  if (dq_acc_needs_zeroing(p)) {
    int64_t zero_blocks = (dq_acc_words_bound(p) / 4 + kDotThreads - 1) / kDotThreads;
    zero_blocks = zero_blocks < kMaxZeroBlocks ? zero_blocks : kMaxZeroBlocks;
    const int64_t heads_and_batches = int64_t(p.nhead_q) * p.batch;
    const int64_t zero_tiles = (zero_blocks + heads_and_batches - 1) / heads_and_batches;
    if (zero_tiles > grid.x) grid.x = static_cast<uint32_t>(zero_tiles);
  }
  return grid;
}

struct Vector16 {
  uint32_t w[4];
};

template <bool kBf16>
__device__ inline float dot8(const Vector16& a, const Vector16& b) {
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // (contracted to fused multiply-adds by both GPU compilers)
    sum += arch::to_float<kBf16>(uint16_t(a.w[i])) * arch::to_float<kBf16>(uint16_t(b.w[i]));
    sum += arch::to_float<kBf16>(uint16_t(a.w[i] >> 16)) * arch::to_float<kBf16>(uint16_t(b.w[i] >> 16));
  }
  return sum;
}

template <bool kBf16>
__global__ void __launch_bounds__(kDotThreads) dot_do_o_kernel(fmha_bwd_params p) {
  if (arch::block_index_x() == 0 && arch::block_index_y() == 0 && arch::block_index_z() == 0 &&
      arch::thread_index() == 0) {
    check_workspace_fingerprint(p);
  }
  const int h = arch::block_index_y(), b = arch::block_index_z();
  const BatchRows rows = batch_rows(p, b);
  const int64_t batch = p.group_mode ? 0 : b;
  const int lane = arch::thread_index() % kDotLanesPerRow;
  const int chunks = p.hdim_v / 8;
  for (int r = arch::thread_index() / kDotLanesPerRow; r < kDotRows; r += kDotThreads / kDotLanesPerRow) {
    const int64_t i = int64_t(arch::block_index_x()) * kDotRows + r;
    const bool valid = i < rows.sq;
    const int64_t row = rows.q_start + i;
    float sum = 0.f;
    if (valid) {
      const uint16_t* o = reinterpret_cast<const uint16_t*>(p.o) + batch * p.o_batch_stride +
                          h * p.o_head_stride + row * p.o_row_stride;
      const uint16_t* d_o = reinterpret_cast<const uint16_t*>(p.d_o) + batch * p.do_batch_stride +
                            h * p.do_head_stride + row * p.do_row_stride;
      for (int c = lane; c < chunks; c += kDotLanesPerRow) {
        sum += dot8<kBf16>(*reinterpret_cast<const Vector16*>(o + c * 8),
                           *reinterpret_cast<const Vector16*>(d_o + c * 8));
      }
    }
    // The row's lanes are consecutive and aligned: a butterfly over the low lane bits. Every lane runs
    // the same number of iterations, so the whole warp takes part.
#pragma unroll
    for (int m = 1; m < kDotLanesPerRow; m *= 2) sum += arch::shuffle_xor(sum, m);
    if (valid && lane == 0) {
      reinterpret_cast<float*>(p.d)[batch * p.d_batch_stride + h * p.d_head_stride + row] = sum;
    }
  }
  // The zeroing, every thread of the grid striding over dq_acc. Its element count is read from the
  // metadata in group mode with split slots, clamped to the region (workspace_view.h), so a header that
  // block 0 clears concurrently (a workspace prepared for other sequences) never sends it out of bounds;
  // the later stages compute nothing from such a workspace.
  const int64_t block = arch::block_index_x() +
                        int64_t(arch::grid_blocks_x()) * (arch::block_index_y() + int64_t(arch::grid_blocks_y()) * b);
  const int64_t blocks = int64_t(arch::grid_blocks_x()) * arch::grid_blocks_y() * arch::grid_blocks_z();
  zero_floats(dq_acc_region(p), dq_acc_words_to_zero(p), block * kDotThreads + arch::thread_index(),
              blocks * kDotThreads);
}

}  // namespace fmha

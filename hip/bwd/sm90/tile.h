// The backward's (dq_dk_dv) tile on Hopper (sm_90a): the workgroup's shape (two consumer warpgroups, q
// steps of kBlockM rows, a producer warpgroup) and its shared-memory layout (K, V, stages of Q, dO, LSE
// and D, two of dSᵀ, each consumer warp's dQ rows on their way to dq_acc, the pipeline's barriers).
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "bwd/dq_scheme.h"

namespace fmha {

// Warpgroup w's half (kPartCols columns) of a product's columns split between the two consumer
// warpgroups, such that each wgmma B operand (N-major, 128-byte swizzle) lies within whole 64-column
// blocks or half of one: first w's own kWhole blocks, then, where kPartCols is not a multiple of 64, its
// 32 columns of the block after both warpgroups' whole ones (from byte 64 · w of that block's rows).
// 192 columns: w = 0 takes 0–63 and 128–159, w = 1 64–127 and 160–191; 64: 32 · w on; 128, 256: w's blocks.
template <int kPartCols>
struct ColumnPart {
  static constexpr int kWhole = kPartCols / 64;
  static constexpr int kHalf = kPartCols % 64;
  static constexpr int kTiles = kPartCols / 8;  // 8-column tiles: the whole blocks' first
  static_assert(kHalf == 0 || kHalf == 32, "whole blocks and at most half of one");
  // The column of the part's 8-column tile n.
  __device__ static int column(int w, int n) {
    return n < 8 * kWhole ? w * 64 * kWhole + 8 * n : 128 * kWhole + 32 * w + 8 * (n - 8 * kWhole);
  }
  // Byte offsets of the whole blocks and of the half block in a Swizzle128 tile of `block_bytes` blocks.
  __device__ static uint32_t whole_offset(int w, uint32_t block_bytes) { return w * kWhole * block_bytes; }
  __device__ static uint32_t half_offset(int w, uint32_t block_bytes) { return 2 * kWhole * block_bytes + 64 * w; }
};

// A producer copy's shape (shared_tile.h's TileCopy) for rows of kChunks 16-byte chunks: the most of
// kMaxThreads that a whole number of rows takes (every thread copies one column of chunks; 24 chunks, D =
// 192, take 120 of 128); the others copy nothing.
template <int kMaxThreads, int kChunks_, int kUnroll_>
struct CopyShape {
  static constexpr int kChunks = kChunks_;
  static constexpr int kThreads = kMaxThreads / kChunks * kChunks;
  static constexpr int kUnroll = kUnroll_;
  // Whether thread `thread` (of the kMaxThreads) copies. (Known at compile time where all of them do.)
  __device__ static bool copies(int thread) { return kThreads == kMaxThreads || thread < kThreads; }
};

template <int kHeadDim, int kHeadDimV, int kWarps_, int kBlockM_, bool kMasked_, DqScheme kDqScheme_>
struct BackwardTile {
  static constexpr int kWarps = kWarps_;  // of the consumers, which compute
  static constexpr int kConsumerThreads = kWarps * arch::kWarpSize;
  // A producer warpgroup loading ahead of the consumers through mbarrier stages (bwd/sm90/kernel.h).
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // setmaxnreg: the producer keeps what its copy loops need, the consumers take the rest of the CTA's pool
  // (3 × 168 at launch).
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = (3 * 168 - kProducerRegisters) / 2 / 8 * 8;
  // Up to D = 128 each consumer warpgroup owns 64 keys and all of their dK/dV columns. Past that (D = 256,
  // Q/K 192 with V 128) dK and dV of 64 keys would take 160–256 registers a thread: both warpgroups own
  // the same 64 keys and each half of dK's and of dV's columns (FlashAttention-3's split at D = 256,
  // ColumnPart); each computes Sᵀ and dPᵀ of half the q tile's rows, and both read the whole Pᵀ and dSᵀ
  // from shared memory (bwd/sm90/mainloop.h's accumulate_dk_dv_halves).
  static constexpr int kKeyGroups = kHeadDim <= 128 && kHeadDimV <= 128 ? 2 : 1;
  static constexpr int kColumnParts = 2 / kKeyGroups;
  static constexpr int kBlockN = 64 * kKeyGroups;
  static constexpr int kDkCols = kHeadDim / kColumnParts;  // of dK, per warpgroup
  static constexpr int kDvCols = kHeadDimV / kColumnParts;  // of dV
  using DkPart = ColumnPart<kDkCols>;  // (column-split tiles)
  using DvPart = ColumnPart<kDvCols>;
  static constexpr int kBlockM = kBlockM_;
  // Stages of Q, dO, LSE and D: two (one at D = 256, whose two would not fit beside K, V and the dQ rows).
  static constexpr int kQStages = kHeadDim + kHeadDimV <= 320 ? 2 : 1;
  static constexpr bool kMasked = kMasked_;
  static constexpr DqScheme kDqScheme = kDqScheme_;
  static constexpr bool kSplitSlots = kDqScheme == DqScheme::kSplitSlots;
  static constexpr bool kOrdered = kDqScheme == DqScheme::kOrdered;
  // The ordered dQ's unmasked units start their q walks rotated (bwd/dq_order.h's rotated_walks).
  static constexpr bool kRotatedWalks = kOrdered && !kMasked;
  static constexpr int kDim = kHeadDim;     // of Q and K
  static constexpr int kDimV = kHeadDimV;   // of V and dO
  static constexpr int kChunks = kHeadDim / 8;    // 16-byte chunks of a Q/K row
  static constexpr int kChunksV = kHeadDimV / 8;  // of a V/dO row
  static constexpr int kMChunks = kBlockM / 8;    // of a dSᵀ row
  // The wgmma shapes compiled in arch/nvidia/warpgroup.h: Sᵀ and dPᵀ are 64 keys × kBlockM, dK and dV
  // 64 keys × their parts' blocks, each warpgroup's part of dQ kBlockM × kDim / 2.
  static_assert(kWarps == 8 && kBlockM == 64 &&
                    ((kHeadDim == kHeadDimV && (kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256)) ||
                     (kHeadDim == 192 && kHeadDimV == 128)),
                "wgmma tile shapes");
  static_assert(kMChunks == 8, "dSᵀ rows are one 128-byte swizzle block");
  // dQ = dS·K: warpgroup w computes its DqPart of the columns of the kBlockM rows.
  static constexpr int kDqCols = kDim / 2;
  using DqPart = ColumnPart<kDqCols>;
  // K and V (Q and dO) share their rows' layout, 64-column blocks of kBlockN (kBlockM) rows: V's (dO's)
  // tile is K's (Q's) first kChunksV chunks.
  using KVLayout = Swizzle128<kChunks, kBlockN>;
  using QLayout = Swizzle128<kChunks, kBlockM>;
  using DsLayout = Swizzle128<kMChunks, kBlockN>;  // dSᵀ: kBlockN key rows of kBlockM q columns
  // The producer warpgroup's copies (shared_tile.h's TileCopy shape), 4 chunks a loop trip: unrolled
  // whole, its loops spill at 40 registers. K and V take all four warps; with ordered dQ the q
  // tiles take three (kStepThreads), the last warp being the dQ writer, which sends the consumers' dQ
  // boxes in their turn (bwd/sm90/kernel.h's write_dq_in_turn).
  static constexpr int kStepThreads = kOrdered ? 96 : kProducerThreads;
  using Loader = CopyShape<kProducerThreads, kChunks, 4>;
  using LoaderV = CopyShape<kProducerThreads, kChunksV, 4>;
  using StepLoader = CopyShape<kStepThreads, kChunks, 4>;
  using StepLoaderV = CopyShape<kStepThreads, kChunksV, 4>;
  // Shared memory (bytes), from a 1024-byte boundary: K, V, two stages of dSᵀ (and of Pᵀ), the stages of Q
  // and dO, two places each for LSE and D (one stage leaves one unused: the dQ rows after them start
  // 1024-aligned), the consumer warps' dQ rows, the barriers, the posted units.
  static constexpr int kKBytes = kBlockN * kDim * 2;
  static constexpr int kVBytes = kBlockN * kDimV * 2;
  static constexpr int kQBytes = kBlockM * kDim * 2;
  static constexpr int kDoBytes = kBlockM * kDimV * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kPBytes = kColumnParts == 2 ? kDsBytes : 0;  // Pᵀ, shared by the warpgroups
  static constexpr int kRowStatBytes = kBlockM * 4;
  // dQ leaves through shared memory: each consumer warp's 16 rows of its warpgroup's kDqCols columns in
  // fp32, as boxes of 32 columns (128 bytes, the 128-byte swizzle) that one lane sends to the dq_acc slot.
  static constexpr int kDqBoxRows = 16;
  static constexpr int kDqBoxBytes = kDqBoxRows * 128;
  static constexpr int kDqRowsBytes = kDqCols / 32 * kDqBoxBytes;
  // mbarriers: K/V full and empty, two places for the stages of Q (with dO, LSE, D) full and empty; with
  // ordered dQ the consumers' dQ boxes full (one per writer lane: even and odd steps) and empty (the dQ
  // writer's).
  static constexpr int kBarrierBytes = (kOrdered ? 9 : 6) * 8;
  // With split slots: the units posted from the persistent schedule (bwd/sm90/kernel.h's PostedUnits,
  // 8-aligned after the barriers).
  static constexpr int kPostedUnitsBytes = kSplitSlots ? 128 : 0;
  static constexpr int kTilesBytes =
      kKBytes + kVBytes + 2 * (kDsBytes + kPBytes) + kQStages * (kQBytes + kDoBytes) + 4 * kRowStatBytes;
  static constexpr int kSharedBytes =
      kTilesBytes + kWarps * kDqRowsBytes + kBarrierBytes + kPostedUnitsBytes + kSwizzle128Slack;
  static_assert(kSharedBytes <= 227 * 1024, "Hopper's shared memory per CTA");
  static_assert(kTilesBytes % 1024 == 0, "the dQ boxes start 1024-aligned (the 128-byte swizzle)");

  // Step `ring` of the workgroup's walk: its stage of Q, dO, LSE and D, and that stage's barrier phase.
  __device__ static int q_stage(int ring) { return kQStages == 1 ? 0 : ring & 1; }
  __device__ static uint32_t q_phase(int ring) { return (static_cast<uint32_t>(ring) / kQStages) & 1; }
  // Warpgroup w's 64 keys (from the tile's key 64 · key_group(w)) and its part of dK/dV's columns.
  __device__ static int key_group(int warpgroup) { return kKeyGroups == 1 ? 0 : warpgroup; }
  __device__ static int column_part(int warpgroup) { return kColumnParts == 1 ? 0 : warpgroup; }
  // The column of 8-column tile n of warpgroup w's dK, dV.
  __device__ static int dk_column(int w, int n) { return kColumnParts == 1 ? 8 * n : DkPart::column(w, n); }
  __device__ static int dv_column(int w, int n) { return kColumnParts == 1 ? 8 * n : DvPart::column(w, n); }
  // The first of warp w's 16 keys in the tile.
  __device__ static int warp_key(int warp) { return kKeyGroups == 1 ? warp % 4 * 16 : warp * 16; }
};

// Shared-memory addresses (32-bit shared window) of one workgroup's buffers. Stages are selected by
// arithmetic, not by indexing an array: a runtime index into an array would put it in local memory.
template <typename Tile>
struct BackwardShared {
  uint32_t k, v, ds0, p0, q0, d_o0, lse0, d0, dq0, barriers, posted_units;

  __device__ explicit BackwardShared(unsigned char* bytes) {
    k = swizzle128_base(bytes);
    v = k + Tile::kKBytes;
    ds0 = v + Tile::kVBytes;                       // two stages of dSᵀ
    p0 = ds0 + 2 * Tile::kDsBytes;                 // two stages of Pᵀ (column-split tiles)
    q0 = p0 + 2 * Tile::kPBytes;                   // the stages of Q
    d_o0 = q0 + Tile::kQStages * Tile::kQBytes;     // of dO
    lse0 = d_o0 + Tile::kQStages * Tile::kDoBytes;  // of LSE
    d0 = lse0 + 2 * Tile::kRowStatBytes;           // of D
    dq0 = d0 + 2 * Tile::kRowStatBytes;   // each consumer warp's dQ rows
    barriers = dq0 + Tile::kWarps * Tile::kDqRowsBytes;
    posted_units = barriers + Tile::kBarrierBytes;
  }
  __device__ uint32_t ds(int stage) const { return ds0 + stage * Tile::kDsBytes; }
  __device__ uint32_t p(int stage) const { return p0 + stage * Tile::kPBytes; }
  __device__ uint32_t q(int stage) const { return q0 + stage * Tile::kQBytes; }
  __device__ uint32_t d_o(int stage) const { return d_o0 + stage * Tile::kDoBytes; }
  __device__ uint32_t lse(int stage) const { return lse0 + stage * Tile::kRowStatBytes; }
  __device__ uint32_t d(int stage) const { return d0 + stage * Tile::kRowStatBytes; }
  __device__ uint32_t dq_rows(int warp) const { return dq0 + warp * Tile::kDqRowsBytes; }
  // K and V loaded (every producer thread's arrival) / released (every consumer thread's).
  __device__ uint32_t full_kv() const { return barriers; }
  __device__ uint32_t empty_kv() const { return barriers + 8; }
  // Stage s of Q, dO, LSE and D loaded / released.
  __device__ uint32_t full_q(int stage) const { return barriers + 16 + 8 * stage; }
  __device__ uint32_t empty_q(int stage) const { return barriers + 32 + 8 * stage; }
  // Ordered dQ: every consumer warp's dQ boxes of step `step` written (each warp's arrival; one barrier
  // for even steps, one for odd, as the dQ writer's two lanes take them) / read (the writer's).
  __device__ uint32_t dq_full(int step) const { return barriers + 48 + 8 * (step & 1); }
  __device__ uint32_t dq_empty() const { return barriers + 64; }
};

}  // namespace fmha

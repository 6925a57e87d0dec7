// The warp-specialized forward's tile on Hopper (sm_90a): one producer warp that copies, two or three
// consumer warpgroups of 64 query rows each that compute, and the shared memory between them: Q, then
// kStages stages of K and of V (the wgmma 128-byte swizzle; 8-bit inputs: V staging tiles, then kStages
// Vᵀ tiles), then the pipeline's mbarriers.
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "fwd/sm90/tile.h"
#include "fwd/sm90/tile_queue.h"

namespace fmha {

// kHeadDim: the columns of Q and K; kHeadDimV those of V and O. kGather_: the producer is a whole
// warpgroup that gathers the K and V tiles row by row with cp.async (a paged pool whose pages are too
// small for TMA boxes to stream at the memory's rate); otherwise one warp loads them with TMA.
// 8-bit inputs (fp8 e4m3, D = 128, 128 keys; InputPrecision in fwd/sm90/tile.h): the whole producer
// warpgroup transposes each V tile from its staging tile into a Vᵀ tile (fwd/sm90/transpose_v.h).
// kConsumers_: three for the dense forward's unmasked D = 64 tile where it pays (FlashAttention-3's 192-row
// tile: a step's products are short beside its softmax, and two warpgroups' softmax runs under the
// third's products; fwd/sm90/instances.h's dense_consumers).
template <typename T, int kHeadDim, int kBlockN_, int kStages_, bool kMasked_, int kProducerRegisters_ = 24,
          int kHeadDimV = kHeadDim, bool kGather_ = false, int kConsumers_ = 2>
struct SpecializedTile {
  static constexpr int kConsumers = kConsumers_;
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups (kMaxConsumers)");
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kMasked = kMasked_;
  static constexpr bool kGather = kGather_;
  static constexpr bool kPageScales = false;
  static constexpr bool kPackGqa = false;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kDimQK = kHeadDim;
  static constexpr int kDim = kHeadDimV;  // O's columns (RowState, the epilogue)
  static constexpr int kElementBytes = static_cast<int>(sizeof(T));
  static constexpr bool kTransposeV = InputPrecision<T>::kTransposeV;
  static constexpr float kPShift = InputPrecision<T>::kPShift;
  static constexpr int kChunksQK = kDimQK * kElementBytes / 16;  // 16-byte chunks per row of Q and K
  static constexpr int kChunks = kDim * kElementBytes / 16;      // and of V
  using Output = typename InputPrecision<T>::Output;
  static_assert(!kTransposeV || (kDimQK == 128 && kDim == 128 && kBlockN == 128),
                "8-bit inputs: the D = 128, 128-key tile (the shape transpose_values takes)");
  // The wgmma N shapes compiled in arch/nvidia/warpgroup.h: S is 64 x kBlockN, O 64 x kDim.
  static_assert(kDim == 64 || kDim == 128 || kDim == 256, "V head dims 64, 128 and 256");
  static_assert(kDimQK % 64 == 0 && kDimQK <= 256, "Q/K head dims of whole 128-byte swizzle blocks");
  static_assert(kBlockN == 64 || kBlockN == 80 || kBlockN == 128, "64, 80 or 128 keys per tile");
  using QLayout = Swizzle128<kChunksQK, kBlockM>;
  using KLayout = Swizzle128<kChunksQK, kBlockN>;
  using VLayout = Swizzle128<kChunks, kBlockN>;                             // 8-bit inputs: the staging tile
  using VtLayout = Swizzle128<kBlockN * kElementBytes / 16, kDim>;  // 8-bit inputs: the Vᵀ tile
  static constexpr uint32_t kQBytes = kBlockM * kDimQK * kElementBytes;
  static constexpr uint32_t kKBytes = kBlockN * kDimQK * kElementBytes;
  static constexpr uint32_t kVBytes = kBlockN * kDim * kElementBytes;
  static constexpr uint32_t kVtBytes = kTransposeV ? kVBytes : 0;
  // mbarriers: Q full; K full and empty per stage; V (the Vᵀ tile for 8-bit inputs) full and empty per
  // stage; Q empty; 8-bit inputs: V staged per stage.
  static constexpr int kBarriers = 2 + (kTransposeV ? 5 : 4) * kStages;
  // A float per consumer thread: the softmax's sums, stored to keep the softmax ahead of the wait for
  // the previous P·V (arch::complete_before).
  static constexpr int kScratchBytes = 4 * 128 * kConsumers;
  static constexpr int kSharedBytes = kQBytes + kStages * (kKBytes + kVBytes + kVtBytes) + 8 * kBarriers +
                                      kScratchBytes + TileQueue::kBytes + kSwizzle128Slack;
  static_assert(kSharedBytes <= 227 * 1024, "Hopper's shared memory per CTA");

  // The producer: one warp of warpgroup 0 (the others leave), or with kGather or kTransposeV the whole
  // warpgroup. Its first warp loads Q with TMA; K and V come as TMA boxes, or gathered by every producer
  // thread with cp.async (zeros past the sequence). A boxed V tile that reaches past the sequence is
  // copied by the producer with cp.async instead (TileCopy with this shape), which writes zeros there
  // rather than the next rows of the tensor. Each producer thread arrives on a stage's full barriers.
  struct Producer {
    static constexpr int kThreads = kGather_ || kTransposeV ? 128 : 32;
    static constexpr int kChunks = SpecializedTile::kChunks;
  };
  static constexpr int kQueryLoaders = 32;  // the producer's first warp
  // setmaxnreg: the producer warpgroup keeps what its loads need (24 for dense tensors, more for the
  // page-table arithmetic of a paged pool), the consumers take the rest of what a thread of the CTA
  // starts with (168 with two consumers: 24 + 2 · 240 = 3 · 168; 128 with three: 24 + 3 · 160 ≤ 4 · 128).
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kProducerRegisters_;
  static constexpr int kConsumerRegisters =
      ((kConsumers + 1) * kLaunchRegisters - kProducerRegisters) / kConsumers / 8 * 8;
  static_assert(kProducerRegisters % 8 == 0 &&
                    kProducerRegisters + kConsumers * kConsumerRegisters <= (kConsumers + 1) * kLaunchRegisters,
                "setmaxnreg counts are multiples of 8 within the CTA's pool");
};

}  // namespace fmha

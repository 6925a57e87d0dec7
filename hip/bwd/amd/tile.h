// The backward's (dq_dk_dv) tile on AMD (gfx942 / gfx950): the workgroup's shape (four waves of 32 keys,
// q steps of kBlockM rows) and its LDS layout (Q, Qᵀ, dO, dOᵀ, dS, LSE and D; Kᵀ once per unit).
#pragma once

#include "arch/amd/matrix_core.h"
#include "arch/thread.h"

namespace fmha {

// The tile is the same on gfx942 and gfx950: the workspace is laid out for (kBlockM, kBlockN), which
// the host checks before a launch without knowing which of the two the device is; the LDS it needs
// (at most 49 KiB) fits gfx942's 64 KiB; and registers, not LDS, bound the occupancy (K, V and the dK,
// dV accumulators of 32 keys take 224 of 512 at D = 128: one wave per SIMD, one workgroup per CU),
// so gfx950's larger LDS would buy nothing. gfx950 gains its one-instruction mma2.
template <int kHeadDim>
struct AmdBackwardTile {
  static constexpr int kWaves = 4;
  static constexpr int kThreads = kWaves * arch::kWaveSize;
  static constexpr int kBlockN = kWaves * 32;  // keys per unit: one 32-key MFMA block per wave
  // q rows per step: dQ = dS·K of a step is one 32x32 block per wave (kBlockM · kHeadDim = 4 · 32 · 32):
  // 32 at D = 128 (CK's d128 tiles are smaller still), 64 at D = 64.
  static constexpr int kBlockM = kWaves * 32 * 32 / kHeadDim;
  static constexpr int kDim = kHeadDim;
  static constexpr int kQBlocks = kBlockM / 32;   // 32-row blocks of S, dP
  static constexpr int kDimBlocks = kDim / 32;    // 32-dim blocks of dKᵀ, dVᵀ
  static constexpr int kChunks = kDim / 8;        // 16-byte chunks of a Q, dO or K row in memory
  static constexpr int kRowUnits = kDim / 4;      // 8-byte units of a Q or dO row in LDS
  static constexpr int kColUnits = kBlockM / 4;   // of a Qᵀ or dOᵀ row (one head dim)
  static constexpr int kKeyUnits = kBlockN / 4;   // of a dS row (one q row) or a Kᵀ row (one head dim)
  // LDS (bytes): Q, Qᵀ, dO, dOᵀ, dS, then the rows' LSE · log2 e and D.
  static constexpr int kQBytes = kBlockM * kDim * 2;
  static constexpr int kQRows = 0, kQCols = kQBytes, kDoRows = 2 * kQBytes, kDoCols = 3 * kQBytes;
  static constexpr int kDs = 4 * kQBytes;
  static constexpr int kLse = kDs + kBlockM * kBlockN * 2;
  static constexpr int kDelta = kLse + kBlockM * 4;
  static constexpr int kLdsBytes = kDelta + kBlockM * 4;
  // Kᵀ, staged once per unit where the q tiles go (they are not in use yet).
  static constexpr int kKt = 0;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the copy mappings are for 64 and 128 dims");
  static_assert(kQBlocks * kDimBlocks == kWaves, "one 32x32 dQ block per wave");
  static_assert(kBlockM * kChunks / 4 == kThreads / 2, "one Q or dO block of 4 rows x 8 columns per thread");
  static_assert(kDim * kBlockN * 2 <= kDs, "Kᵀ fits where the q tiles go");
  static_assert(kLdsBytes <= arch::kLdsBytes, "LDS");
};

}  // namespace fmha

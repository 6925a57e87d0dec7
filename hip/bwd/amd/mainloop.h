// The backward's (dq_dk_dv) mainloop on AMD (gfx942 / gfx950): one q tile for one wave (S, dP, P, dVᵀ,
// dS, dKᵀ on MFMA, dS to LDS) and the wave's block of its dQ added to the dq_acc slot, with the unit's
// per-lane state.
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "arch/registers.h"
#include "common/kept_range.h"
#include "bwd/amd/tile.h"

namespace fmha {

// Everything a work unit keeps across its q tiles.
template <typename Tile>
struct UnitState {
  arch::u32x2 k[Tile::kDim / 8];       // B of S: key lane % 32, dims 8 s + 4 half + 0..3
  arch::u32x2 v[Tile::kDim / 8];       // B of dP, likewise
  arch::u32x2 kd[Tile::kBlockN / 8];   // B of dQ: dim 32 db + lane % 32 (the wave's block), keys 8 s + 4 half + 0..3
  arch::f32x16 dk[Tile::kDimBlocks];   // dKᵀ block db: dims 32 db + 8 (r / 4) + 4 half + r % 4 of the lane's key
  arch::f32x16 dv[Tile::kDimBlocks];   // dVᵀ, likewise
};

// A lane's swizzled offsets (unit `half` of row lane % 32 of the first 32-row block) in the tiles of
// each shape; a step's unit is XORed in, a block's rows added.
struct LaneOffsets {
  uint32_t rows;     // Q, dO
  uint32_t columns;  // Qᵀ, dOᵀ
  uint32_t ds;       // dS, row 32 qb + lane % 32 of the wave's dQ block
};

// One q tile for one wave: S, dP, P (masked on edge tiles), dVᵀ += dOᵀ·P, dS, dKᵀ += Qᵀ·dS, dS to LDS.
// `kept`: the q rows that keep the lane's key, as offsets c = 32 qb + 8 (r / 4) + r % 4 of its registers
// from its first row in the tile.
template <typename Tile, typename T>
__device__ inline void accumulate_dk_dv(UnitState<Tile>& st, arch::lds_byte* lds, const LaneOffsets& at,
                                        float scale_log2, bool edge, KeptRange kept, int key_unit, int key_byte,
                                        int half) {
  using E = arch::Element<T>;
  constexpr int M = Tile::kBlockM, kQBlocks = Tile::kQBlocks, kDimBlocks = Tile::kDimBlocks;
  constexpr uint32_t kRowBlockBytes = 32 * Tile::kRowUnits * 8, kColBlockBytes = 32 * Tile::kColUnits * 8;

  // S and dP block qb: rows 32 qb + 8 (r / 4) + 4 half + r % 4 of the lane's key. Two 8-dim steps per
  // mma2: units 4 ks + half and 4 ks + 2 + half of q row 32 qb + lane % 32.
  arch::f32x16 s[kQBlocks], dp[kQBlocks];
#pragma unroll
  for (int qb = 0; qb < kQBlocks; ++qb) s[qb] = dp[qb] = arch::zero_accumulator();
#pragma unroll
  for (int ks = 0; ks < Tile::kDim / 16; ++ks) {
#pragma unroll
    for (int qb = 0; qb < kQBlocks; ++qb) {
      const uint32_t a0 = (at.rows ^ (ks * 32)) + qb * kRowBlockBytes;
      const uint32_t a1 = (at.rows ^ (ks * 32 + 16)) + qb * kRowBlockBytes;
      E::mma2(s[qb], arch::lds_load_8(lds, Tile::kQRows + a0), arch::lds_load_8(lds, Tile::kQRows + a1), st.k[2 * ks],
              st.k[2 * ks + 1]);
      E::mma2(dp[qb], arch::lds_load_8(lds, Tile::kDoRows + a0), arch::lds_load_8(lds, Tile::kDoRows + a1),
              st.v[2 * ks], st.v[2 * ks + 1]);
    }
  }

  // The rows' LSE · log2 e or D of registers 4g .. 4g + 3 of block qb. (A whole-vector cast: clang
  // bit-casts an element of a vector wrongly, as if it were element 0.)
  auto row_stats = [&](uint32_t tile, int qb, int g) {
    return __builtin_bit_cast(arch::f32x4, arch::lds_load_16(lds, tile + 4 * (32 * qb + 8 * g + 4 * half)));
  };

  // P, one FMA and one v_exp per element.
#pragma unroll
  for (int qb = 0; qb < kQBlocks; ++qb) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const arch::f32x4 lse = row_stats(Tile::kLse, qb, g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[qb][4 * g + e];
        if (edge) x = masked_score(x, 32 * qb + 8 * g + e, kept);
        s[qb][4 * g + e] = arch::fast_exp2(__builtin_fmaf(x, scale_log2, -lse[e]));
      }
    }
  }

  // dVᵀ += dOᵀ·P over 16 q rows per mma2: the 8-row steps 2 kp and 2 kp + 1 are registers 8 (kp % 2) ..
  // 8 (kp % 2) + 7 of block kp / 2 (B fragments), and units 4 kp + half and 4 kp + 2 + half of dOᵀ row
  // 32 db + lane % 32 (A fragments). dKᵀ += Qᵀ·dS below likewise.
  auto accumulate = [&](arch::f32x16(&acc)[kDimBlocks], const arch::f32x16(&b)[kQBlocks], uint32_t tile) {
#pragma unroll
    for (int kp = 0; kp < M / 16; ++kp) {
      const arch::f32x16& x = b[kp / 2];
      const int r0 = 8 * (kp % 2);
      const arch::u32x2 b0 = arch::pack4<T>(x[r0], x[r0 + 1], x[r0 + 2], x[r0 + 3]);
      const arch::u32x2 b1 = arch::pack4<T>(x[r0 + 4], x[r0 + 5], x[r0 + 6], x[r0 + 7]);
#pragma unroll
      for (int db = 0; db < kDimBlocks; ++db) {
        const arch::u32x2 a0 = arch::lds_load_8(lds, tile + (at.columns ^ (kp * 32)) + db * kColBlockBytes);
        const arch::u32x2 a1 = arch::lds_load_8(lds, tile + (at.columns ^ (kp * 32 + 16)) + db * kColBlockBytes);
        E::mma2(acc[db], a0, a1, b0, b1);
      }
    }
  };
  accumulate(st.dv, s, Tile::kDoCols);

  // dS = P ∘ (dP - D), into dp.
#pragma unroll
  for (int qb = 0; qb < kQBlocks; ++qb) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const arch::f32x4 d = row_stats(Tile::kDelta, qb, g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dp[qb][4 * g + e] = s[qb][4 * g + e] * (dp[qb][4 * g + e] - d[e]);
      }
    }
  }
  accumulate(st.dk, dp, Tile::kQCols);

  // dS rounded as the MMAs consume it, row-major: element (row, key) at byte key % 4 · 2 of unit key / 4.
#pragma unroll
  for (int qb = 0; qb < kQBlocks; ++qb) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = 32 * qb + 8 * (r / 4) + 4 * half + r % 4;
      arch::lds_store_2(lds, Tile::kDs + swizzled<Tile::kKeyUnits>(row, key_unit) + key_byte,
                        static_cast<uint16_t>(E::bits(dp[qb][r])));
    }
  }
}

// The wave's 32x32 block of dQ = scale · dS·K for the q tile (after the barrier that completes dS),
// added to the unit's dq_acc slot `slot` (element (row, col) at row · row_elements + col): rows
// i0 + 32 q_block + 8 (r / 4) + 4 half + r % 4 of column `col` (the lane's), those of the batch only.
template <typename Tile, typename T>
__device__ inline void accumulate_dq(const UnitState<Tile>& st, const arch::lds_byte* lds, uint32_t ds, float* slot,
                                     int64_t row_elements, int64_t i0, int sq, int col, int hdim_q, float scale,
                                     int q_block, int half) {
  using E = arch::Element<T>;
  arch::f32x16 dq = arch::zero_accumulator();
  // 16 keys per mma2: units 4 ks + half and 4 ks + 2 + half of the dS row (A), K steps 2 ks, 2 ks + 1 (B).
#pragma unroll
  for (int ks = 0; ks < Tile::kBlockN / 16; ++ks) {
    const arch::u32x2 a0 = arch::lds_load_8(lds, Tile::kDs + (ds ^ (ks * 32)));
    const arch::u32x2 a1 = arch::lds_load_8(lds, Tile::kDs + (ds ^ (ks * 32 + 16)));
    E::mma2(dq, a0, a1, st.kd[2 * ks], st.kd[2 * ks + 1]);
  }
  if (col >= hdim_q) return;
  // The row offsets in vector registers: as scalars, the compiler would keep all 16 across the loop.
  const int64_t stride = arch::in_vector_registers(row_elements);
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int64_t i = i0 + 32 * q_block + 8 * (r / 4) + 4 * half + r % 4;
    if (i < sq) arch::global_atomic_add(slot + i * stride + col, dq[r] * scale);
  }
}

}  // namespace fmha

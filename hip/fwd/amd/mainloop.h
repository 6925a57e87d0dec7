// The forward's mainloop on AMD (gfx942 / gfx950): one K/V tile for one wave (Sᵀ = K·Qᵀ on MFMA, the
// mask of edge tiles, the online softmax, Oᵀ += Vᵀ·Pᵀ) and the per-lane running state it updates.
#pragma once

#include "arch/amd/matrix_core.h"
#include "common/kept_range.h"
#include "fwd/amd/tile.h"

namespace fmha {

// The running state of one lane's query row: its Qᵀ fragments, its Oᵀ accumulators (16 dims of each
// 32-dim block) and the online softmax statistics (exp2 domain of unscaled scores: max is of raw S).
template <typename Tile>
struct LaneState {
  arch::u32x2 q[Tile::kRowBytes / 16];  // B fragment of the 16-byte step k8: bytes 16 k8 + 8 half + 0..7
  arch::f32x16 o[Tile::kDim / 32];    // Oᵀ block db: dims 32 db + 8 (r / 4) + 4 half + r % 4
  float row_max, row_sum;             // row_sum: this half's keys only, until the end
};

// One K/V tile for one wave: Sᵀ = K·Qᵀ, mask (edge tiles only), online softmax, Oᵀ += Vᵀ·Pᵀ.
// `k_base` / `v_base`: LDS offsets of the tile plus this lane's swizzled(lane % 32, half) base;
// `edge`: the tile needs per-element checks, against `kept` (a uniform branch around the checks only,
// so that both kinds of tile share one body and one register assignment). P enters Oᵀ += Vᵀ·Pᵀ and the
// row sum as 2^kPShift · P (arch::Element); the epilogue removes the factor from the LSE.
// kPageScales (fp8 K/V descales per page, CK's KV block scale): the tile's K descale `tile_dk` scales its
// scores, so the running max is of S · dk; O is kept in units of the tile's V descale, rescaled by
// `o_rescale` = dv of the previous tile / dv of this one before this tile's P·V is added.
template <typename Tile, typename T, bool kPageScales = false>
__device__ inline void attend_tile(LaneState<Tile>& st, const arch::lds_byte* lds, uint32_t k_base, uint32_t v_base,
                                   float scale_log2, bool edge, KeptRange kept, float tile_dk = 1.f,
                                   float o_rescale = 1.f) {
  using E = arch::Element<T>;
  constexpr int N = Tile::kBlockN, D = Tile::kDim, kKeyBlocks = N / 32, kDimBlocks = D / 32;
  // Accumulator registers (keys of Sᵀ) per 8-byte fragment of Pᵀ: 4 (16-bit) or 8 (8-bit).
  constexpr int kFragmentKeys = 8 / E::kBytes;
  constexpr uint32_t kKBlockBytes = 32 * Tile::kKUnits * 8, kVBlockBytes = 32 * Tile::kVUnits * 8;

  // Sᵀ block kb: keys 32 kb + 8 (r / 4) + 4 half + r % 4 of this lane's row. 32 bytes of the rows per
  // mma2: units 4 ks + half and 4 ks + 2 + half of key row 32 kb + lane % 32.
  arch::f32x16 s[kKeyBlocks];
#pragma unroll
  for (int kb = 0; kb < kKeyBlocks; ++kb) s[kb] = arch::zero_accumulator();
#pragma unroll
  for (int ks = 0; ks < Tile::kRowBytes / 32; ++ks) {
#pragma unroll
    for (int kb = 0; kb < kKeyBlocks; ++kb) {
      const arch::u32x2 a0 = arch::lds_load_8(lds, (k_base ^ (ks * 32)) + kb * kKBlockBytes);
      const arch::u32x2 a1 = arch::lds_load_8(lds, (k_base ^ (ks * 32 + 16)) + kb * kKBlockBytes);
      E::mma2(s[kb], a0, a1, st.q[2 * ks], st.q[2 * ks + 1]);
    }
  }

  if (edge) {
#pragma unroll
    for (int kb = 0; kb < kKeyBlocks; ++kb) {
#pragma unroll
      for (int r = 0; r < 16; ++r) s[kb][r] = masked_score(s[kb][r], kb * 32 + 8 * (r / 4) + r % 4, kept);
    }
  }

  // Online softmax on raw scores: P = 2^(scale_log2 · (S - max)), one FMA and one v_exp per element.
  float tile_max = -__builtin_inff();
#pragma unroll
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
#pragma unroll
    for (int r = 0; r < 16; ++r) tile_max = __builtin_fmaxf(tile_max, s[kb][r]);
  }
  tile_max = arch::halves_max(tile_max);
  // Descales are positive: the max of the scaled scores is the scaled max.
  if constexpr (kPageScales) tile_max *= tile_dk;
  const float new_max = __builtin_fmaxf(st.row_max, tile_max);
  // A row with every key so far masked keeps max = -inf; 0 keeps the exponent away from NaN.
  const float base = new_max == -__builtin_inff() ? 0.f : new_max * scale_log2;
  // Exact exp2 here: the running sum is rescaled by this factor on every tile whose max grows.
  const float correction = arch::exact_exp2(st.row_max * scale_log2 - base);
  st.row_max = new_max;
  st.row_sum *= correction;
  const float o_correction = kPageScales ? correction * o_rescale : correction;
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) st.o[db] *= o_correction;
  // The tile's sum first, then one add into the running sum.
  const float p_base = base - E::kPShift;
  const float score_log2 = kPageScales ? scale_log2 * tile_dk : scale_log2;
  float tile_sum = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      s[kb][r] = arch::fast_exp2(__builtin_fmaf(s[kb][r], score_log2, -p_base));
      tile_sum += s[kb][r];
    }
  }
  st.row_sum += tile_sum;

  // Oᵀ += Vᵀ·Pᵀ over 32 bytes of the Vᵀ rows per mma2 (16 keys of 16 bits, 32 of 8): the B fragments
  // are registers r0 .. r0 + 2 kFragmentKeys - 1 of the Sᵀ blocks (counted across them), the A
  // fragments units 4 kp + half and 4 kp + 2 + half of Vᵀ row 32 db + lane % 32, which hold the same
  // keys in the same order (Tile::v_group_byte).
#pragma unroll
  for (int kp = 0; kp < N * E::kBytes / 32; ++kp) {
    const arch::f32x16& p = s[kp * 2 * kFragmentKeys / 16];
    const int r0 = kp * 2 * kFragmentKeys % 16;
    const arch::u32x2 b0 = arch::fragment<T>(p, r0);
    const arch::u32x2 b1 = arch::fragment<T>(p, r0 + kFragmentKeys);
#pragma unroll
    for (int db = 0; db < kDimBlocks; ++db) {
      const arch::u32x2 a0 = arch::lds_load_8(lds, (v_base ^ (kp * 32)) + db * kVBlockBytes);
      const arch::u32x2 a1 = arch::lds_load_8(lds, (v_base ^ (kp * 32 + 16)) + db * kVBlockBytes);
      E::mma2(st.o[db], a0, a1, b0, b1);
    }
  }
}

}  // namespace fmha

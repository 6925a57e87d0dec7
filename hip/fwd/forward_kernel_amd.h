// The attention forward mainloop on AMD matrix cores (gfx942 / gfx950, wave64, MFMA 32x32): the
// algorithm and semantics of fwd/forward_kernel.h (FlashAttention-2) in AMD's fragments.
//
// One workgroup computes a tile of kBlockM = 128 query rows of one (batch, query head): four waves of
// 32 rows. A wave computes the transposed scores Sᵀ = K·Qᵀ (keys × its 32 rows), so that lane l owns
// query row l % 32 and, of every 32-key block, the 16 keys of its half l / 32: the row max and sum
// are reductions within the lane plus one exchange between the halves, the rescale of O is per lane,
// and Pᵀ, rounded to the input type, is the B operand of Oᵀ += Vᵀ·Pᵀ as it stands
// (arch/amd/matrix_core.h). The Q tile is loaded once from global memory into registers as B
// fragments. K and Vᵀ tiles stream through a double-buffered, XOR-swizzled LDS ring: the global loads
// of tile j+1 go to registers at the start of step j and to the other stage after step j's compute,
// one barrier per step. V is transposed on its way to LDS (4 keys × 8 dims per thread) so that an A
// fragment of Vᵀ is one 8-byte LDS read. Per tile: S, mask on edge tiles, online softmax in the exp2
// domain, O += P·V. Fully masked tiles are never visited; rows with no kept key get O = 0 and
// LSE = -inf.
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "arch/thread.h"
#include "common/kept_range.h"
#include "common/sequence.h"
#include "launch.h"

namespace fmha {

template <int kHeadDim>
struct AmdForwardTile {
  static constexpr int kWaves = 4;
  static constexpr int kBlockM = kWaves * 32;  // one 32-row MFMA block per wave
  static constexpr int kThreads = kWaves * arch::kWaveSize;
  static constexpr int kDim = kHeadDim;
  // Keys per step: the two stages of K and Vᵀ take at most half the LDS, so that two workgroups share
  // a CU (gfx942: 64 keys at d64, 32 at d128; gfx950: 64 at both).
  static constexpr int kBlockN = 4 * 64 * kHeadDim * 2 <= arch::kLdsBytes / 2 ? 64 : 32;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or Vᵀ tile
  static constexpr int kLdsBytes = 4 * kKVBytes;           // K stages 0 and 1, then Vᵀ stages 0 and 1
  static constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks of a K or V row in memory
  static constexpr int kKUnits = kHeadDim / 4;             // 8-byte units of a K row in LDS
  static constexpr int kVUnits = kBlockN / 4;              // 8-byte units of a Vᵀ row in LDS
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "the copy mappings are for 64 and 128 dims");
};

// A thread's share of moving one K tile and one V tile global → registers → LDS. Addresses are the
// tile's row 0 (wave-uniform) plus a 32-bit byte offset per thread (global_load with a scalar base:
// the launch stub refuses row strides for which 128 rows overflow 32 bits). Loads of rows past
// `valid_rows` or of columns past the head dim read row 0 instead (which exists; no branch), and
// `store` writes zeros for them: a zero V row times P = 0 adds nothing, where garbage could be NaN.
// The zeros are selected at the store, not at the load, so that nothing waits for the loads before
// the step's compute.
//   K: 16-byte chunk `k_col / 8` of rows k_row + i · kRowStep, stored as two 8-byte units. Lanes 0-7
//      take chunks 0-7 of one row, lanes 8-15 the same chunks of the next row, so that each 16-lane
//      phase of a ds_write_b64 hits 16 distinct slots of the bank window.
//   V: 16-byte chunk `v_col / 8` (8 dims) of the 4 keys 4 v_group .. 4 v_group + 3, transposed in
//      registers into 8 units of Vᵀ (one per dim, 4 keys each). Lane bit 0 is the chunk's low bit and
//      lane bits 1-3 the group's low bits: the 16 lanes of a phase write 16 distinct slots (rows of
//      128 bytes). At most one V job per thread; threads past the last group have none.
template <typename Tile>
struct KVCopy {
  static constexpr int N = Tile::kBlockN, kChunks = Tile::kChunks, kThreads = Tile::kThreads;
  static constexpr int kRowStep = kThreads / kChunks;
  static constexpr int kKLoads = N / kRowStep;
  static constexpr int kGroups = N / 4;
  static_assert(N % kRowStep == 0 && kGroups * kChunks <= kThreads && kChunks % 8 == 0, "copy mapping");

  int k_row, k_col;  // first row and first column (elements) of this thread's K chunks
  int v_group, v_col;
  uint32_t k_offset, k_step;  // bytes from row 0 to the first K chunk; bytes per kRowStep rows
  uint32_t v_offset, v_step;  // bytes from row 0 to the first V chunk; bytes per row
  arch::u32x4 k[kKLoads];
  arch::u32x4 v[4];

  __device__ KVCopy(int tid, int64_t k_stride, int64_t v_stride) {
    constexpr int kHigh = kChunks / 8;  // chunk bits above the first 128 bytes of a row
    k_col = ((tid & 7) + 8 * ((tid >> 4) % kHigh)) * 8;
    k_row = ((tid >> 3) & 1) + 2 * ((tid >> 4) / kHigh);
    constexpr int kHalfChunks = kChunks / 2;
    v_col = ((tid & 1) + 2 * ((tid >> 4) % kHalfChunks)) * 8;
    v_group = ((tid >> 1) & 7) + 8 * ((tid >> 4) / kHalfChunks);
    k_offset = static_cast<uint32_t>((k_row * k_stride + k_col) * 2);
    k_step = static_cast<uint32_t>(kRowStep * k_stride * 2);
    v_offset = static_cast<uint32_t>((4 * v_group * v_stride + v_col) * 2);
    v_step = static_cast<uint32_t>(v_stride * 2);
  }

  __device__ bool k_valid(int i, int valid_rows, int hdim_q) const {
    return k_col < hdim_q && k_row + i * kRowStep < valid_rows;
  }
  __device__ bool v_valid(int e, int valid_rows, int hdim_v) const {
    return v_group < kGroups && v_col < hdim_v && 4 * v_group + e < valid_rows;
  }

  // `kg` / `vg`: row 0 of the tile.
  __device__ void load(const uint16_t* kg, const uint16_t* vg, int valid_rows, int hdim_q, int hdim_v) {
    const uint8_t* kb = reinterpret_cast<const uint8_t*>(kg);
    const uint8_t* vb = reinterpret_cast<const uint8_t*>(vg);
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      k[i] = arch::global_load_16(kb + (k_valid(i, valid_rows, hdim_q) ? k_offset + i * k_step : 0u));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = arch::global_load_16(vb + (v_valid(e, valid_rows, hdim_v) ? v_offset + e * v_step : 0u));
    }
  }

  // K into the K tile at byte offset `k_tile`, Vᵀ into the Vᵀ tile at `v_tile`; the same `valid_rows`
  // and head dims as the load.
  __device__ void store(arch::lds_byte* lds, uint32_t k_tile, uint32_t v_tile, int valid_rows, int hdim_q,
                        int hdim_v) const {
    const int unit = k_col / 4;
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      const arch::u32x4 x = k_valid(i, valid_rows, hdim_q) ? k[i] : arch::u32x4(0u);
      const int r = k_row + i * kRowStep;
      arch::lds_store_8(lds, k_tile + swizzled<Tile::kKUnits>(r, unit), arch::u32x2{x.x, x.y});
      arch::lds_store_8(lds, k_tile + swizzled<Tile::kKUnits>(r, unit + 1), arch::u32x2{x.z, x.w});
    }
    if (v_group >= kGroups) return;
    arch::u32x4 y[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) y[e] = v_valid(e, valid_rows, hdim_v) ? v[e] : arch::u32x4(0u);
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      // Dim v_col + x of keys 4 v_group + e: the low or high half of word x / 2 of y[e].
      uint32_t d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = (x & 1) ? y[e][x / 2] >> 16 : y[e][x / 2] & 0xffffu;
      arch::lds_store_8(lds, v_tile + swizzled<Tile::kVUnits>(v_col + x, v_group),
                        arch::u32x2{d[0] | (d[1] << 16), d[2] | (d[3] << 16)});
    }
  }
};

// The running state of one lane's query row: its Qᵀ fragments, its Oᵀ accumulators (16 dims of each
// 32-dim block) and the online softmax statistics (exp2 domain of unscaled scores: max is of raw S).
template <typename Tile>
struct LaneState {
  arch::u32x2 q[Tile::kDim / 8];      // B fragment of the 8-dim step k8: dims 8 k8 + 4 half + 0..3
  arch::f32x16 o[Tile::kDim / 32];    // Oᵀ block db: dims 32 db + 8 (r / 4) + 4 half + r % 4
  float row_max, row_sum;             // row_sum: this half's keys only, until the end
};

// One K/V tile for one wave: Sᵀ = K·Qᵀ, mask (edge tiles only), online softmax, Oᵀ += Vᵀ·Pᵀ.
// `k_base` / `v_base`: LDS offsets of the tile plus this lane's swizzled(lane % 32, half) base;
// `edge`: the tile needs per-element checks, against `kept` (a uniform branch around the checks only,
// so that both kinds of tile share one body and one register assignment).
template <typename Tile, typename T>
__device__ inline void attend_tile(LaneState<Tile>& st, const arch::lds_byte* lds, uint32_t k_base, uint32_t v_base,
                                   float scale_log2, bool edge, KeptRange kept) {
  using E = arch::Element<T>;
  constexpr int N = Tile::kBlockN, D = Tile::kDim, kKeyBlocks = N / 32, kDimBlocks = D / 32;
  constexpr uint32_t kKBlockBytes = 32 * Tile::kKUnits * 8, kVBlockBytes = 32 * Tile::kVUnits * 8;

  // Sᵀ block kb: keys 32 kb + 8 (r / 4) + 4 half + r % 4 of this lane's row. Two 8-dim steps per mma2:
  // units 4 ks + half and 4 ks + 2 + half of key row 32 kb + lane % 32.
  arch::f32x16 s[kKeyBlocks];
#pragma unroll
  for (int kb = 0; kb < kKeyBlocks; ++kb) s[kb] = arch::zero_accumulator();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
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
  const float new_max = __builtin_fmaxf(st.row_max, tile_max);
  // A row with every key so far masked keeps max = -inf; 0 keeps the exponent away from NaN.
  const float base = new_max == -__builtin_inff() ? 0.f : new_max * scale_log2;
  // Exact exp2 here: the running sum is rescaled by this factor on every tile whose max grows.
  const float correction = arch::exact_exp2(st.row_max * scale_log2 - base);
  st.row_max = new_max;
  st.row_sum *= correction;
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) st.o[db] *= correction;
  // The tile's sum first, then one add into the running sum.
  float tile_sum = 0.f;
#pragma unroll
  for (int kb = 0; kb < kKeyBlocks; ++kb) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      s[kb][r] = arch::fast_exp2(__builtin_fmaf(s[kb][r], scale_log2, -base));
      tile_sum += s[kb][r];
    }
  }
  st.row_sum += tile_sum;

  // Oᵀ += Vᵀ·Pᵀ over 16 keys per mma2: the 8-key steps 2 kp and 2 kp + 1 are registers 8 (kp % 2) ..
  // 8 (kp % 2) + 7 of Sᵀ block kp / 2 (B fragments), and units 4 kp + half and 4 kp + 2 + half of Vᵀ
  // row 32 db + lane % 32 (A fragments).
#pragma unroll
  for (int kp = 0; kp < N / 16; ++kp) {
    const arch::f32x16& p = s[kp / 2];
    const int r0 = 8 * (kp % 2);
    const arch::u32x2 b0 = arch::pack4<T>(p[r0], p[r0 + 1], p[r0 + 2], p[r0 + 3]);
    const arch::u32x2 b1 = arch::pack4<T>(p[r0 + 4], p[r0 + 5], p[r0 + 6], p[r0 + 7]);
#pragma unroll
    for (int db = 0; db < kDimBlocks; ++db) {
      const arch::u32x2 a0 = arch::lds_load_8(lds, (v_base ^ (kp * 32)) + db * kVBlockBytes);
      const arch::u32x2 a1 = arch::lds_load_8(lds, (v_base ^ (kp * 32 + 16)) + db * kVBlockBytes);
      E::mma2(st.o[db], a0, a1, b0, b1);
    }
  }
}

template <typename T, int kHeadDim, bool kMasked>
__global__ void __launch_bounds__(AmdForwardTile<kHeadDim>::kThreads) FMHA_AMD_MIN_WAVES_PER_SIMD(2)
    forward_kernel_amd(fmha_fwd_params p) {
  using Tile = AmdForwardTile<kHeadDim>;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, kDimBlocks = Tile::kDim / 32;
  constexpr uint32_t kKV = Tile::kKVBytes, kVTiles = 2 * kKV;  // Vᵀ stages follow the two K stages
  __shared__ __attribute__((aligned(16))) uint8_t lds_bytes[Tile::kLdsBytes];
  arch::lds_byte* const lds = arch::lds_pointer(lds_bytes);

  // Masked grids run their last (for causal masks: heaviest) q tiles first, so the long tail of a
  // launch is made of short tiles.
  const int tile = kMasked ? static_cast<int>(arch::grid_blocks_x() - 1 - arch::block_index_x())
                           : static_cast<int>(arch::block_index_x());
  const int h = arch::block_index_y(), b = arch::block_index_z();
  const BatchRows rows = batch_rows(b, p.group_mode != 0, p.seqlen_q, p.seqlen_k,
                                    arch::global_pointer<const int32_t>(p.seqstart_q),
                                    arch::global_pointer<const int32_t>(p.seqstart_k),
                                    arch::global_pointer<const int32_t>(p.seqlen_q_ptr),
                                    arch::global_pointer<const int32_t>(p.seqlen_k_ptr));
  const int i0 = tile * M;
  if (i0 >= rows.sq) return;
  const int i1 = i0 + M < rows.sq ? i0 + M : rows.sq;
  const int hk = h / (p.nhead_q / p.nhead_k);
  const int64_t batch = p.group_mode ? 0 : b;

  const uint16_t* q = arch::global_pointer<const uint16_t>(p.q) + batch * p.q_batch_stride + h * p.q_head_stride +
                      (rows.q_start + i0) * p.q_row_stride;
  const uint16_t* k = arch::global_pointer<const uint16_t>(p.k) + batch * p.k_batch_stride + hk * p.k_head_stride +
                      rows.k_start * p.k_row_stride;
  const uint16_t* v = arch::global_pointer<const uint16_t>(p.v) + batch * p.v_batch_stride + hk * p.v_head_stride +
                      rows.k_start * p.v_row_stride;

  // Keys that any row of this tile keeps: [key_lo, key_hi); tiles outside are never visited.
  const ResolvedMask mask = resolve_mask(p.mask_type, p.window_left, p.window_right, rows.sq, rows.sk);
  int64_t key_lo = 0, key_hi = rows.sk;
  if (kMasked) {
    const int64_t lo = i0 + mask.off - mask.left, hi = (i1 - 1) + mask.off + mask.right + 1;
    key_lo = lo > 0 ? lo : 0;
    key_hi = hi < rows.sk ? hi : rows.sk;
  }
  const int first_tile = static_cast<int>(key_lo / N);
  const int end_tile = key_hi > key_lo ? static_cast<int>((key_hi + N - 1) / N) : first_tile;

  const int tid = arch::thread_index(), lane = tid % arch::kWaveSize, wave = tid / arch::kWaveSize;
  const int lane32 = lane % 32, half = lane / 32;
  const int row = i0 + wave * 32 + lane32;  // this lane's query row

  // Q first: the wait for the prologue's K/V loads (before their LDS stores) then covers it, and the
  // mainloop's waits are for its own loads only. Lanes past the batch's rows or the head dim read row
  // i0 (which exists) and keep zeros.
  LaneState<Tile> st;
  {
    const bool valid = row < rows.sq;
    const uint32_t offset = static_cast<uint32_t>(((wave * 32 + lane32) * p.q_row_stride + 4 * half) * 2);
#pragma unroll
    for (int k8 = 0; k8 < Tile::kDim / 8; ++k8) {
      const bool load = valid && 8 * k8 + 4 * half < p.hdim_q;
      const arch::u32x2 x = arch::global_load_8(reinterpret_cast<const uint8_t*>(q) + (load ? offset + 16 * k8 : 0u));
      st.q[k8] = load ? x : arch::u32x2(0u);
    }
  }

  // Rows of the tile starting at key j0 that exist.
  auto valid_keys = [&](int j0) { return rows.sk - j0 < N ? rows.sk - j0 : N; };
  KVCopy<Tile> copy(tid, p.k_row_stride, p.v_row_stride);
  if (first_tile < end_tile) {
    const int j0 = first_tile * N;
    copy.load(k + j0 * p.k_row_stride, v + j0 * p.v_row_stride, valid_keys(j0), p.hdim_q, p.hdim_v);
  }
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) st.o[db] = arch::zero_accumulator();
  st.row_max = -__builtin_inff();
  st.row_sum = 0.f;

  if (first_tile < end_tile) {
    copy.store(lds, 0, kVTiles, valid_keys(first_tile * N), p.hdim_q, p.hdim_v);
  }
  arch::block_barrier();

  const uint32_t k_lane = swizzled<Tile::kKUnits>(lane32, half), v_lane = swizzled<Tile::kVUnits>(lane32, half);
  // Tiles [j0, j0 + N) with interior_lo <= j0 and j0 + N - 1 <= interior_hi need no per-element checks:
  // every row of the workgroup keeps all their keys (clamped to [0, sk] and [-1, sk - 1], which keeps
  // the tests' outcome for tiles starting in [0, sk), and includes the end of the sequence).
  int64_t interior_lo = kMasked ? (i1 - 1) + mask.off - mask.left : 0;
  int64_t interior_hi = kMasked && i0 + mask.off + mask.right < rows.sk - 1 ? i0 + mask.off + mask.right : rows.sk - 1;
  interior_lo = interior_lo < 0 ? 0 : (interior_lo > rows.sk ? rows.sk : interior_lo);
  interior_hi = interior_hi < -1 ? -1 : interior_hi;
  const int interior_first = static_cast<int>(interior_lo), interior_last = static_cast<int>(interior_hi);
  const IndexRange keys = keys_of_row<kMasked>(mask, row, rows.sk);

  for (int jt = first_tile; jt < end_tile; ++jt) {
    const uint32_t stage = static_cast<uint32_t>((jt - first_tile) & 1) * kKV;
    const bool more = jt + 1 < end_tile;
    const int next_valid = valid_keys((jt + 1) * N);
    if (more) {
      const int j0 = (jt + 1) * N;
      copy.load(k + j0 * p.k_row_stride, v + j0 * p.v_row_stride, next_valid, p.hdim_q, p.hdim_v);
    }

    const int j0 = jt * N;
    const bool edge = j0 < interior_first || j0 + N - 1 > interior_last;
    const uint32_t k_base = stage + k_lane, v_base = kVTiles + stage + v_lane;
    attend_tile<Tile, T>(st, lds, k_base, v_base, p.scale_log2, edge, kept_range<N>(keys, j0 + 4 * half));

    // The other stage was last read before the previous barrier; the barrier below publishes it.
    if (more) copy.store(lds, kKV - stage, kVTiles + kKV - stage, next_valid, p.hdim_q, p.hdim_v);
    arch::block_barrier();
  }

  // Normalise and store O (rows past the batch's length are not written) and the natural-log LSE.
  // The halves' sums are combined before any lane leaves: every lane takes part in the exchange.
  const float sum = arch::halves_sum(st.row_sum);
  if (row >= rows.sq) return;
  const float inverse = sum > 0.f ? 1.f / sum : 0.f;
  uint16_t* out_row = arch::global_pointer<uint16_t>(p.o) + batch * p.o_batch_stride + h * p.o_head_stride +
                      (rows.q_start + row) * p.o_row_stride;
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int col = db * 32 + 8 * g + 4 * half;  // 4 consecutive dims: registers 4g .. 4g + 3
      if (col < p.hdim_v) {
        const arch::f32x16& o = st.o[db];
        arch::global_store_8(out_row + col, arch::pack4<T>(o[4 * g] * inverse, o[4 * g + 1] * inverse,
                                                           o[4 * g + 2] * inverse, o[4 * g + 3] * inverse));
      }
    }
  }
  float* lse = arch::global_pointer<float>(p.lse);
  if (lse != nullptr && half == 0) {
    // LSE = ln(Σ exp(scale · S)) = (scale_log2 · max + log2 Σ) · ln 2
    const float natural =
        sum > 0.f ? (st.row_max * p.scale_log2 + arch::exact_log2(sum)) * 0.69314718055994531f : -__builtin_inff();
    lse[(p.group_mode ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + rows.q_start + row] = natural;
  }
}

}  // namespace fmha

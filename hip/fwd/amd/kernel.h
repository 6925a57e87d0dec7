// The attention forward kernel on AMD matrix cores (gfx942 / gfx950, wave64, MFMA 32x32): the
// algorithm and semantics of fwd/sm90/kernel.h (FlashAttention-2) in AMD's fragments.
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
//
// fp8 e4m3 inputs (the kv-cache's; the architecture's encoding, arch::Fp8E4m3) take the same path in
// rows of bytes (fwd/amd/tile.h): 8-bit MFMAs, Pᵀ rounded to fp8 as 2^kPShift · P, the descales of q
// and k folded into the softmax scale and v's into the normalisation, O in bf16.
//
// The kernel is its tile (fwd/amd/tile.h: the workgroup's shape and LDS layout), its K/V copy
// (fwd/amd/copy.h: global → registers → LDS), its mainloop (fwd/amd/mainloop.h: one K/V tile for one
// wave) and, at the end of forward_kernel_amd below, the epilogue (normalise O, store O and the LSE).
// The K/V tiles come from dense tensors (the forward) or through a page table (the kv-cache operation).
#pragma once

#include <type_traits>

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "arch/thread.h"
#include "common/descale.h"
#include "common/kept_range.h"
#include "common/sequence.h"
#include "launch.h"
#include "fwd/amd/copy.h"
#include "fwd/amd/mainloop.h"
#include "fwd/amd/tile.h"
#include "kvcache/split.h"

namespace fmha {

// Where a call's K and V tiles come from, per parameter block: `rows` (the sequence's query rows and
// KV length, from the constructor), `at_head(p, hk)` (the kv head, once the workgroup has rows to
// compute; after it, `qk_descale` and `v_descale` are the fp8 descales, 1 for other inputs and where
// they vary by page), `start(j0)` before the first tile, `load(copy, j0, valid_rows)`, which loads the
// tiles of keys j0.. into the copy's registers (called by every thread with j0 = first, first + N, ...,
// in uniform control flow), and with kPageScales `tile_scales()`, the K/V descales of the tile loaded
// last. fwd/amd/dense_tiles.h: dense tensors (fmha_fwd_params); kvcache/amd/paged_tiles.h: a paged pool
// (fmha_kvcache_params).
template <typename Params, typename Tile, bool kPageScales = false>
struct AmdKeyValueTiles;

// The descale of sequence b, kv head hk (per tensor or per (sequence, kv head); 1 where none is given),
// common/descale.h's rule through a global load (which the CPU emulation checks).
__device__ inline float amd_uniform_descale(const fmha_descale_params& d, int b, int hk) {
  const float* data = arch::global_pointer<const float>(d.data);
  return data != nullptr ? __builtin_bit_cast(float, arch::global_load_4(data + b * d.batch_stride + hk * d.head_stride))
                         : 1.f;
}

// kPackGqa (the kv-cache's decode): the workgroup's rows are (query row, query head) pairs of one kv
// head, so that its query heads share each K/V tile: tile row r is query row r / group of query head
// hk · group + r % group. kPageScales (the kv-cache's fp8 K/V descales per page): each tile's descales come
// with it (AmdKeyValueTiles::tile_scales) and attend_tile applies them.
template <typename T, int kHeadDim, bool kMasked, typename Params, bool kPackGqa = false, bool kPageScales = false>
__global__ void __launch_bounds__((AmdForwardTile<T, kHeadDim>::kThreads)) FMHA_AMD_MIN_WAVES_PER_SIMD(2)
    forward_kernel_amd(Params p) {
  using Tile = AmdForwardTile<T, kHeadDim>;
  using E = arch::Element<T>;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, kDimBlocks = Tile::kDim / 32;
  constexpr uint32_t kKV = Tile::kKVBytes, kVTiles = 2 * kKV;  // Vᵀ stages follow the two K stages
  __shared__ __attribute__((aligned(16))) uint8_t lds_bytes[Tile::kLdsBytes];
  arch::lds_byte* const lds = arch::lds_pointer(lds_bytes);

  // Split-KV (the kv-cache's decode): x = q tile · splits + split; the dense forward never splits.
  constexpr bool kCanSplit = std::is_same_v<Params, fmha_kvcache_params>;
  const int splits = kvcache::grid_splits(p);
  const kvcache::GridTile slot = kvcache::grid_tile(static_cast<int>(arch::block_index_x()),
                                                    static_cast<int>(arch::grid_blocks_x()), splits, kMasked);
  const int split = slot.split, tile = slot.tile;
  // y: the query head, or with packed GQA the kv head.
  const int y = arch::block_index_y();
  const int ratio = p.nhead_q / p.nhead_k, group = kPackGqa ? ratio : 1;
  const int hk = kPackGqa ? y : y / ratio;
  const auto head_of = [&](int r) { return kPackGqa ? hk * group + r % group : y; };
  // z: the sequence, in the prepare's longest-first order where it wrote one (kvcache/split.h).
  int b = static_cast<int>(arch::block_index_z());
  if constexpr (kCanSplit) b = arch::wave_uniform(kvcache::sequence_at(p, b));
  AmdKeyValueTiles<Params, Tile, kPageScales> kv(p, b);
  const BatchRows rows = kv.rows;
  const int64_t tile_rows = static_cast<int64_t>(rows.sq) * group;  // rows of this sequence's tiles
  const int i0 = tile * M;
  if (i0 >= tile_rows) return;
  const int i1 = i0 + M < tile_rows ? i0 + M : static_cast<int>(tile_rows);
  const int first_query = i0 / group, last_query = (i1 - 1) / group;
  kv.at_head(p, hk);
  const int64_t batch = p.group_mode ? 0 : b;

  // Query row first_query of head head_of(0) (packed: the kv head's first query head).
  const uint8_t* q = arch::global_pointer<const uint8_t>(p.q) + (batch * p.q_batch_stride + head_of(0) * p.q_head_stride +
                                                                 (rows.q_start + first_query) * p.q_row_stride) *
                                                                    E::kBytes;

  // Keys that any row of this tile keeps: [key_lo, key_hi); tiles outside are never visited.
  const ResolvedMask mask = resolve_mask(p.mask_type, p.window_left, p.window_right, rows.sq, rows.sk);
  int64_t key_lo = 0, key_hi = rows.sk;
  if (kMasked) {
    const int64_t lo = first_query + mask.off - mask.left, hi = last_query + mask.off + mask.right + 1;
    key_lo = lo > 0 ? lo : 0;
    key_hi = hi < rows.sk ? hi : rows.sk;
  }
  int first_tile = static_cast<int>(key_lo / N);
  int end_tile = key_hi > key_lo ? static_cast<int>((key_hi + N - 1) / N) : first_tile;
  // A split sequence's workgroup attends to its chunk's tiles only and leaves a partial state
  // (kvcache/split.h); an empty chunk leaves O = 0, LSE = -inf.
  bool partial = false;
  if constexpr (kCanSplit) {
    if (splits > 1) {
      const kvcache::Chunks chunks = arch::wave_uniform(kvcache::chunks(p, rows.sk));
      if (split >= chunks.count) return;
      partial = chunks.count > 1;
      if (partial) {
        const int lo = static_cast<int>(split * chunks.tiles), hi = static_cast<int>((split + 1) * chunks.tiles);
        first_tile = first_tile > lo ? first_tile : lo;
        end_tile = end_tile < hi ? end_tile : hi;
        end_tile = end_tile > first_tile ? end_tile : first_tile;
      }
    }
  }

  const int tid = arch::thread_index(), lane = tid % arch::kWaveSize, wave = tid / arch::kWaveSize;
  const int lane32 = lane % 32, half = lane / 32;
  const int row = i0 + wave * 32 + lane32;  // this lane's tile row: query row `query` of head `head`
  const int query = row / group, head = head_of(row);

  // Q first: the wait for the prologue's K/V loads (before their LDS stores) then covers it, and the
  // mainloop's waits are for its own loads only. Lanes past the batch's rows or the head dim read row
  // i0 (which exists) and keep zeros.
  LaneState<Tile> st;
  {
    const bool valid = row < tile_rows;
    // Fragment k8: bytes 16 k8 + 8 half .. + 7 of the row, elements kElements k8 + kElements / 2 half ...
    constexpr int kElements = 16 / E::kBytes;
    // Unpacked, 32-bit offsets within the tile's 128 rows; packed, the head stride joins them (64-bit).
    const uint8_t* q_row = q;
    if constexpr (kPackGqa) {
      q_row += ((query - first_query) * p.q_row_stride + (row % group) * p.q_head_stride) * E::kBytes;
    }
    const uint32_t offset = static_cast<uint32_t>(
        ((kPackGqa ? 0 : (wave * 32 + lane32) * p.q_row_stride) + kElements / 2 * half) * E::kBytes);
#pragma unroll
    for (int k8 = 0; k8 < Tile::kRowBytes / 16; ++k8) {
      const bool load = valid && kElements * k8 + kElements / 2 * half < p.hdim_q;
      const arch::u32x2 x = arch::global_load_8(kPackGqa ? (load ? q_row + offset + 16 * k8 : q)
                                                          : q + (load ? offset + 16 * k8 : 0u));
      st.q[k8] = load ? x : arch::u32x2(0u);
    }
  }

  // Rows of the tile starting at key j0 that exist.
  auto valid_keys = [&](int j0) { return rows.sk - j0 < N ? rows.sk - j0 : N; };
  KVCopy<Tile> copy(tid, p.k_row_stride, p.v_row_stride);
  if (first_tile < end_tile) {
    const int j0 = first_tile * N;
    kv.start(j0);
    kv.load(copy, j0, valid_keys(j0));
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
  int64_t interior_lo = kMasked ? last_query + mask.off - mask.left : 0;
  int64_t interior_hi =
      kMasked && first_query + mask.off + mask.right < rows.sk - 1 ? first_query + mask.off + mask.right : rows.sk - 1;
  interior_lo = interior_lo < 0 ? 0 : (interior_lo > rows.sk ? rows.sk : interior_lo);
  interior_hi = interior_hi < -1 ? -1 : interior_hi;
  const int interior_first = static_cast<int>(interior_lo), interior_last = static_cast<int>(interior_hi);
  const IndexRange keys = keys_of_row<kMasked>(mask, query, rows.sk);
  const float scale_log2 = p.scale_log2 * kv.qk_descale;

  float tile_v = 1.f;  // per-page descales: the V descale O is in units of
  for (int jt = first_tile; jt < end_tile; ++jt) {
    const uint32_t stage = static_cast<uint32_t>((jt - first_tile) & 1) * kKV;
    const bool more = jt + 1 < end_tile;
    const int next_valid = valid_keys((jt + 1) * N);
    float tile_dk = 1.f, o_rescale = 1.f;
    if constexpr (kPageScales) {
      const TileScales scales = kv.tile_scales();  // tile jt's, asked before the load of jt + 1
      tile_dk = scales.k;
      o_rescale = tile_v / scales.v;
      tile_v = scales.v;
    }
    if (more) {
      kv.load(copy, (jt + 1) * N, next_valid);
    }

    const int j0 = jt * N;
    const bool edge = j0 < interior_first || j0 + N - 1 > interior_last;
    const uint32_t k_base = stage + k_lane, v_base = kVTiles + stage + v_lane;
    attend_tile<Tile, T, kPageScales>(st, lds, k_base, v_base, scale_log2, edge, kept_range<N>(keys, j0 + 4 * half),
                                      tile_dk, o_rescale);

    // The other stage was last read before the previous barrier; the barrier below publishes it.
    if (more) copy.store(lds, kKV - stage, kVTiles + kKV - stage, next_valid, p.hdim_q, p.hdim_v);
    arch::block_barrier();
  }

  // Normalise and store O (rows past the batch's length are not written) and the natural-log LSE; a
  // partial state goes to the workspace in fp32. The halves' sums are combined before any lane leaves:
  // every lane takes part in the exchange. The parameters are read here (arch::reloaded), not held in
  // scalar registers through the mainloop.
  const float sum = arch::halves_sum(st.row_sum);
  if (row >= tile_rows) return;
  const Params& out = arch::reloaded(p);
  const float inverse = sum > 0.f ? kv.v_descale * tile_v / sum : 0.f;
  // LSE = ln(Σ exp(scale · S)) = (scale_log2 · max + log2 Σ) · ln 2, Σ in units of 2^-kPShift
  const auto natural_lse = [&] {
    return sum > 0.f ? (st.row_max * (out.scale_log2 * kv.qk_descale) + (arch::exact_log2(sum) - E::kPShift)) *
                           0.69314718055994531f
                     : -__builtin_inff();
  };
  if constexpr (kCanSplit) {
    if (partial) {
      const int64_t state = kvcache::partial_state(out, split, head, kvcache::partial_row(out, rows.q_start, b, query));
      float* o_state = arch::global_pointer<float>(out.partial_o) + state * out.hdim_v;
#pragma unroll
      for (int db = 0; db < kDimBlocks; ++db) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          const int col = db * 32 + 8 * g + 4 * half;
          if (col < out.hdim_v) {
            const arch::f32x16& o = st.o[db];
            arch::global_store_16(o_state + col, arch::u32x4{__builtin_bit_cast(uint32_t, o[4 * g] * inverse),
                                                             __builtin_bit_cast(uint32_t, o[4 * g + 1] * inverse),
                                                             __builtin_bit_cast(uint32_t, o[4 * g + 2] * inverse),
                                                             __builtin_bit_cast(uint32_t, o[4 * g + 3] * inverse)});
          }
        }
      }
      if (half == 0) arch::global_pointer<float>(out.partial_lse)[state] = natural_lse();
      return;
    }
  }
  uint16_t* out_row = arch::global_pointer<uint16_t>(out.o) + batch * out.o_batch_stride + head * out.o_head_stride +
                      (rows.q_start + query) * out.o_row_stride;
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int col = db * 32 + 8 * g + 4 * half;  // 4 consecutive dims: registers 4g .. 4g + 3
      if (col < out.hdim_v) {
        const arch::f32x16& o = st.o[db];
        arch::global_store_8(out_row + col, arch::pack4<typename E::Output>(o[4 * g] * inverse, o[4 * g + 1] * inverse,
                                                           o[4 * g + 2] * inverse, o[4 * g + 3] * inverse));
      }
    }
  }
  float* lse = arch::global_pointer<float>(out.lse);
  if (lse != nullptr && half == 0) {
    lse[(out.group_mode ? 0 : b * out.lse_batch_stride) + head * out.lse_head_stride + rows.q_start + query] =
        natural_lse();
  }
}

}  // namespace fmha

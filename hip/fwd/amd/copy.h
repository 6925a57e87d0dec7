// The forward's K/V copy on AMD (gfx942 / gfx950): one K tile and one V tile, global → registers →
// the swizzled LDS stages of fwd/amd/tile.h (V transposed on the way).
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "fwd/amd/tile.h"

namespace fmha {

// A thread's share of moving one K tile and one V tile global → registers → LDS. Addresses (`load`)
// are the tile's row 0 (wave-uniform) plus a 32-bit byte offset per thread (global_load with a scalar
// base: the launch stub refuses row strides for which 128 rows overflow 32 bits), or one address per
// row (`load_rows`). Loads of rows past `valid_rows` or of columns past the head dim read row 0
// instead (which exists; no branch), and `store` writes zeros for them: a zero V row times P = 0 adds
// nothing, where garbage could be NaN. The zeros are selected at the store, not at the load, so that
// nothing waits for the loads before the step's compute. A chunk is 16 bytes: 8 16-bit or 16 8-bit
// elements (the head dims are multiples of it).
//   K: 16-byte chunk `k_col / kDims` of rows k_row + i · kRowStep, stored as two 8-byte units. Lanes 0-7
//      take chunks 0-7 of one row, lanes 8-15 the same chunks of the next row, so that each 16-lane
//      phase of a ds_write_b64 hits 16 distinct slots of the bank window.
//   V: 16-byte chunk `v_col / kDims` (kDims dims) of the 4 keys 4 v_group .. 4 v_group + 3, transposed
//      in registers into kDims runs of Vᵀ (one per dim, 4 keys each: 8 bytes of 16-bit elements, 4 of
//      8-bit ones), at Tile::v_group_byte(v_group) of their rows. Lane bit 0 is the chunk's low bit
//      and lane bits 1-3 the group's low bits: with 16-bit elements the 16 lanes of a phase write 16
//      distinct slots (rows of 128 bytes). At most one V job per thread; threads past the last group
//      have none.
template <typename Tile>
struct KVCopy {
  static constexpr int N = Tile::kBlockN, kChunks = Tile::kChunks, kThreads = Tile::kThreads;
  static constexpr int kBytes = Tile::kBytes, kDims = 16 / kBytes;  // elements per chunk
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
    k_col = ((tid & 7) + 8 * ((tid >> 4) % kHigh)) * kDims;
    k_row = ((tid >> 3) & 1) + 2 * ((tid >> 4) / kHigh);
    constexpr int kHalfChunks = kChunks / 2;
    v_col = ((tid & 1) + 2 * ((tid >> 4) % kHalfChunks)) * kDims;
    v_group = ((tid >> 1) & 7) + 8 * ((tid >> 4) / kHalfChunks);
    k_offset = static_cast<uint32_t>((k_row * k_stride + k_col) * kBytes);
    k_step = static_cast<uint32_t>(kRowStep * k_stride * kBytes);
    v_offset = static_cast<uint32_t>((4 * v_group * v_stride + v_col) * kBytes);
    v_step = static_cast<uint32_t>(v_stride * kBytes);
  }

  __device__ bool k_valid(int i, int valid_rows, int hdim_q) const {
    return k_col < hdim_q && k_row + i * kRowStep < valid_rows;
  }
  __device__ bool v_valid(int e, int valid_rows, int hdim_v) const {
    return v_group < kGroups && v_col < hdim_v && 4 * v_group + e < valid_rows;
  }

  // `kg` / `vg`: row 0 of the tile.
  __device__ void load(const void* kg, const void* vg, int valid_rows, int hdim_q, int hdim_v) {
    const uint8_t* kb = static_cast<const uint8_t*>(kg);
    const uint8_t* vb = static_cast<const uint8_t*>(vg);
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      k[i] = arch::global_load_16(kb + (k_valid(i, valid_rows, hdim_q) ? k_offset + i * k_step : 0u));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = arch::global_load_16(vb + (v_valid(e, valid_rows, hdim_v) ? v_offset + e * v_step : 0u));
    }
  }

  // The same tiles with each row at its own address (a paged pool's rows of one tile may lie in
  // different pages): `k_row_at(r)` / `v_row_at(r)` give the byte address of tile row r. They are
  // called for every row of the thread in every lane, with row 0 where the row or column is not
  // loaded (so they may exchange values between the lanes of the wave).
  template <typename KRowAt, typename VRowAt>
  __device__ void load_rows(KRowAt k_row_at, VRowAt v_row_at, int valid_rows, int hdim_q, int hdim_v) {
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      const bool valid = k_valid(i, valid_rows, hdim_q);
      const uint8_t* row = k_row_at(valid ? k_row + i * kRowStep : 0);
      k[i] = arch::global_load_16(row + (valid ? kBytes * k_col : 0));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool valid = v_valid(e, valid_rows, hdim_v);
      const uint8_t* row = v_row_at(valid ? 4 * v_group + e : 0);
      v[e] = arch::global_load_16(row + (valid ? kBytes * v_col : 0));
    }
  }

  // K into the K tile at byte offset `k_tile`, Vᵀ into the Vᵀ tile at `v_tile`; the same `valid_rows`
  // and head dims as the load.
  __device__ void store(arch::lds_byte* lds, uint32_t k_tile, uint32_t v_tile, int valid_rows, int hdim_q,
                        int hdim_v) const {
    const int unit = k_col * kBytes / 8;
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
    const uint32_t at = Tile::v_group_byte(v_group);
    const int run_unit = static_cast<int>(at / 8);
    const uint32_t in_unit = at % 8;
#pragma unroll
    for (int x = 0; x < kDims; ++x) {
      // Dim v_col + x of keys 4 v_group + e: element x % (4 / kBytes) of word x / (4 / kBytes) of y[e].
      constexpr int kPerWord = 4 / kBytes, kBits = 8 * kBytes;
      constexpr uint32_t kMask = (1u << kBits) - 1u;
      uint32_t d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = (y[e][x / kPerWord] >> (kBits * (x % kPerWord))) & kMask;
      const uint32_t slot = v_tile + swizzled<Tile::kVUnits>(v_col + x, run_unit) + in_unit;
      if constexpr (kBytes == 1) {
        arch::lds_store_4(lds, slot, d[0] | (d[1] << 8) | (d[2] << 16) | (d[3] << 24));
      } else {
        arch::lds_store_8(lds, slot, arch::u32x2{d[0] | (d[1] << 16), d[2] | (d[3] << 16)});
      }
    }
  }
};

}  // namespace fmha

// The kv-cache forward's K/V tiles on AMD (gfx942 / gfx950): key j of a sequence is row j mod P of
// page page_id(j / P) (clamped: kvcache/page_table.h). The LDS holds exactly two workgroups' K/V
// stages on gfx942, so nothing paged lives in it: lane r of every wave resolves row r of the next tile
// (its page id loaded one tile ahead, so no copy waits for a table load) into the row's K and V pool
// offsets, and
//   * pages holding whole tiles (P a multiple of the tile): the tile is one page, every lane resolves
//     row 0, and the tile copies like a dense one from that wave-uniform base (KVCopy::load);
//   * smaller pages: each copy row takes its row's offsets from the lane that resolved it (ds_bpermute)
//     and loads from a 64-bit address (KVCopy::load_rows), so pools of any size work.
// Token -> (logical page, row) is a multiply-shift by a reciprocal computed once (any P >= 1).
// fp8 descales: per tensor or per (sequence, kv head), read once per workgroup; per page (kPageScales,
// pages of whole tiles: the launcher refuses smaller ones), each tile's K and V descale loaded with its
// page id's use, one tile ahead of its compute.
#pragma once

#include "arch/amd/matrix_core.h"
#include "arch/thread.h"
#include "common/sequence.h"
#include "fwd/amd/copy.h"
#include "fwd/amd/kernel.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {

template <typename Tile, bool kPageScales>
struct AmdKeyValueTiles<fmha_kvcache_params, Tile, kPageScales> {
  static constexpr int N = Tile::kBlockN, kBytes = Tile::kBytes;
  static_assert(N <= arch::kWaveSize, "one lane per tile row");

  // Table entries through global loads (the CPU emulation checks them like every other access).
  struct TableLoad {
    __device__ int32_t operator()(const int32_t* entry) const {
      return static_cast<int32_t>(arch::global_load_4(entry));
    }
  };

  BatchRows rows;
  int64_t first;  // the table index of the sequence's logical page 0 (CONTIGUOUS: its slot)
  // The kernel's parameters: read where used (arch::reloaded), not held in scalar registers across
  // the mainloop, which with the pools' strides and pointers would outgrow them.
  const fmha_kvcache_params& params;
  int sequence, hk = 0;  // b, and the kv head
  // fp8 descales of this sequence and kv head: q's times k's, and v's (1 for 16-bit inputs).
  float qk_descale = 1.f, v_descale = 1.f;
  // floor(t / P) = (t · reciprocal) >> shift(P) for 0 <= t < 2^31: reciprocal = ceil(2^shift / P) with
  // shift = 31 + ceil(log2 P) (Granlund and Montgomery, Theorem 4.2, N = 31); it fits in 32 bits.
  uint32_t reciprocal;
  int32_t ahead = 0;  // the page of this lane's row of the next tile, loaded one tile ahead
  // Per-page descales: this kv head's column of the K and V arrays (null where uniform), their page
  // strides, and the values of the tile loaded last.
  const float* k_page_scales = nullptr;
  const float* v_page_scales = nullptr;
  int64_t k_scale_stride = 0, v_scale_stride = 0;
  float loaded_k = 1.f, loaded_v = 1.f;

  __device__ AmdKeyValueTiles(const fmha_kvcache_params& p, int b) : params(p), sequence(b) {
    kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
    // Read through generic pointers, hence per-lane to the compiler: the same in every lane.
    const kvcache::Sequence seq = arch::wave_uniform(kvcache::resolve(p, b, ignored));
    rows.q_start = seq.q_start;
    rows.k_start = 0;
    rows.sq = static_cast<int32_t>(seq.sq);
    rows.sk = static_cast<int32_t>(seq.kv_len);
    first = seq.first;
    const uint32_t page_size = static_cast<uint32_t>(p.page_size);
    reciprocal = static_cast<uint32_t>(((uint64_t(1) << shift(page_size)) + page_size - 1) / page_size);
  }

  __device__ void at_head(const fmha_kvcache_params& p, int kv_head) {
    hk = kv_head;
    if constexpr (kBytes == 1) {
      const bool k_paged = kPageScales && p.k_descale.data != 0 && p.k_descale.page_stride != 0;
      const bool v_paged = kPageScales && p.v_descale.data != 0 && p.v_descale.page_stride != 0;
      qk_descale = amd_uniform_descale(p.q_descale, sequence, hk) *
                   (k_paged ? 1.f : amd_uniform_descale(p.k_descale, sequence, hk));
      v_descale = v_paged ? 1.f : amd_uniform_descale(p.v_descale, sequence, hk);
      if (k_paged) {
        k_page_scales = arch::global_pointer<const float>(p.k_descale.data) + hk * p.k_descale.head_stride;
        k_scale_stride = p.k_descale.page_stride;
      }
      if (v_paged) {
        v_page_scales = arch::global_pointer<const float>(p.v_descale.data) + hk * p.v_descale.head_stride;
        v_scale_stride = p.v_descale.page_stride;
      }
    }
  }

  // The K and V descales of the tile loaded last (the kernel asks before it loads the next).
  __device__ TileScales tile_scales() const { return TileScales{loaded_k, loaded_v}; }

  __device__ static uint32_t shift(uint32_t page_size) {
    return 31 + (page_size > 1 ? 32 - __builtin_clz(page_size - 1) : 0);
  }
  __device__ static bool whole_tiles(uint32_t page_size) { return page_size % N == 0; }

  // This lane's token in the tile of keys j0.. (it resolves row `lane % N`, or row 0 when the tile lies
  // in one page, so that the value is the same in every lane): rows past the sequence take its last
  // key (which exists: only tiles starting before the end are loaded), whose page the lookup may read.
  __device__ uint32_t token(uint32_t page_size, int64_t j0) const {
    const int64_t t = j0 + (whole_tiles(page_size) ? 0 : static_cast<int>(arch::thread_index() % N));
    return static_cast<uint32_t>(t < rows.sk ? t : rows.sk - 1);
  }
  __device__ uint32_t page_of(uint32_t page_size, uint32_t token) const {
    return static_cast<uint32_t>((uint64_t(token) * reciprocal) >> shift(page_size));
  }
  // Starts the load of this lane's page in the tile of keys j0...
  __device__ int32_t page_of_row(const fmha_kvcache_params& p, int64_t j0) const {
    const uint32_t page_size = static_cast<uint32_t>(p.page_size);
    kvcache::Sequence seq = {};
    seq.first = first;
    seq.last_page = page_of(page_size, static_cast<uint32_t>(rows.sk - 1));
    return static_cast<int32_t>(
        kvcache::PageLookup::of(p).page_id(seq, page_of(page_size, token(page_size, j0)), TableLoad()));
  }

  // Before the first load: the page of this lane's row of the first tile.
  __device__ void start(int j0) { ahead = page_of_row(arch::reloaded(params), j0); }

  __device__ void load(KVCopy<Tile>& copy, int j0, int valid_rows) {
    const fmha_kvcache_params& p = arch::reloaded(params);
    const uint32_t page_size = static_cast<uint32_t>(p.page_size);
    const uint32_t t = token(page_size, j0), u = t - page_of(page_size, t) * page_size;
    const int64_t k_offset = kBytes * (ahead * p.k_batch_stride + u * p.k_row_stride);
    const int64_t v_offset = kBytes * (ahead * p.v_batch_stride + u * p.v_row_stride);
    if constexpr (kPageScales) {  // pages of whole tiles: `ahead` is the tile's page in every lane
      if (k_page_scales != nullptr) loaded_k = __builtin_bit_cast(float, arch::global_load_4(k_page_scales + ahead * k_scale_stride));
      if (v_page_scales != nullptr) loaded_v = __builtin_bit_cast(float, arch::global_load_4(v_page_scales + ahead * v_scale_stride));
    }
    const uint8_t* k = arch::global_pointer<const uint8_t>(p.k) + kBytes * hk * p.k_head_stride;
    const uint8_t* v = arch::global_pointer<const uint8_t>(p.v) + kBytes * hk * p.v_head_stride;
    if (whole_tiles(page_size)) {
      copy.load(k + arch::wave_uniform(k_offset), v + arch::wave_uniform(v_offset), valid_rows, p.hdim_q, p.hdim_v);
    } else {
      auto row_of = [](const uint8_t* pool, int64_t offset, int r) {
        const uint64_t x = static_cast<uint64_t>(offset);
        const uint32_t lo = arch::lane_value(static_cast<uint32_t>(x), r);
        const uint32_t hi = arch::lane_value(static_cast<uint32_t>(x >> 32), r);
        return pool + static_cast<int64_t>((uint64_t(hi) << 32) | lo);
      };
      copy.load_rows([&](int r) { return row_of(k, k_offset, r); }, [&](int r) { return row_of(v, v_offset, r); },
                     valid_rows, p.hdim_q, p.hdim_v);
    }
    // In flight while this tile is stored and the next one computed.
    ahead = page_of_row(p, int64_t(j0) + N);
  }
};

}  // namespace fmha

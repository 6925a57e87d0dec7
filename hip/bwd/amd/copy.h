// The backward's (dq_dk_dv) copies on AMD (gfx942 / gfx950): blocks of 16-bit rows global → registers →
// LDS (row-major and transposed), the buffers that read zeros past a tile's end, and a step's q-tile copy
// (Q, dO, LSE, D) into the LDS layout of bwd/amd/tile.h.
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "launch.h"
#include "bwd/unit_walk.h"
#include "bwd/amd/tile.h"

namespace fmha {

// A thread's block of a tile of 16-bit rows, moved global → registers → LDS: 4 consecutive rows × one
// 16-byte chunk (8 columns), stored row-major (two 8-byte units per row) or transposed (one unit of the
// 4 rows per column). Block b of a tile of kChunks chunks per row: bits 0-2 of b are the block row's
// low bits and bit 3 the chunk's low bit (then the chunk's other bits, then the block row's), so that
// the 16 lanes of a ds_write_b64 phase hit 16 distinct slots of the bank window in both orientations:
// row-major, lanes with bit 2 set write their chunk's second unit first; transposed, lanes with bit 3
// set write their columns in the order 1, 0, 3, 2, ... (a shift, not a register index). Rows past
// `valid_rows` and chunks past `cols` are loaded from the tile buffer's end, as zeros.
template <int kChunks>
struct BlockCopy {
  int row, col;     // first row and first column (elements) of the block
  uint32_t offset;  // bytes from row 0 to the block's first chunk
  arch::u32x4 x[4];

  BlockCopy() = default;
  __device__ BlockCopy(int block, int64_t stride) {
    row = 4 * ((block & 7) + 8 * ((block >> 4) / (kChunks / 2)));
    col = 8 * (((block >> 3) & 1) + 2 * ((block >> 4) % (kChunks / 2)));
    offset = static_cast<uint32_t>((row * stride + col) * 2);
  }

  // `tile`: the tile's rows from row 0, `row_bytes` apart, ending at byte `end` (tile_buffer).
  __device__ void load(arch::Buffer tile, uint32_t end, uint32_t row_bytes, int valid_rows, int cols) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[e] = arch::buffer_load_16(tile, col < cols && row + e < valid_rows ? offset + e * row_bytes : end);
    }
  }

  // Row-major into the LDS tile at byte offset `at` of kUnits units per row.
  template <int kUnits>
  __device__ void store_rows(arch::lds_byte* lds, uint32_t at) const {
    const int unit = col / 4, swap = (row >> 4) & 1;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const arch::u32x2 first = arch::u32x2{x[e].x, x[e].y}, second = arch::u32x2{x[e].z, x[e].w};
      arch::lds_store_8(lds, at + swizzled<kUnits>(row + e, unit + swap), swap ? second : first);
      arch::lds_store_8(lds, at + swizzled<kUnits>(row + e, unit + 1 - swap), swap ? first : second);
    }
  }

  // Transposed (row = column of the block's tile, unit = the block's 4 rows) into the LDS tile at `at`.
  template <int kUnits>
  __device__ void store_columns(arch::lds_byte* lds, uint32_t at) const {
    const int flip = (col >> 3) & 1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // Column c = i ^ flip of the chunk: the low or high half of word i / 2 (= c / 2) of each row.
      const int c = i ^ flip, shift = 16 * (c & 1);
      uint32_t d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) d[e] = (x[e][i / 2] >> shift) & 0xffffu;
      arch::lds_store_8(lds, at + swizzled<kUnits>(col + c, row / 4),
                        arch::u32x2{d[0] | (d[1] << 16), d[2] | (d[3] << 16)});
    }
  }
};

// The buffer over a tile of `rows` rows of `cols` 16-bit elements, `stride` elements apart, from `base`,
// up to its last element: its size in bytes is also the offset that reads zeros.
struct TileBuffer {
  arch::Buffer buffer;
  uint32_t end;
};

__device__ inline TileBuffer tile_buffer(const uint16_t* base, int rows, int64_t stride, int cols) {
  TileBuffer t;
  t.end = static_cast<uint32_t>(((rows - 1) * stride + cols) * 2);
  t.buffer = arch::make_buffer(base, t.end);
  return t;
}

// The q-tile copy of one step: threads 0-127 (waves 0 and 1) move Q, threads 128-255 dO, one block each,
// into both orientations; wave 0 moves the LSE rows (as LSE · log2 e, 0 for a fully masked row's -inf)
// and wave 1 the D rows, row lane % kBlockM (lanes with equal rows store equal values: no lane masks).
// Rows past the batch's end read as zeros in all four, so that they add nothing (their P is finite,
// their dO and D are 0). The tensors' addresses are recomputed from the parameters at each load.
template <typename Tile>
struct StepCopy {
  BlockCopy<Tile::kChunks> block;
  bool q_side, stats, stat_lse;  // wave-uniform
  int stat_row;                  // this lane's LSE or D row
  uint32_t stat;

  // `wave`: this thread's wave, as a scalar.
  __device__ StepCopy(const fmha_bwd_params& p, int tid, int wave)
      : block(tid % (Tile::kThreads / 2), wave < Tile::kWaves / 2 ? p.q_row_stride : p.do_row_stride) {
    static_assert(Tile::kBlockM <= arch::kWaveSize, "a wave holds the LSE or D rows");
    q_side = wave < Tile::kWaves / 2;
    stats = wave < 2;
    stat_lse = wave == 0;
    stat_row = tid % Tile::kBlockM;
  }

  // `row0`: the tile's first row in the tensors (the batch's physical start plus tile.i0); `valid_rows`:
  // the batch's rows from there on.
  __device__ void load(const fmha_bwd_params& p, int64_t batch, const QTile& tile, int64_t row0, int valid_rows) {
    const int tile_rows = valid_rows < Tile::kBlockM ? valid_rows : Tile::kBlockM;
    const uint16_t* src = q_side ? arch::global_pointer<const uint16_t>(p.q) + batch * p.q_batch_stride +
                                       tile.h * p.q_head_stride + row0 * p.q_row_stride
                                 : arch::global_pointer<const uint16_t>(p.d_o) + batch * p.do_batch_stride +
                                       tile.h * p.do_head_stride + row0 * p.do_row_stride;
    const int64_t row_stride = q_side ? p.q_row_stride : p.do_row_stride;
    const int cols = q_side ? p.hdim_q : p.hdim_v;
    const TileBuffer t = tile_buffer(src, tile_rows, row_stride, cols);
    block.load(t.buffer, t.end, static_cast<uint32_t>(row_stride * 2), valid_rows, cols);
    if (stats) {
      const float* src = stat_lse ? arch::global_pointer<const float>(p.lse) + batch * p.lse_batch_stride +
                                          tile.h * p.lse_head_stride + row0
                                    : arch::global_pointer<const float>(p.d) + batch * p.d_batch_stride +
                                          tile.h * p.d_head_stride + row0;
      stat = arch::buffer_load_4(arch::make_buffer(src, 4 * tile_rows), 4 * stat_row);
    }
  }

  __device__ void store(arch::lds_byte* lds) const {
    block.template store_rows<Tile::kRowUnits>(lds, q_side ? Tile::kQRows : Tile::kDoRows);
    block.template store_columns<Tile::kColUnits>(lds, q_side ? Tile::kQCols : Tile::kDoCols);
    if (stats) {
      constexpr float kLog2e = 1.4426950408889634f;
      const float x = __builtin_bit_cast(float, stat);
      const float value = !stat_lse ? x : (x == -__builtin_inff() ? 0.f : x * kLog2e);
      arch::lds_store_4(lds, (stat_lse ? Tile::kLse : Tile::kDelta) + 4 * stat_row,
                        __builtin_bit_cast(uint32_t, value));
    }
  }
};

}  // namespace fmha

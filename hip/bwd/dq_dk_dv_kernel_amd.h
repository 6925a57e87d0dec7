// Stage 2 of the backward on AMD matrix cores (gfx942 / gfx950, wave64, MFMA 32x32): the algorithm and
// semantics of bwd/dq_dk_dv_kernel.h (FlashAttention-2's dK/dV-resident backward; host twin
// src/host_kernels/backward/dq_dk_dv.rs) in AMD's fragments.
//
// A work unit is one (batch, kv head, K tile of kBlockN = 128 keys); wave w owns keys 32 w .. 32 w + 31.
// The q tiles (kBlockM rows) of every query head of the GQA group stream past. Per q tile, a wave
// computes S = Q·Kᵀ and dP = dO·Vᵀ for its keys and all the tile's rows, so that lane l owns key l % 32
// and, of every 32-row block, the 16 rows of its half l / 32. An accumulator is then the B operand of a
// product that sums over its rows (arch/amd/matrix_core.h), so that, with no data movement,
//   dVᵀ += dOᵀ·P,   dKᵀ += Qᵀ·dS,   where P = 2^(scale_log2 · S - LSE · log2 e), dS = P ∘ (dP - D),
// and dKᵀ, dVᵀ stay in registers for the whole unit (the lane's key, 16 dims of each 32-dim block). K
// and V are B operands too, loaded into registers once per unit; so is K a second time, as the B
// operand of dQ (a lane per dim instead of per key), through LDS. The q tile's Q and dO pass through
// LDS twice: row-major (the A operand of S and dP, a lane per q row) and transposed (the A operand of
// dKᵀ and dVᵀ, a lane per dim), both written by one thread from the same registers. dS goes to LDS
// row-major, and after a barrier each wave computes one 32×32 block of dQ = scale · dS·K and adds it to
// the unit's dq_acc split slot with atomics. Non-deterministic mode: one workgroup per unit, slot 0,
// adds in any order. Deterministic mode: the persistent schedule gives every slot to one workgroup,
// and every element of it to one lane (its position in the q tile, the same in every unit), whose adds
// apply in program order. The slots are zeroed before the kernel (kFirstUnitWritesSlot is false here:
// the deterministic variants hold 102-106 scalar registers, and the first-unit stores of the NVIDIA
// kernel made them spill).
// dK (scaled) and dV are stored once per unit. Fully masked q tiles are never visited. Rows and keys
// past the batch's end and padding columns read as zeros (buffer loads past a tile's end): such rows
// add nothing (their dO, D and so dS are 0), such keys are masked on the edge tiles they lie in.
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "arch/registers.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/unit_walk.h"
#include "common/kept_range.h"

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

template <typename Tile, typename T, bool kMasked>
__device__ inline void run_unit(const fmha_bwd_params& p, const WorkUnit& scheduled, arch::lds_byte* lds) {
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, kDimBlocks = Tile::kDimBlocks;
  // The schedule and the walk read the workspace and the sequence arrays through generic pointers; the
  // values are the same in every lane (the buffer descriptors made from them must be scalar).
  const WorkUnit unit = arch::wave_uniform(scheduled);
  const UnitQTiles<M, N, kMasked> walk = arch::wave_uniform(UnitQTiles<M, N, kMasked>(p, unit));
  if (!walk.has_keys()) return;
  const BatchRows& rows = walk.rows;
  const int64_t batch = walk.batch, steps = walk.steps;
  const int hk = unit.head;
  const int tid = arch::thread_index(), lane = tid % arch::kWaveSize, lane32 = lane % 32, half = lane / 32;
  const int wave = arch::wave_uniform(tid / arch::kWaveSize);
  const int valid_keys = static_cast<int>(walk.j1 - walk.j0);
  const int64_t key = walk.j0 + 32 * wave + lane32;  // this lane's key
  // The wave's dQ block: q rows 32 q_block .., dims 32 d_block ..
  const int q_block = wave / kDimBlocks, d_block = wave % kDimBlocks;

  const TileBuffer k = tile_buffer(arch::global_pointer<const uint16_t>(p.k) + batch * p.k_batch_stride +
                                       hk * p.k_head_stride + (rows.k_start + walk.j0) * p.k_row_stride,
                                   valid_keys, p.k_row_stride, p.hdim_q);
  const TileBuffer v = tile_buffer(arch::global_pointer<const uint16_t>(p.v) + batch * p.v_batch_stride +
                                       hk * p.v_head_stride + (rows.k_start + walk.j0) * p.v_row_stride,
                                   valid_keys, p.v_row_stride, p.hdim_v);

  // K once more for dQ: the tile's blocks, transposed into LDS (Kᵀ: a row per dim), read back below.
  constexpr int kKtBlocks = N * Tile::kChunks / 4 / Tile::kThreads;
  BlockCopy<Tile::kChunks> kt[kKtBlocks];
#pragma unroll
  for (int i = 0; i < kKtBlocks; ++i) {
    kt[i] = BlockCopy<Tile::kChunks>(tid + i * Tile::kThreads, p.k_row_stride);
    kt[i].load(k.buffer, k.end, static_cast<uint32_t>(p.k_row_stride * 2), valid_keys, p.hdim_q);
  }

  // K and V rows of the lane's key as B fragments (zeros past the keys or the head dims).
  UnitState<Tile> st;
  {
    const bool valid = 32 * wave + lane32 < valid_keys;
    const uint32_t k_offset = static_cast<uint32_t>(((32 * wave + lane32) * p.k_row_stride + 4 * half) * 2);
    const uint32_t v_offset = static_cast<uint32_t>(((32 * wave + lane32) * p.v_row_stride + 4 * half) * 2);
#pragma unroll
    for (int s = 0; s < Tile::kDim / 8; ++s) {
      st.k[s] = arch::buffer_load_8(k.buffer, valid && 8 * s < p.hdim_q ? k_offset + 16 * s : k.end);
      st.v[s] = arch::buffer_load_8(v.buffer, valid && 8 * s < p.hdim_v ? v_offset + 16 * s : v.end);
    }
  }

  StepCopy<Tile> copy(p, tid, wave);
  const auto valid_rows = [&](const QTile& tile) { return static_cast<int>(rows.sq - tile.i0); };
  QTile next = {0, 0};
  if (steps > 0) {
    next = walk.tile(0);
    copy.load(p, batch, next, rows.q_start + next.i0, valid_rows(next));
  }

#pragma unroll
  for (int i = 0; i < kKtBlocks; ++i) kt[i].template store_columns<Tile::kKeyUnits>(lds, Tile::kKt);
  arch::block_barrier();
  {
    // Kᵀ row 32 d_block + lane % 32, unit 2 s + half: keys 8 s + 4 half + 0..3.
    const uint32_t kt_lane = swizzled<Tile::kKeyUnits>(32 * d_block + lane32, half);
#pragma unroll
    for (int s = 0; s < N / 8; ++s) st.kd[s] = arch::lds_load_8(lds, Tile::kKt + (kt_lane ^ (16 * s)));
  }
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) st.dk[db] = st.dv[db] = arch::zero_accumulator();
  arch::block_barrier();  // Kᵀ is read: its LDS takes the q tiles

  LaneOffsets at;
  at.rows = swizzled<Tile::kRowUnits>(lane32, half);
  at.columns = swizzled<Tile::kColUnits>(lane32, half);
  at.ds = swizzled<Tile::kKeyUnits>(32 * q_block + lane32, half);
  const int key_unit = (32 * wave + lane32) / 4, key_byte = 2 * (lane32 % 4);
  const IndexRange key_rows = rows_of_key<kMasked>(walk.mask, key, rows.sq, rows.sk);
  const DqAccBlock acc = dq_acc_block(p, unit.batch);
  float* const slot = dq_acc_region(p) + acc.index(hk, unit.split, 0, 0);  // + query head gh: gh · hdim_q

  if (steps > 0) {
    copy.store(lds);
    arch::block_barrier();
  }
  for (int64_t step = 0; step < steps; ++step) {
    const QTile tile = next;
    const bool more = step + 1 < steps;
    next = walk.next(tile);
    if (more) copy.load(arch::reloaded(p), batch, next, rows.q_start + next.i0, valid_rows(next));

    accumulate_dk_dv<Tile, T>(st, lds, at, p.scale_log2, walk.edge(tile),
                              kept_range<M>(key_rows, tile.i0 + 4 * half), key_unit, key_byte, half);
    arch::block_barrier();  // dS is complete; the q tile is no longer read

    if (more) copy.store(lds);
    const int gh = tile.h - walk.first_head;
    accumulate_dq<Tile, T>(st, lds, at.ds, slot + gh * p.hdim_q, acc.row_elements, tile.i0, rows.sq,
                           32 * d_block + lane32, p.hdim_q, p.scale, q_block, half);
    arch::block_barrier();  // dS is read; the next q tile is in LDS
  }

  // dK = scale · Σ dSᵀ·Q and dV of the lane's key (zero when no query row reached the tile): registers
  // 4g .. 4g + 3 of block db are dims 32 db + 8 g + 4 half + 0..3.
  if (key >= rows.sk) return;
  uint16_t* dk = arch::global_pointer<uint16_t>(p.dk) + batch * p.dk_batch_stride + hk * p.dk_head_stride +
                 (rows.k_start + key) * p.dk_row_stride;
  uint16_t* dv = arch::global_pointer<uint16_t>(p.dv) + batch * p.dv_batch_stride + hk * p.dv_head_stride +
                 (rows.k_start + key) * p.dv_row_stride;
#pragma unroll
  for (int db = 0; db < kDimBlocks; ++db) {
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int col = 32 * db + 8 * g + 4 * half;
      const arch::f32x16& x = st.dk[db];
      const arch::f32x16& y = st.dv[db];
      const float scale = p.scale;
      if (col < p.hdim_q) {
        arch::global_store_8(dk + col, arch::pack4<T>(x[4 * g] * scale, x[4 * g + 1] * scale, x[4 * g + 2] * scale,
                                                     x[4 * g + 3] * scale));
      }
      if (col < p.hdim_v) {
        arch::global_store_8(dv + col, arch::pack4<T>(y[4 * g], y[4 * g + 1], y[4 * g + 2], y[4 * g + 3]));
      }
    }
  }
}

// One wave per SIMD: K, V and the dK, dV accumulators of a wave's 32 keys, with a step's S, dP and dQ,
// take most of the 512 registers (VGPRs and AGPRs) at D = 128.
template <typename T, int kHeadDim, bool kMasked, bool kDeterministic>
__global__ void __launch_bounds__(AmdBackwardTile<kHeadDim>::kThreads) FMHA_AMD_MIN_WAVES_PER_SIMD(1)
    dq_dk_dv_kernel_amd(fmha_bwd_params p) {
  using Tile = AmdBackwardTile<kHeadDim>;
  __shared__ __attribute__((aligned(16))) uint8_t lds_bytes[Tile::kLdsBytes];
  arch::lds_byte* const lds = arch::lds_pointer(lds_bytes);
  if (!workspace_prepared(p)) return;
  for_each_unit<kDeterministic>(
      p, kMasked, [&](const WorkUnit& unit) { run_unit<Tile, T, kMasked>(arch::reloaded(p), unit, lds); });
}

}  // namespace fmha

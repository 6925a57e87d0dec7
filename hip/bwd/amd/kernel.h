// Stage 2 of the backward on AMD matrix cores (gfx942 / gfx950, wave64, MFMA 32x32): the algorithm and
// semantics of bwd/sm90/kernel.h (FlashAttention-2's dK/dV-resident backward; host twin
// src/launch/host/backward/dq_dk_dv.rs) in AMD's fragments.
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
//
// The kernel is its tile (bwd/amd/tile.h: the workgroup's shape and LDS layout), its copies
// (bwd/amd/copy.h: global → registers → LDS), its mainloop (bwd/amd/mainloop.h: dK/dV and dQ of one
// q tile) and, in run_unit below, the walk of a unit's q tiles and the epilogue (store dK and dV); the
// units come from the schedule (bwd/unit_walk.h's for_each_unit).
#pragma once

#include "arch/amd/lds_swizzle.h"
#include "arch/amd/matrix_core.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/unit_walk.h"
#include "common/kept_range.h"
#include "bwd/amd/copy.h"
#include "bwd/amd/mainloop.h"
#include "bwd/amd/tile.h"

namespace fmha {

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

// Stage 2 of the backward on Hopper tensor cores (wgmma, sm_90a): FlashAttention-2's dK/dV-resident
// algorithm (host twin: src/launch/host/backward/dq_dk_dv.rs), warp-specialized.
//
// A work unit is one (batch, kv head, K tile of kBlockN keys); a consumer warpgroup owns 64 keys. K and V
// stay in shared memory while the q tiles (kBlockM rows) of every query head of the GQA group stream past
// with their dO, LSE and D rows. Per q tile, each consumer warpgroup computes its keys' transposed scores
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (both operands from shared memory), so that the accumulators are directly the
// register A operands of
//   dV += Pᵀ·dO,   dK += dSᵀ·Q,     with P = 2^(scale_log2 · S - LSE · log2 e), dS = P ∘ (dP - D),
// and stores dSᵀ to shared memory, from which each warpgroup then computes its half of the columns of
// dQ = dS·K for the tile and sends it to the unit's dq_acc split slot. dK (scaled) and dV are stored once
// per unit. Fully masked q tiles are never visited. At D = 256 both warpgroups own the same 64 keys, each
// half of dK/dV's columns: each computes Sᵀ and dPᵀ of half the tile's q rows, and dV and dK read the
// whole Pᵀ and dSᵀ from shared memory (bwd/sm90/mainloop.h's accumulate_dk_dv_halves).
//
// A producer warpgroup loads K and V once per unit and each q tile's Q, dO, LSE and D into the next stage
// (of two; one at D = 256), ahead of the consumers: Q and dO as TMA boxes from one thread where `maps`
// describes them (boxed_unit), everything else by cp.async, every thread a share. The stages pass through
// mbarriers: a producer thread's arrival on a full barrier completes once its copies (and the stage's
// boxes) have landed; every consumer thread arrives on the empty barrier of a stage it no longer reads.
// The consumers meet once per step, at a named barrier, when every warp's dSᵀ is in shared memory
// (dQ = dS·K needs all of the tile's keys); dSᵀ is double-buffered, so that a warpgroup writes the next
// step's while the other's dQ product still reads this one. dQ rows leave through shared memory as TMA
// boxes (`maps.dq`, where the launcher could encode it) or element-wise, without waiting.
//
// Non-deterministic mode: one workgroup per unit (the grid cell), slot 0, adds in any order.
// Deterministic mode, by the tile's DqScheme (bwd/sm90/tile.h):
// - split slots (CK's): the persistent schedule gives every slot to one workgroup (its units posted
//   through shared memory, PostedUnits), and every element of it to one thread, whose stores and adds
//   apply in program order (a unit's first boxes wait for the previous unit's); the workgroup's first unit
//   in a slot stores instead of adding;
// - ordered (FlashAttention-3's, bwd/dq_order.h): one workgroup per unit and one dq_acc; the units adding
//   to a q tile take turns in a fixed order, counted by the tile's semaphore; the producer's last warp, the
//   dQ writer, waits for the turn, sends every consumer warp's boxes and counts its turn once they are
//   written, so that the consumers never wait for other workgroups. Masked grids run their K tiles last
//   to first: a unit waits only for units launched before it.
//
// The kernel is its tile (bwd/sm90/tile.h: the workgroup's shape and shared-memory layout), its mainloop
// (bwd/sm90/mainloop.h: a step's copies, dK/dV and dQ of one q tile), its epilogue (bwd/sm90/epilogue.h:
// dK and dV) and, below, the producer's and consumers' walks of a unit; the units come from the schedule
// (bwd/unit_walk.h, bwd/schedule.h).
#pragma once

#include "arch/nvidia/bulk_copy.h"
#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/semaphore.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "arch/nvidia/warpgroup.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/dq_order.h"
#include "bwd/unit_walk.h"
#include "common/kept_range.h"
#include "bwd/sm90/epilogue.h"
#include "bwd/sm90/mainloop.h"
#include "bwd/sm90/tile.h"

namespace fmha {

// The kernel's tensor maps (bwd/backward.hip encodes them): Q and dO as the producer's boxes, dq_acc as
// the consumers' reduction target. Either set may be missing (the kernel then copies, or adds, itself).
struct BackwardMaps {
  CUtensorMap q, d_o, dq;
  bool tiles, dq_boxes;
};

// Whether the unit's Q and dO tiles come as TMA boxes: where the maps exist, and every tile's rows are the
// sequence's or, past its end, past the tensor's (zeros). Units whose last tile reaches into the next
// sequence's rows are copied, with zeros there: those rows' values, if not finite, would reach dK and dV.
// (Per unit, not per tile: see load_unit.)
__device__ inline bool boxed_unit(const fmha_bwd_params& p, const BackwardMaps& maps, const BatchRows& rows,
                                  int rows_per_tile) {
  return maps.tiles && (rows.sq % rows_per_tile == 0 || rows.q_start + rows.sq >= p.seqlen_q);
}

// Deterministic mode: the units of this workgroup's range of the persistent schedule, posted into a ring
// of two entries that every thread reads, one unit ahead, by the first consumer warp: every lane of it
// walks and posts the same unit, so that the branch is warp-uniform (a one-thread branch cost the
// consumers their uniform registers, and they spilled; in the producer's 40 registers the walk spilled).
// The walk's cursor stays in shared memory, so that no thread holds it across a unit; an entry of batch
// -1 ends the walk.
struct PostedUnits {
  ScheduleCursor cursor;
  WorkUnit entry[2];
  uint64_t full[2], empty[2];  // mbarriers: entry posted (the poster's 32 lanes) / read (every thread)
};

template <typename Tile>
__device__ inline PostedUnits* posted_units(const BackwardShared<Tile>& sh) {
  static_assert(sizeof(PostedUnits) <= Tile::kPostedUnitsBytes, "tile.h's kPostedUnitsBytes");
  return static_cast<PostedUnits*>(__cvta_shared_to_generic(sh.posted_units));
}

// Thread 0, before the workgroup's first barrier: the walk at its start, the entries' barriers.
template <typename Tile>
__device__ inline void start_posted_units(const fmha_bwd_params& p, PostedUnits* posted) {
  const int32_t worker = static_cast<int32_t>(arch::block_index_x());
  posted->cursor = p.group_mode ? group_jobs_start(p, worker) : batch_jobs_start(p, worker);
  for (int e = 0; e < 2; ++e) {
    arch::mbarrier_init(arch::shared_address(&posted->full[e]), 32);
    arch::mbarrier_init(arch::shared_address(&posted->empty[e]), Tile::kThreads);
  }
}

// `value`, the same in every lane of the warp, into `to`: lane i stores its word i (32 lanes storing the
// same words would be a race, and one lane's branch cost the consumers registers). Each lane's arrival on an
// mbarrier then releases its word.
template <typename V>
__device__ inline void store_from_lanes(V* to, const V& value) {
  constexpr int kWords = sizeof(V) / 4;
  static_assert(sizeof(V) % 4 == 0 && kWords <= arch::kWarpSize, "a word per lane");
  uint32_t words[kWords];
  memcpy(words, &value, sizeof(V));
  const int lane = static_cast<int>(arch::thread_index()) % arch::kWarpSize;
  uint32_t mine = words[0];
#pragma unroll
  for (int i = 1; i < kWords; ++i) mine = lane == i ? words[i] : mine;
  if (lane < kWords) reinterpret_cast<uint32_t*>(to)[lane] = mine;
}

// The poster's lanes: unit n of the walk into entry n % 2, once every thread has read the entry's last one.
template <typename Tile>
__device__ inline void post_unit(const fmha_bwd_params& p, PostedUnits* posted, int n) {
  const int e = n & 1;
  arch::mbarrier_wait(arch::shared_address(&posted->empty[e]), ((n >> 1) & 1) ^ 1);  // the first lap passes
  const int32_t worker = static_cast<int32_t>(arch::block_index_x());
  ScheduleCursor at = posted->cursor;
  WorkUnit unit;
  const bool more = p.group_mode ? next_group_job(p, worker, Tile::kMasked, at, unit)
                                 : next_batch_job(p, Tile::kMasked, at, unit);
  if (!more) unit.batch = -1;
  store_from_lanes(&posted->cursor, at);
  store_from_lanes(&posted->entry[e], unit);
  arch::mbarrier_arrive(arch::shared_address(&posted->full[e]));
}

// A posted unit, each field as lane 0 read it: values ptxas knows to be warp-uniform, which it keeps in
// uniform registers (read from shared memory, the unit's addresses took the consumers' vector registers,
// and they spilled).
__device__ inline WorkUnit uniform_unit(const WorkUnit& entry) {
  const auto lane0 = [](int32_t x) { return __shfl_sync(0xffffffffu, x, 0); };
  return WorkUnit{lane0(entry.batch), lane0(entry.head), lane0(entry.k_tile), lane0(entry.split),
                  lane0(entry.first_in_slot)};
}

// Calls run(unit) for each unit of this workgroup: with split slots the posted ones (kPosts: the caller's
// warpgroup has the poster), else the grid cell's (unit_walk.h's for_each_unit). `units` counts the units
// run so far: each run counts one.
template <typename Tile, bool kPosts, typename Run>
__device__ inline void for_each_posted_unit(const fmha_bwd_params& p, const BackwardShared<Tile>& sh, const int& units,
                                            Run&& run) {
  if constexpr (!Tile::kSplitSlots) {
    for_each_unit<false>(p, Tile::kMasked, run);
  } else {
    // The poster warp's test, warp-uniform (lane 0's warp index), read where it is used: a flag would stay
    // live across units.
    const auto poster = [] {
      return kPosts && __shfl_sync(0xffffffffu, arch::thread_index() / 32, 0) == Tile::kProducerThreads / 32;
    };
    if (poster()) post_unit<Tile>(p, posted_units(sh), 0);
    for (;;) {
      const int n = units;
      PostedUnits* const posted = posted_units(sh);
      const int e = n & 1;
      arch::mbarrier_wait(arch::shared_address(&posted->full[e]), (n >> 1) & 1);
      const WorkUnit unit = uniform_unit(posted->entry[e]);
      arch::mbarrier_arrive(arch::shared_address(&posted->empty[e]));
      if (unit.batch < 0) return;
      if (poster()) post_unit<Tile>(p, posted, n + 1);
      run(unit);
    }
  }
}

// The producer's unit (`thread` of its 128): K and V once the consumers have released the last unit's,
// then each q tile into the next stage once the consumers have released it (StepLoader's threads: with
// ordered dQ not the dQ writer's warp). `ring` and `units` count the stages and units loaded so far.
template <typename Tile, typename T>
__device__ inline void load_unit(const fmha_bwd_params& p, const BackwardMaps& maps, const WorkUnit& unit,
                                 const BackwardShared<Tile>& sh, int thread, int& ring, int& units) {
  using Loader = typename Tile::Loader;
  using LoaderV = typename Tile::LoaderV;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN;
  const UnitQTiles<M, N, Tile::kMasked, Tile::kRotatedWalks> walk(p, unit);
  if (!walk.has_keys()) {
    // A unit past its batch's keys: no loads, one phase of the K/V barriers all the same (every unit is
    // one, so that `units` counts what the consumers count, and numbers the posted units).
    arch::mbarrier_wait(sh.empty_kv(), (units & 1) ^ 1);
    ++units;
    arch::mbarrier_arrive(sh.full_kv());
    return;
  }
  const BatchRows& rows = walk.rows;
  const int64_t batch = walk.batch, j0 = walk.j0, j1 = walk.j1, steps = walk.steps;
  const int hk = unit.head;
  const TileCopy<Loader, N, typename Tile::KVLayout, Loader::kUnroll> k_copy;
  const T* k = reinterpret_cast<const T*>(p.k) + batch * p.k_batch_stride + hk * p.k_head_stride +
               (rows.k_start + j0) * p.k_row_stride;
  const T* v = reinterpret_cast<const T*>(p.v) + batch * p.v_batch_stride + hk * p.v_head_stride +
               (rows.k_start + j0) * p.v_row_stride;
  arch::mbarrier_wait(sh.empty_kv(), (units & 1) ^ 1);  // the first unit's passes
  ++units;
  // (V's tile has K's layout, fewer columns where V's head dim is smaller)
  const TileCopy<LoaderV, N, typename Tile::KVLayout, LoaderV::kUnroll> v_copy;
  if (Loader::copies(thread)) k_copy.issue(sh.k, k, p.k_row_stride, static_cast<int>(j1 - j0), p.hdim_q);
  if (LoaderV::copies(thread)) v_copy.issue(sh.v, v, p.v_row_stride, static_cast<int>(j1 - j0), p.hdim_v);
  arch::copy_async_arrive(sh.full_kv());
  using StepLoader = typename Tile::StepLoader;
  using StepLoaderV = typename Tile::StepLoaderV;
  // (Compiled only with ordered dQ: the test alone, never true, made ptxas spill in the other kernels.)
  if constexpr (Tile::kOrdered) {
    if (thread >= Tile::kStepThreads) return;  // the dQ writer's warp
  }
  // Each q tile into the next stage once the consumers have released it: `issue` queues its loads, each
  // producer thread arrives when its own have landed. One loop per kind of load (the producer's 40
  // registers hold one, not both).
  const auto each_tile = [&](const auto& issue) {
    QTile tile = walk.tile(0);
    for (int64_t step = 0; step < steps; ++step, ++ring) {
      const int stage = Tile::q_stage(ring);
      arch::mbarrier_wait(sh.empty_q(stage), Tile::q_phase(ring) ^ 1);  // the first lap passes
      issue(stage, tile);
      arch::copy_async_arrive(sh.full_q(stage));
      tile = walk.next(tile);
    }
  };
  if (boxed_unit(p, maps, rows, M)) {
    const int row0 = static_cast<int>(rows.q_start), b = static_cast<int>(batch);
    each_tile([&](int stage, const QTile& tile) {
      // One thread arms the stage with the boxes' bytes (before its own arrival, so the phase cannot
      // complete without them) and loads them; every thread copies its LSE or D row.
      if (thread == 0) {
        const uint32_t full = sh.full_q(stage);
        arch::mbarrier_expect_bytes(full, Tile::kQBytes + Tile::kDoBytes);
        arch::tma_load_rows<T, Tile::kDim>(sh.q(stage), Tile::QLayout::kBlockBytes, maps.q, full, row0 + tile.i0,
                                           tile.h, b);
        arch::tma_load_rows<T, Tile::kDimV>(sh.d_o(stage), Tile::QLayout::kBlockBytes, maps.d_o, full,
                                            row0 + tile.i0, tile.h, b);
      }
      issue_row_stats<Tile>(p, sh, stage, rows, batch, tile, thread);
    });
  } else {
    const TileCopy<StepLoader, M, typename Tile::QLayout, StepLoader::kUnroll> q_copy;
    const TileCopy<StepLoaderV, M, typename Tile::QLayout, StepLoaderV::kUnroll> do_copy;  // (Q's layout)
    each_tile([&](int stage, const QTile& tile) {
      issue_q_tile<Tile, T>(p, sh, stage, q_copy, do_copy, rows, batch, tile, thread);
    });
  }
}

// The consumers' unit (`thread` of their 256): `ring` and `units` count the stages and units consumed
// so far.
template <typename Tile, typename T>
__device__ inline void consume_unit(const fmha_bwd_params& p, const BackwardMaps& maps, const WorkUnit& unit,
                                    const BackwardShared<Tile>& sh, int thread, int& ring, int& units) {
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN;
  const UnitQTiles<M, N, Tile::kMasked, Tile::kRotatedWalks> walk(p, unit);
  const DqAccBlock acc = dq_acc_block(p, unit.batch);
  // The unit's slot: rows of group · hdim_q, a q tile's query head gh at column gh · hdim_q.
  float* const unit_slot = dq_acc_region(p) + acc.index(unit.head, unit.split, 0, 0);
  const int64_t slot_row_elements = acc.row_elements;
  // Split slots: a worker's first unit in a slot writes its rows rather than adding to them
  // (WorkUnit::first_in_slot); in batch mode nothing zeroed the slot, so it zeroes the rows it does not
  // visit (group mode zeroes every slot first).
  const bool store_dq = Tile::kSplitSlots && unit.first_in_slot;
  if (store_dq && !p.group_mode) {
    walk.template zero_unvisited_rows<Tile::kConsumerThreads>(unit_slot, slot_row_elements, thread);
    arch::fence_global_for_async_proxy();  // before the next units' boxes, after a consumers' barrier
  }
  if (!walk.has_keys()) {
    arch::mbarrier_wait(sh.full_kv(), units & 1);
    ++units;
    arch::mbarrier_arrive(sh.empty_kv());
    return;
  }
  const DqMapPlace place = dq_map_place(p, unit_slot, slot_row_elements);
  const BatchRows& rows = walk.rows;
  const int64_t batch = walk.batch, j0 = walk.j0, steps = walk.steps;
  const int lane = thread % arch::kWarpSize, warp = thread / arch::kWarpSize;
  const int g = lane / 4, t = lane % 4;

  UnitState<Tile> st;
  IndexRange kept_rows[2];
  const BackwardOperands operands = start_unit(st, kept_rows, sh, walk, j0, warp, g);
  arch::mbarrier_wait(sh.full_kv(), units & 1);
  ++units;
  QTile tile = walk.tile(0);
  for (int64_t step = 0; step < steps; ++step, ++ring) {
    const int stage = Tile::q_stage(ring), ds_stage = ring & 1;
    arch::mbarrier_wait(sh.full_q(stage), Tile::q_phase(ring));
    // The producer's cp.async copies (Q and dO, unless boxed), before the wgmmas read them. (Skipping the
    // fence for boxed units costs ptxas a spill in the masked D = 128 bf16 consumers.)
    arch::fence_shared_for_async_proxy();
    if constexpr (Tile::kColumnParts == 2) {
      if (walk.edge(tile)) {
        accumulate_dk_dv_halves<Tile, T, true>(st, sh, stage, ds_stage, operands, p.scale_log2, kept_rows, tile.i0,
                                               warp, g, t);
      } else {
        accumulate_dk_dv_halves<Tile, T, false>(st, sh, stage, ds_stage, operands, p.scale_log2, kept_rows, tile.i0,
                                                warp, g, t);
      }
      arch::mbarrier_arrive(sh.empty_q(stage));  // this stage's Q, dO, LSE and D are no longer read
    } else {
      if (walk.edge(tile)) {
        accumulate_dk_dv<Tile, T, true>(st, sh, stage, ds_stage, operands, p.scale_log2, kept_rows, tile.i0, warp, g,
                                        t);
      } else {
        accumulate_dk_dv<Tile, T, false>(st, sh, stage, ds_stage, operands, p.scale_log2, kept_rows, tile.i0, warp,
                                         g, t);
      }
      arch::mbarrier_arrive(sh.empty_q(stage));  // this stage's Q, dO, LSE and D are no longer read
      // Every warp's dSᵀ of this step is in shared memory. The stage of dSᵀ a warpgroup writes next was
      // last read by the other's dQ product two steps back, which it waited for before arriving here.
      arch::named_barrier_sync(kDsComplete, Tile::kConsumerThreads);
    }
    const int head = tile.h - walk.first_head;
    const DqTarget to{unit_slot + head * p.hdim_q,
                      slot_row_elements,
                      rows.sq,
                      p.hdim_q,
                      store_dq,
                      maps.dq_boxes ? &maps.dq : nullptr,
                      head,
                      place.row,
                      place.slot,
                      step == 0,
                      !p.group_mode};
    accumulate_dq<Tile, T>(operands, sh, ds_stage, to, tile.i0, p.scale, warp, lane, ring);
    tile = walk.next(tile);
  }
  arch::mbarrier_arrive(sh.empty_kv());  // the last dQ product has read K
  store_dk_dv<Tile, T>(p, st, batch, unit.head, rows, j0, warp, g, t);
}

// The ordered dQ writer (two lanes of the producer's last warp): for each step of the unit, once
// every consumer warp's boxes are in shared memory, lane ring % 2 waits for the unit's turn at the q tile
// (bwd/dq_order.h), adds the boxes into dq_acc, releases them to the consumers once read, and counts the
// turn once they are written, while the other lane takes the next step: a lane waits only for its own bulk
// groups, so one step's writes complete under the next one's turn. `ring` counts the steps so far (the
// consumers' count too).
template <typename Tile>
__device__ inline void write_dq_in_turn(const fmha_bwd_params& p, const BackwardMaps& maps, const WorkUnit& unit,
                                        const BackwardShared<Tile>& sh, int lane, int& ring) {
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN;
  const UnitQTiles<M, N, Tile::kMasked, Tile::kRotatedWalks> walk(p, unit);
  if (!walk.has_keys()) return;
  const DqAccBlock acc = dq_acc_block(p, unit.batch);
  const DqMapPlace place = dq_map_place(p, dq_acc_region(p) + acc.index(unit.head, 0, 0, 0), acc.row_elements);
  int32_t* const semaphores = reinterpret_cast<int32_t*>(dq_acc_region(p) + p.dq_acc_elements);
  QTile tile = walk.tile(0);
  for (int64_t step = 0; step < walk.steps; ++step, ++ring) {
    if (lane == (ring & 1)) {
      const int q_tile = tile.i0 / M;
      int32_t* const semaphore = semaphores + dq_semaphore(p, unit.batch, walk.rows.q_start, tile.h, q_tile);
      const int64_t turn = walk.rotated ? rotated_write_turn(walk.k_tiles(), unit.k_tile, walk.step_of(tile))
                                        : dq_write_turn(Tile::kMasked, walk.mask.off, walk.mask.right, walk.rows.sq,
                                                        walk.rows.sk, M, N, unit.k_tile, q_tile);
      // The turn first: the boxes go as soon as they are written.
      arch::semaphore_wait_equal(semaphore, static_cast<int32_t>(turn));
      arch::fence_global_for_async_proxy();  // the earlier turns' sums, before this turn's adds read them
      arch::mbarrier_wait(sh.dq_full(ring), (static_cast<uint32_t>(ring) >> 1) & 1);
      // (Adds only: no stores, no waits of the consumers' sends.)
      const DqTarget to{nullptr, 0, walk.rows.sq, p.hdim_q, false, &maps.dq, tile.h - walk.first_head, place.row,
                        place.slot, false, false};
#pragma unroll 1
      for (int warp = 0; warp < Tile::kWarps; ++warp) {
        send_dq_boxes<Tile>(sh.dq_rows(warp), warp / 4, tile.i0 + (warp % 4) * Tile::kDqBoxRows, to);
      }
      arch::bulk_commit();
      arch::bulk_wait_read();
      arch::mbarrier_arrive(sh.dq_empty());
      arch::bulk_wait_written();
      arch::fence_global_for_async_proxy();
      arch::semaphore_release_add(semaphore, 1);
    }
    tile = walk.next(tile);
  }
}

template <typename Tile, typename T>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    dq_dk_dv_kernel(fmha_bwd_params p, const __grid_constant__ BackwardMaps maps) {
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  if (!workspace_prepared(p)) return;
  const BackwardShared<Tile> sh(shared_bytes);
  const int thread = static_cast<int>(arch::thread_index());
  if (thread == 0) {
    // Full barriers complete on every producer thread's arrival, empty ones on every consumer thread's.
    arch::mbarrier_init(sh.full_kv(), Tile::kProducerThreads);
    arch::mbarrier_init(sh.empty_kv(), Tile::kConsumerThreads);
    for (int s = 0; s < Tile::kQStages; ++s) {
      arch::mbarrier_init(sh.full_q(s), Tile::kStepThreads);
      arch::mbarrier_init(sh.empty_q(s), Tile::kConsumerThreads);
    }
    if constexpr (Tile::kSplitSlots) start_posted_units<Tile>(p, posted_units(sh));
    if constexpr (Tile::kOrdered) {
      arch::mbarrier_init(sh.dq_full(0), Tile::kWarps);
      arch::mbarrier_init(sh.dq_full(1), Tile::kWarps);
      arch::mbarrier_init(sh.dq_empty(), 1);
    }
    arch::mbarrier_init_fence();
  }
  arch::block_barrier();
  int ring = 0, units = 0;
  if (arch::warpgroup_index() == 0) {
    arch::release_registers<Tile::kProducerRegisters>();
    for_each_posted_unit<Tile, false>(
        p, sh, units, [&](const WorkUnit& unit) { load_unit<Tile, T>(p, maps, unit, sh, thread, ring, units); });
    arch::copy_async_wait<0>();  // (no thread leaves copies in flight)
    const int lane = thread % arch::kWarpSize;
    if (Tile::kOrdered && thread >= Tile::kStepThreads && lane < 2) {
      ring = 0;
      for_each_unit<false>(p, Tile::kMasked,
                           [&](const WorkUnit& unit) { write_dq_in_turn<Tile>(p, maps, unit, sh, lane, ring); });
    }
    return;
  }
  arch::claim_registers<Tile::kConsumerRegisters>();
  for_each_posted_unit<Tile, true>(p, sh, units, [&](const WorkUnit& unit) {
    consume_unit<Tile, T>(p, maps, unit, sh, thread - Tile::kProducerThreads, ring, units);
  });
  arch::bulk_wait_written();  // (no dQ reduction reads shared memory after the workgroup exits)
}

}  // namespace fmha

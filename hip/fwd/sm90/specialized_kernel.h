// The warp-specialized attention forward on Hopper (sm_90a): FlashAttention-3's structure.
//
// A CTA computes kBlockM = 64 · kConsumers query rows of one (batch, query head) — with packed GQA (the kv
// cache's decode), 128 (query row, query head) pairs of one kv head — with a producer warpgroup and two
// or three consumer warpgroups:
// - the producer (one warp of warpgroup 0, few registers) loads Q once and the K and V tiles through
//   two rings of kStages stages with TMA (arch/nvidia/tensor_map.h), each stage handed over by
//   mbarriers: it waits for a stage's `empty` barrier and arms its `full` barrier with the tile's
//   bytes. A V tile that reaches past the sequence into rows of the tensor (another sequence's, or
//   padding, whose values P·V must not see) is copied with cp.async instead, with zeros past the end;
//   past the tensor's last row TMA itself brings zeros. With Tile::kGather (a paged pool of small
//   pages) the whole warpgroup gathers K and V with cp.async instead, each thread's copies arriving on
//   the stage's full barrier as they land (the thread goes on to the next stage meanwhile). With 8-bit
//   inputs (Tile::kTransposeV) V lands in a staging tile and the whole warpgroup transposes it into the
//   stage's Vᵀ tile, a tile behind the loads (fwd/sm90/transpose_v.h), arriving on the stage's V full
//   barrier;
// - the consumers (warpgroups 1 and up, 64 rows each, the registers the producer gave up) run the
//   mainloop with intra-warpgroup overlap: S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued together,
//   the softmax of S_j runs while the tensor cores finish P_{j-1}·V_{j-1}, and each stage is released
//   as soon as the product reading it has retired. V lags K by one tile.
// - ping-pong: the consumers take turns issuing their products (a named barrier each, in a ring), so
//   one's softmax runs under the others' GEMMs. A consumer with no rows in a tile takes its turns without
//   products.
// No CTA-wide barrier after the setup. The epilogue is the forward's (fwd/sm90/epilogue.h).
#pragma once

#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/nvidia/warpgroup.h"
#include "arch/thread.h"
#include "common/descale.h"
#include "common/sequence.h"
#include "fwd/sm90/epilogue.h"
#include "fwd/sm90/key_range.h"
#include "fwd/sm90/mainloop.h"
#include "fwd/sm90/specialized_work.h"
#include "fwd/sm90/tile_queue.h"
#include "fwd/sm90/transpose_v.h"
#include "launch.h"

namespace fmha {

// The shared-memory layout of a SpecializedTile from its 1024-aligned base: tiles, then barriers.
template <typename Tile>
struct SpecializedShared {
  uint32_t q, k, v, vt, barriers;
  __device__ explicit SpecializedShared(uint32_t base)
      : q(base), k(base + Tile::kQBytes), v(k + Tile::kStages * Tile::kKBytes), vt(v + Tile::kStages * Tile::kVBytes),
        barriers(vt + Tile::kStages * Tile::kVtBytes) {}
  __device__ uint32_t k_stage(int s) const { return k + s * Tile::kKBytes; }
  __device__ uint32_t v_stage(int s) const { return v + s * Tile::kVBytes; }  // 8-bit inputs: V staged
  __device__ uint32_t vt_stage(int s) const { return vt + s * Tile::kVtBytes; }
  __device__ uint32_t full_q() const { return barriers; }
  __device__ uint32_t empty_q() const { return barriers + 8 * (1 + 4 * Tile::kStages); }
  __device__ uint32_t full_k(int s) const { return barriers + 8 * (1 + s); }
  __device__ uint32_t empty_k(int s) const { return barriers + 8 * (1 + Tile::kStages + s); }
  __device__ uint32_t full_v(int s) const { return barriers + 8 * (1 + 2 * Tile::kStages + s); }
  __device__ uint32_t empty_v(int s) const { return barriers + 8 * (1 + 3 * Tile::kStages + s); }
  __device__ uint32_t staged_v(int s) const { return barriers + 8 * (2 + 4 * Tile::kStages + s); }
  __device__ uint32_t scratch(int consumer_thread) const { return barriers + 8 * Tile::kBarriers + 4 * consumer_thread; }
  __device__ uint32_t queue() const { return barriers + 8 * Tile::kBarriers + Tile::kScratchBytes; }
};

// Named barriers of the ping-pong: consumer c syncs on kPingPong + c before issuing its products and
// arrives on the next one's (c + 1, the last's on consumer 0's) after.
constexpr uint32_t kPingPong = 1;
constexpr uint32_t kMaxConsumers = 3;
// Named barriers that keep consumer c's softmax ahead of its wait for the previous P·V: kSoftmaxDone + c,
// arrived at once per step by each of its warps (arch::complete_before); a warp's next arrival follows
// its wait for the next S product, which every warp of the warpgroup issues after its own arrival.
constexpr uint32_t kSoftmaxDone = kPingPong + kMaxConsumers;
// The named barrier of the producer warpgroup after a V transpose: the staging tile may be reloaded.
// (The tile queue's, which the same threads sync on at other points of their loop.)
constexpr uint32_t kTransposed = TileQueue::kProducerSync;
static_assert(kSoftmaxDone + kMaxConsumers <= kTransposed, "the producer's barrier is none of the consumers'");

template <typename Tile, typename T, typename Params>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    specialized_forward_kernel(const __grid_constant__ Params p, const __grid_constant__ ForwardMaps maps,
                               const __grid_constant__ typename SpecializedSource<Params, Tile, T>::Walk walk) {
  constexpr int N = Tile::kBlockN, S = Tile::kStages, DQK = Tile::kDimQK;
  constexpr int kNTiles = N / 8, kSteps = N * Tile::kElementBytes / arch::kStepBytes;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const SpecializedShared<Tile> smem(swizzle128_base(shared_bytes));
  // The grid's tiles (the source's work of each, computed alike by the producer and the consumers from the
  // launch's `walk`), taken in the order fwd/sm90/tile_queue.h describes: with the source's tile counter,
  // dynamically.
  using Source = SpecializedSource<Params, Tile, T>;
  const int64_t tiles = Source::tiles(p);
  const int64_t ctas = arch::grid_blocks_x(), cta = arch::block_index_x();
  const TileQueue queue(smem.queue(), Source::tile_counter(p), cta, ctas);

  const int thread = static_cast<int>(arch::thread_index());
  if (thread == 0) {
    // A full barrier completes on its bytes and one arrival per loading producer thread (Q: the first
    // warp; lane 0's arms it); an empty one on an arrival per consumer warpgroup.
    arch::mbarrier_init(smem.full_q(), Tile::kQueryLoaders);
    arch::mbarrier_init(smem.empty_q(), Tile::kConsumers);
    for (int s = 0; s < S; ++s) {
      arch::mbarrier_init(smem.full_k(s), Tile::Producer::kThreads);
      arch::mbarrier_init(smem.full_v(s), Tile::Producer::kThreads);
      arch::mbarrier_init(smem.empty_k(s), Tile::kConsumers);
      arch::mbarrier_init(smem.empty_v(s), Tile::kConsumers);
      if constexpr (Tile::kTransposeV) arch::mbarrier_init(smem.staged_v(s), Tile::Producer::kThreads);
    }
    queue.init(Tile::kConsumers * 4);
    arch::mbarrier_init_fence();
  }
  arch::block_barrier();

  const int warpgroup = arch::warpgroup_index();
  if (warpgroup == 0) {  // the producer
    arch::release_registers<Tile::kProducerRegisters>();
    if (thread >= Tile::Producer::kThreads) return;
    const int lane = thread;
    int ring = 0, queries = 0;  // K/V stages and Q tiles used so far
    // 8-bit inputs: the V tile of ring step r, once staged, into its stage's Vᵀ tile once the consumers
    // have released that (parities as the loads'); the barrier after it frees the staging tile.
    const auto transpose = [&](int r) {
      if constexpr (Tile::kTransposeV) {
        const int s = r % S;
        const uint32_t parity = (r / S) & 1;
        arch::mbarrier_wait(smem.staged_v(s), parity);
        arch::mbarrier_wait(smem.empty_v(s), parity ^ 1);
        transpose_values<Tile::Producer::kThreads, N>(smem.v_stage(s), smem.vt_stage(s));
        arch::fence_shared_for_async_proxy();
        arch::mbarrier_arrive(smem.full_v(s));
        arch::named_barrier_sync(kTransposed, Tile::Producer::kThreads);
      }
    };
    int64_t tile = queue.first();
    for (int lap = 0;; ++lap) {
      tile = queue.publish<Tile::Producer::kThreads>(lap, thread, tile);
      if (tile >= tiles) break;
      const auto w = Source::work(p, walk, tile);
      // (taken once the tile's loads are issued: a counter's answer arrives under them)
      const auto take_next = [&] {
        if (thread == 0) tile = queue.next(tile);
      };
      if (w.steps == 0) {
        take_next();
        continue;
      }
      if (thread < Tile::kQueryLoaders) {
        arch::mbarrier_wait(smem.empty_q(), (queries & 1) ^ 1);  // the first tile's passes
        ++queries;
        Source::load_query(p, maps.q, smem.q, smem.full_q(), w, lane);
      }
      int64_t page = Source::page_of(p, w, static_cast<int64_t>(w.first) * N, lane);
      const bool zeros_past = Source::zeros_past_sequence(p, w);
      for (int i = 0; i < w.steps; ++i, ++ring) {
        const int s = ring % S;
        const uint32_t parity = ((ring / S) & 1) ^ 1;  // the first lap passes
        const int64_t j0 = static_cast<int64_t>(w.first + i) * N;
        const int64_t next_page = i + 1 < w.steps ? Source::page_of(p, w, j0 + N, lane) : 0;
        arch::mbarrier_wait(smem.empty_k(s), parity);
        Source::template load<DQK, Tile::kKBytes, false>(p, maps.k, smem.k_stage(s), smem.full_k(s), w, j0, lane,
                                                         page);
        // (8-bit inputs: the staging tile, free since its last transpose; the Vᵀ tile waits there)
        if constexpr (!Tile::kTransposeV) arch::mbarrier_wait(smem.empty_v(s), parity);
        const uint32_t v_full = Tile::kTransposeV ? smem.staged_v(s) : smem.full_v(s);
        if (j0 + N <= w.rows.sk || zeros_past) {
          Source::template load<Tile::kDim, Tile::kVBytes, true>(p, maps.v, smem.v_stage(s), v_full, w, j0, lane,
                                                                 page);
        } else {  // the sequence's last tile
          Source::copy_values(p, smem.v_stage(s), w, j0);
          arch::copy_async_commit();
          arch::copy_async_wait<0>();
          arch::fence_shared_for_async_proxy();
          arch::mbarrier_arrive(v_full);
        }
        if constexpr (Tile::kTransposeV) {
          if (i > 0) transpose(ring - 1);
        }
        page = next_page;
      }
      take_next();
      if constexpr (Tile::kTransposeV) transpose(ring - 1);
    }
    if constexpr (Tile::kGather) arch::copy_async_wait<0>();  // (no thread leaves copies in flight)
    return;
  }

  // A consumer: warpgroup c of the consumers, rows c · 64 .. of each tile.
  arch::claim_registers<Tile::kConsumerRegisters>();
  const int c = warpgroup - 1;
  const int lane = thread % arch::kWarpSize, warp = (thread / arch::kWarpSize) % 4;
  const int g = lane / 4, t = lane % 4;
  const bool leader = thread % 128 == 0;  // releases the warpgroup's stages
  const uint64_t q_rows = arch::k_major_descriptor(smem.q + c * 64 * 128);
  const uint64_t k_tile = arch::k_major_descriptor(smem.k);
  // O += P·V of ring stage s: V read N-major, or for 8-bit inputs its Vᵀ tile K-major.
  const uint64_t v_tile = Tile::kTransposeV ? arch::k_major_descriptor(smem.vt)
                                            : arch::mn_major_descriptor(smem.v, Tile::VLayout::kBlockBytes);
  const auto add_products = [&](float(&o)[Tile::kDim / 8][4], const uint32_t(&a)[kSteps][4], int s) {
    if constexpr (Tile::kTransposeV) {
      arch::mma_registers_by_rows<T, kSteps, Tile::VtLayout::kBlockBytes>(
          o, a, arch::descriptor_plus(v_tile, s * Tile::kVtBytes));
    } else {
      arch::mma_registers_by_columns<T>(o, a, arch::descriptor_plus(v_tile, s * Tile::kVBytes));
    }
  };
  // Ping-pong: consumer 0 issues first, then 1, …; every sync has one arrival to match, the last one
  // consumed by consumer 0 at the end.
  // (With two consumers the next is c ^ 1, as before three existed: (c + 1) % 2 compiles to other
  // instructions around it.)
  const auto turn_begin = [&] { arch::named_barrier_sync(kPingPong + c, 2 * 128); };
  const auto turn_end = [&] {
    arch::named_barrier_arrive(kPingPong + (Tile::kConsumers == 2 ? c ^ 1 : (c + 1) % Tile::kConsumers), 2 * 128);
  };
  if (c == 0) arch::named_barrier_arrive(kPingPong, 2 * 128);

  int ring = 0, queries = 0;
  for (int lap = 0;; ++lap) {
    const int64_t tile = queue.take(lap, thread % arch::kWarpSize);
    if (tile >= tiles) break;
    const auto w = Source::work(p, walk, tile);
    if (!w.live) continue;
    RowState<Tile> st;
    st.clear();
    const int64_t row_of[2] = {w.i0 + c * 64 + warp * 16 + g, w.i0 + c * 64 + warp * 16 + g + 8};  // tile rows
    const int64_t query_of[2] = {w.query_of(row_of[0]), w.query_of(row_of[1])};                // their query rows
    const TileScales descales = uniform_descales<T>(p, w.b, w.hk);
    const float scale_log2 = p.scale_log2 * descales.k;

    // Ring stage and phase of the tile's step i.
    const auto stage = [&](int i) { return (ring + i) % S; };
    const auto phase = [&](int i) { return static_cast<uint32_t>(((ring + i) / S) & 1); };
    // Step i's K and V tiles, once loaded. Gathered ones were written by the producer's cp.async, in the
    // generic proxy: the tensor cores (the async proxy) read them after this thread's proxy fence. A
    // producer thread copies K_i after V_{i-1}, and its arrival on K_i's barrier waits for all its earlier
    // copies: once K_i is complete, so is V_{i-1}, and K_i's fence serves both (`fenced` false).
    const auto wait_keys = [&](int i) {
      arch::mbarrier_wait(smem.full_k(stage(i)), phase(i));
      if constexpr (Tile::kGather) arch::fence_shared_for_async_proxy();
    };
    const auto wait_values = [&](int i, bool fenced) {
      arch::mbarrier_wait(smem.full_v(stage(i)), phase(i));
      if constexpr (Tile::kGather && !Tile::kTransposeV) {
        if (fenced) arch::fence_shared_for_async_proxy();
      }
    };

    // A consumer whose rows all lie past the tile's (a decode tile of at most 64 (query row, query head)
    // pairs, a sequence's last q block) computes nothing: it keeps the pipeline's and the ping-pong's
    // protocol, so that the other consumer runs its products back to back.
    if (w.steps > 0 && w.i0 + c * 64 >= w.tile_rows()) {
      arch::mbarrier_wait(smem.full_q(), queries & 1);
      ++queries;
      for (int i = 0; i < w.steps; ++i) {
        arch::mbarrier_wait(smem.full_k(stage(i)), phase(i));
        turn_begin();
        turn_end();
        arch::mbarrier_wait(smem.full_v(stage(i)), phase(i));
        if (leader) {
          arch::mbarrier_arrive(smem.empty_k(stage(i)));
          arch::mbarrier_arrive(smem.empty_v(stage(i)));
          if (i == w.steps - 1) arch::mbarrier_arrive(smem.empty_q());
        }
      }
      ring += w.steps;
      continue;
    }
    if (w.steps > 0) {
      const int steps = w.steps;
      const KeptKeys kept = KeptKeys::of<Tile::kMasked>(w.keys.mask, query_of, w.rows.sk);
      float s[kNTiles][4];
      uint32_t p_frag[kSteps][4];
      // The scores of step i in `s` (retired), masked where the tile needs it, through the softmax;
      // returns the factor O takes before P_i·V_i is added to it.
      const auto softmax_step = [&](int i) {
        const int64_t j0 = static_cast<int64_t>(w.first + i) * N;
        if (w.keys.edge<N, Tile::kMasked>(j0, w.rows.sk)) mask_scores<Tile>(s, kept, j0, t);
        return online_softmax(st, s, scale_log2, 1.f, 1.f);
      };
      const auto to_fragments = [&] {
#pragma unroll
        for (int kk = 0; kk < kSteps; ++kk) arch::a_fragment<T>(p_frag[kk], s, kk);
      };

      arch::mbarrier_wait(smem.full_q(), queries & 1);
      ++queries;
      wait_keys(0);
      turn_begin();
      arch::warpgroup_fence();
      arch::mma_rows_by_rows<T, DQK, Tile::QLayout::kBlockBytes, Tile::KLayout::kBlockBytes>(
          s, q_rows, arch::descriptor_plus(k_tile, stage(0) * Tile::kKBytes));
      arch::warpgroup_commit();
      turn_end();
      arch::warpgroup_wait<0>();
      arch::hold_registers(s);
      if (leader) {
        arch::mbarrier_arrive(smem.empty_k(stage(0)));
        if (steps == 1) arch::mbarrier_arrive(smem.empty_q());
      }
      // O's factor before P_{i-1}·V_{i-1} is added (FA3's order: applied under the next S product).
      float2 correction = softmax_step(0);  // O is 0: its factor is irrelevant
      to_fragments();

      // Step i: S_i and P_{i-1}·V_{i-1} are issued together, then the softmax of S_i runs under
      // P_{i-1}·V_{i-1}.
      for (int i = 1; i < steps; ++i) {
        wait_keys(i);
        turn_begin();
        arch::warpgroup_fence();
        arch::mma_rows_by_rows<T, DQK, Tile::QLayout::kBlockBytes, Tile::KLayout::kBlockBytes>(
            s, q_rows, arch::descriptor_plus(k_tile, stage(i) * Tile::kKBytes));
        arch::warpgroup_commit();
        rescale_output(st, correction);
        wait_values(i - 1, false);  // (after wait_keys(i))
        arch::warpgroup_fence();
        add_products(st.o, p_frag, stage(i - 1));
        arch::warpgroup_commit();
        turn_end();
        arch::warpgroup_wait<1>();  // S_i (issued first) has retired; P_{i-1}·V_{i-1} may still run
        arch::hold_registers(s);
        if (leader) {
          arch::mbarrier_arrive(smem.empty_k(stage(i)));
          if (i == steps - 1) arch::mbarrier_arrive(smem.empty_q());  // the tile's last read of Q
        }
        correction = softmax_step(i);
        arch::complete_before(st.row_sum[0] + st.row_sum[1], smem.scratch(thread - 128), kSoftmaxDone + c, 128);
        arch::warpgroup_wait<0>();  // P_{i-1}·V_{i-1} has retired: its fragments may be rewritten
        arch::hold_registers(st.o);
        arch::hold_registers(p_frag);
        if (leader) arch::mbarrier_arrive(smem.empty_v(stage(i - 1)));
        to_fragments();
      }

      rescale_output(st, correction);
      wait_values(steps - 1, true);
      arch::warpgroup_fence();
      add_products(st.o, p_frag, stage(steps - 1));
      arch::warpgroup_commit();
      arch::warpgroup_wait<0>();
      arch::hold_registers(st.o);
      arch::hold_registers(p_frag);
      if (leader) arch::mbarrier_arrive(smem.empty_v(stage(steps - 1)));
      ring += steps;
    }

    store_output<Tile>(p, st, scale_log2, descales.v, row_of, query_of, w.tile_rows(),
                       [&](int64_t r) { return w.head_of(r); }, w.rows, w.b, w.batch, t, w.partial, w.split,
                       w.seq_q_start);
  }
  if (c == 0) arch::named_barrier_sync(kPingPong, 2 * 128);
}

}  // namespace fmha

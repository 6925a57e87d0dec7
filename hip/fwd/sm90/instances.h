// The forward kernel's instances on Hopper and their launch, for either parameter block (the dense
// forward's fmha_fwd_params, the kv-cache's fmha_kvcache_params): the element type, the head-dim
// bucket (which fixes the tile shapes) and masked or not are compiled per instance.
#pragma once

#include <atomic>
#include <type_traits>

#include "fwd/sm90/kernel.h"
#include "fwd/sm90/specialized_dense.h"
#include "fwd/sm90/specialized_kernel.h"
#include "fwd/sm90/specialized_tile.h"
#include "fwd/sm90/tile.h"

namespace fmha {

// `launch(std::true_type{})` for a call with a mask, `launch(std::false_type{})` without: masked and
// unmasked tiles are compiled apart.
template <typename Params, typename Launch>
int32_t with_mask(const Params& p, const Launch& launch) {
  return p.masked ? launch(std::true_type{}) : launch(std::false_type{});
}

template <typename T, int kHeadDim, int kWarpgroups, int kBlockN, bool kMasked, bool kPageScales,
          bool kPackGqa = false, typename Params>
int32_t launch_forward(const Params& p, hipStream_t stream) {
  using Tile = ForwardTile<T, kHeadDim, kWarpgroups, kBlockN, kMasked, kPageScales, kPackGqa>;
  auto kernel = forward_kernel<Tile, T, Params>;
  // Over 48 KiB of dynamic shared memory must be opted into, once per kernel.
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes);
  if (configured != cudaSuccess) return static_cast<int32_t>(configured);
  // x: q tiles (kv cache: times the launcher's splits, kvcache/split.h), y: query heads (packed GQA: kv
  // heads, each tile row one of their query heads), z: batches.
  const int splits = kvcache::grid_splits(p);
  const int group = kPackGqa ? p.nhead_q / p.nhead_k : 1;
  const int64_t rows = static_cast<int64_t>(p.max_seqlen_q) * group;
  const dim3 grid(static_cast<uint32_t>((rows + Tile::kBlockM - 1) / Tile::kBlockM * splits),
                  kPackGqa ? p.nhead_k : p.nhead_q, p.batch);
  kernel<<<grid, Tile::kThreads, Tile::kSharedBytes, stream>>>(p);
  return static_cast<int32_t>(cudaGetLastError());
}

// The current device's SM count (the persistent grid's size), looked up once per device.
inline int multiprocessor_count() {
  static std::atomic<int> counts[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 1;
  int n = counts[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n < 1) n = 1;
    counts[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

// The parameters of a call (either block) whose grid takes its tiles from `p.tile_counter` (`counted`),
// with the counter zeroed on `stream` first, or else without it; a CUDA error where the zeroing fails.
template <typename Params>
int32_t with_tile_counter(const Params& p, bool counted, hipStream_t stream, Params* params) {
  *params = p;
  if (!counted) {
    params->tile_counter = 0;
    return 0;
  }
  return static_cast<int32_t>(cudaMemsetAsync(reinterpret_cast<void*>(p.tile_counter), 0, sizeof(int32_t), stream));
}

// The warp-specialized kernel's query map (q in either parameter block: rows of a sequence, or of all
// sequences in group mode) and its launch of `ctas` CTAs, the tile's shared memory opted into once.
template <typename Tile, typename Params>
bool encode_query_map(const Params& p, CUtensorMap* map) {
  return arch::encode_rows_map(map, reinterpret_cast<const void*>(p.q), Tile::kElementBytes, p.hdim_q, p.seqlen_q,
                               p.nhead_q, p.group_mode ? 1 : p.batch, p.q_row_stride, p.q_head_stride,
                               p.q_batch_stride, Tile::kBlockM);
}
template <typename Tile, typename T, typename Params>
int32_t launch_specialized_kernel(const Params& p, const ForwardMaps& maps,
                                  const typename SpecializedSource<Params, Tile, T>::Walk& walk, int64_t ctas,
                                  hipStream_t stream) {
  auto kernel = specialized_forward_kernel<Tile, T, Params>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes);
  if (configured != cudaSuccess) return static_cast<int32_t>(configured);
  kernel<<<static_cast<uint32_t>(ctas), Tile::kThreads, Tile::kSharedBytes, stream>>>(p, maps, walk);
  return static_cast<int32_t>(cudaGetLastError());
}

// The warp-specialized kernel's fp8 tile (D = 128, 128 keys), the dense forward's and the kv cache's:
// three stages of K, V staged and Vᵀ (160 KiB; four measured no faster, docs/perf.md); the producer
// warpgroup, which transposes V, keeps 72 registers (16 words of V and 16 of Vᵀ per thread, and the tile
// queue's state without spills), the consumers 216.
template <typename T, bool kMasked>
using Fp8SpecializedTile = SpecializedTile<T, 128, 128, 3, kMasked, 72>;

// The dense forward's tiles of the warp-specialized kernel (fwd/sm90/specialized_kernel.h), 128 query
// rows each (kConsumers = 2), per head-dim bucket:
//   64, 128: 128 keys, three stages of K and V (224 KiB at D = 128; 121 KiB at D = 64, whose unmasked tile
//     may take three consumers, 192 query rows: dense_consumers);
//   192 (Q/K) with 128 (V): 128 keys, two stages (208 KiB);
//   256: 80 keys, two stages (224 KiB; O takes 128 of a consumer's 240 registers, S 40);
//   fp8 (128 only): Fp8SpecializedTile.
template <typename T, int kBucket, bool kMasked, int kConsumers = 2>
using DenseSpecializedTile = std::conditional_t<
    sizeof(T) == 1, Fp8SpecializedTile<T, kMasked>,
    std::conditional_t<kBucket == 256, SpecializedTile<T, 256, 80, 2, kMasked>,
                       std::conditional_t<kBucket == 192, SpecializedTile<T, 192, 128, 2, kMasked, 24, 128>,
                                          SpecializedTile<T, kBucket, 128, 3, kMasked, 24, kBucket, false,
                                                          kConsumers>>>>;

// The consumer warpgroups of the dense forward's D = 64 tile for `p`: three (FlashAttention-3's 192-row
// tile: two warpgroups' softmax runs under the third's products, 1.08-1.13x two at S >= 2k on an H200)
// for an unmasked call whose q rows padded to 192-row tiles are at most 1/8 more than padded to 128-row
// ones (at S = 256, 384 rows for 256 measured 0.80x); masked, two: at the 160 registers of three
// consumers the mask's code spills in every step, and 192-row tiles cost short causal rows more on the
// diagonal (docs/perf.md, 2026-11-28 11:33-12:22 UTC).
inline int dense_consumers(const fmha_fwd_params& p) {
  const int64_t rows = p.max_seqlen_q;
  const int64_t rows_192 = (rows + 191) / 192 * 192, rows_128 = (rows + 127) / 128 * 128;
  return !p.masked && rows_192 * 8 <= rows_128 * 9 ? 3 : 2;
}

// The dense forward's warp-specialized instances. Tensors TMA cannot describe (fmha_fwd_params allows
// strides TMA does not: zero, e.g. a batch-broadcast K) take `fallback`, the cp.async kernel.
template <typename T, int kBucket, bool kMasked, int kConsumers, typename Fallback>
int32_t launch_specialized(const fmha_fwd_params& p, hipStream_t stream, const Fallback& fallback) {
  using Tile = DenseSpecializedTile<T, kBucket, kMasked, kConsumers>;
  ForwardMaps maps;
  const int64_t batches = p.group_mode ? 1 : p.batch;
  const bool described =
      encode_query_map<Tile>(p, &maps.q) &&
      arch::encode_rows_map(&maps.k, reinterpret_cast<const void*>(p.k), Tile::kElementBytes, p.hdim_q, p.seqlen_k,
                            p.nhead_k, batches, p.k_row_stride, p.k_head_stride, p.k_batch_stride, Tile::kBlockN) &&
      arch::encode_rows_map(&maps.v, reinterpret_cast<const void*>(p.v), Tile::kElementBytes, p.hdim_v, p.seqlen_k,
                            p.nhead_k, batches, p.v_row_stride, p.v_head_stride, p.v_batch_stride, Tile::kBlockN);
  if (!described) return fallback();
  // The grid and its walk: fwd/sm90/tile_walk.h.
  const DenseGrid grid = dense_grid(p, Tile::kBlockM, sizeof(T), multiprocessor_count());
  fmha_fwd_params params;
  if (const int32_t zeroed = with_tile_counter(p, grid.counted, stream, &params)) return zeroed;
  return launch_specialized_kernel<Tile, T>(params, maps, grid.walk, grid.ctas, stream);
}

// The kv cache's forward of head-dim bucket kBucket (no per-page descales), prefill or packed decode, at
// D = 128, and for 16-bit types at D = 64 and 256: the warp-specialized kernel over the paged pool
// (kvcache/sm90/specialized_paged.h), two consumer warpgroups of 64 q rows, 128 keys (D = 256: 64 keys,
// two stages, 192 KiB). Its producer loads K and V as TMA boxes where pages hold whole key tiles or, for
// the prefill, where a page is a piece of one (a box per page), and gathers them with cp.async from
// other pages. `fallback` (the cp.async kernel) takes tensors TMA cannot describe and packed tiles whose
// rows TMA cannot box (the GQA group must divide them). Same splits as the cp.async kernel's. The
// gathering producer keeps its loop in registers (88: a spill's reload would wait behind its copies in
// flight), the consumers take the rest; at D = 256 72, the fewest it runs without spills, so that the
// consumers, which hold O's 256 columns, get 216.
template <typename T, int kBucket, bool kMasked, typename Fallback>
int32_t launch_specialized(const fmha_kvcache_params& p, hipStream_t stream, const Fallback& fallback) {
  static_assert(kBucket == 128 || ((kBucket == 64 || kBucket == 256) && sizeof(T) == 2),
                "16-bit D = 64, 128 or 256, fp8 D = 128");
  constexpr int kKeys = kBucket == 256 ? 64 : 128, kStages = kBucket == 256 ? 2 : 3;
  using BoxedTile = std::conditional_t<sizeof(T) == 1, Fp8SpecializedTile<T, kMasked>,
                                       SpecializedTile<T, kBucket, kKeys, kStages, kMasked, 40>>;
  constexpr int kGatherRegisters = kBucket == 256 ? 72 : 88;
  using GatheredTile = SpecializedTile<T, kBucket, kKeys, kStages, kMasked, kGatherRegisters, kBucket, true>;
  constexpr int M = BoxedTile::kBlockM, N = BoxedTile::kBlockN;
  using Source = SpecializedSource<fmha_kvcache_params, GatheredTile, T>;
  const int64_t page = p.page_size;
  const int group = kvcache::packed_heads(p);
  // Prefill pages of 32 and 64 keys are loaded as TMA boxes too, a box per page: the gathering producer's
  // instructions and registers cost the prefill's consumers more than those boxes' issue does; pages of 8
  // and 16 measured slower as boxes than gathered (docs/perf.md). Decode gathers them: boxes of a few rows
  // do not stream at the memory's rate.
  const bool pieces = p.pack_gqa == 0 && page >= 32 && page < N && N % page == 0;
  const bool boxed = page > 0 && (page % N == 0 || pieces);
  if (page <= 0 || group < 1 || M % group != 0) return fallback();
  const uint32_t box = pieces ? static_cast<uint32_t>(page) : N;  // rows per K/V box
  const int64_t batches = p.group_mode ? 1 : p.batch;
  ForwardMaps maps{};
  const bool query_described =
      p.pack_gqa != 0
          ? arch::encode_packed_rows_map(&maps.q, reinterpret_cast<const void*>(p.q), BoxedTile::kElementBytes,
                                         p.hdim_q, p.seqlen_q, p.nhead_q, batches, p.q_row_stride, p.q_head_stride,
                                         p.q_batch_stride, static_cast<uint32_t>(group),
                                         static_cast<uint32_t>(M / group))
          : encode_query_map<BoxedTile>(p, &maps.q);
  // (pieces TMA cannot describe are gathered)
  const bool boxes_described =
      boxed &&
      arch::encode_rows_map(&maps.k, reinterpret_cast<const void*>(p.k), BoxedTile::kElementBytes, p.hdim_q, page,
                            p.nhead_k, p.num_pages, p.k_row_stride, p.k_head_stride, p.k_batch_stride, box) &&
      arch::encode_rows_map(&maps.v, reinterpret_cast<const void*>(p.v), BoxedTile::kElementBytes, p.hdim_v, page,
                            p.nhead_k, p.num_pages, p.v_row_stride, p.v_head_stride, p.v_batch_stride, box);
  if (!query_described || (!boxes_described && boxed && !pieces)) return fallback();
  const int64_t tiles = Source::tiles(p);  // (the boxed tile's grid: the same M)
  // Masked tiles differ in cost: given a tile counter (the run's scheduler workspace), a persistent grid
  // of one CTA per SM takes them from it in the grid's order, each CTA loading its next tile under the
  // current one's epilogue. Otherwise one CTA per tile (a grid's x is below 2^31: more walk statically).
  // The launcher's CU count, as its splits use.
  const int64_t sms = p.cu_count > 0 ? p.cu_count : 1;
  const bool counted = takes_tile_counter(p.tile_counter, p.masked != 0, tiles, sms);
  fmha_kvcache_params params;
  if (const int32_t zeroed = with_tile_counter(p, counted, stream, &params)) return zeroed;
  const int64_t ctas = counted || tiles > INT32_MAX ? sms : tiles;
  return boxes_described ? launch_specialized_kernel<BoxedTile, T>(params, maps, Source::walk(p), ctas, stream)
                         : launch_specialized_kernel<GatheredTile, T>(params, maps, Source::walk(p), ctas, stream);
}

// The kv cache's prefill (kPackGqa: packed decode) of one bucket, masked or not: the warp-specialized
// kernel, with the cp.async kernel of kFallbackWarpgroups warpgroups and kFallbackKeys keys per tile for
// what it does not take.
template <typename T, int kBucket, int kFallbackWarpgroups, int kFallbackKeys, bool kPackGqa = false>
int32_t launch_paged(const fmha_kvcache_params& p, hipStream_t stream) {
  return with_mask(p, [&](auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    return launch_specialized<T, kBucket, kMasked>(p, stream, [&] {
      return launch_forward<T, kBucket, kFallbackWarpgroups, kFallbackKeys, kMasked, false, kPackGqa>(p, stream);
    });
  });
}

// One bucket of the dense forward, masked or not: the warp-specialized kernel, with the cp.async
// kernel of head dim kFallbackDim (kFallbackWarpgroups warpgroups, kFallbackKeys keys per tile) for
// tensors TMA cannot describe.
template <typename T, int kBucket, int kFallbackDim, int kFallbackWarpgroups, int kFallbackKeys>
int32_t launch_dense(const fmha_fwd_params& p, hipStream_t stream) {
  const auto launch = [&](auto masked, auto consumers) {
    constexpr bool kMasked = decltype(masked)::value;
    return launch_specialized<T, kBucket, kMasked, decltype(consumers)::value>(p, stream, [&] {
      return launch_forward<T, kFallbackDim, kFallbackWarpgroups, kFallbackKeys, kMasked, false>(p, stream);
    });
  };
  if constexpr (kBucket == 64 && sizeof(T) == 2) {
    if (dense_consumers(p) == 3) return launch(std::false_type{}, std::integral_constant<int, 3>{});
  }
  return with_mask(p, [&](auto masked) { return launch(masked, std::integral_constant<int, 2>{}); });
}

// The cp.async kernel's tile shapes (the kv cache's other instances, and the fallback of the
// warp-specialized ones), warpgroups of 64 q rows and keys per tile, measured on an H200 (docs/perf.md,
// 2026-11-21):
//   D = 64: one warpgroup, 128 keys (80 KiB): two CTAs per SM interleave their softmax phases with
//     each other's MMAs (two warpgroups sharing the K/V tiles: 0.88-0.98x of this);
//   D = 128: two warpgroups sharing each 128-key K/V tile (161 KiB, one CTA per SM): half the K/V
//     traffic per query row of one warpgroup with 64 keys (that: 0.85-0.97x of this at S >= 2k);
//   D = 256: two warpgroups, 64 keys (192 KiB), as the kv cache's warp-specialized D = 256 tile. The
//     dense forward's 80 keys fit neither whole-tile TMA boxes of the usual pages (multiples of 80 keys)
//     nor the gathering producer (a thread's run of 20 rows is not whole swizzle periods).
// fp8 (the kv-cache's) has the D = 128 shape only (rows of one 128-byte swizzle block); the registry
// routes smaller head dims to it.
// kPageScales: the kv-cache's fp8 K/V descales per page (its own instances, so that the uniform path
// carries nothing of them).
// The kv-cache's decode (fmha_kvcache_params::pack_gqa): tiles whose rows are (query row, query head)
// pairs of one kv head (the registry's "_gqa" instances), so that K/V are read once per kv head. The
// tiles of 128 rows (block_m 128: 16-bit at D = 64, 128 and 256, fp8 with uniform descales at D = 128)
// are the warp-specialized kernel's, the prefill's tiles: its producer keeps K and V in flight (three
// stages of 128 keys; D = 256 two of 64), what a read-bound decode needs (the cp.async kernel of the same
// shape where TMA cannot take the pages). The others, for groups that do not divide 128 rows and fp8's
// per-page descales, one warpgroup of 64 rows: 64-key tiles for 16-bit types (80 KiB at D = 128) let two
// CTAs share an SM and keep four tiles in flight; 8-bit ones keep the 128 keys the V transpose is written
// for (88 KiB).
template <typename T, bool kPageScales, typename Params>
int32_t dispatch_packed(const Params& p, hipStream_t stream) {
  constexpr int N = sizeof(T) == 1 ? 128 : 64;
  if constexpr (!kPageScales && std::is_same_v<Params, fmha_kvcache_params>) {
    if (p.block_m == 128) {
      if (p.hdim_bucket == 128) return launch_paged<T, 128, 2, 128, true>(p, stream);
      if constexpr (sizeof(T) == 2) {
        if (p.hdim_bucket == 64) return launch_paged<T, 64, 2, 128, true>(p, stream);
        if (p.hdim_bucket == 256) return launch_paged<T, 256, 2, 64, true>(p, stream);
      }
    }
  }
  switch (p.hdim_bucket) {
    case 64:
      if constexpr (sizeof(T) == 1) {
        return static_cast<int32_t>(cudaErrorInvalidValue);
      } else {
        return p.masked ? launch_forward<T, 64, 1, N, true, kPageScales, true>(p, stream)
                        : launch_forward<T, 64, 1, N, false, kPageScales, true>(p, stream);
      }
    case 128:
      return p.masked ? launch_forward<T, 128, 1, N, true, kPageScales, true>(p, stream)
                      : launch_forward<T, 128, 1, N, false, kPageScales, true>(p, stream);
    default:
      return static_cast<int32_t>(cudaErrorInvalidValue);
  }
}

template <typename T, bool kPageScales = false, typename Params>
int32_t dispatch_forward(const Params& p, hipStream_t stream) {
  if constexpr (std::is_same_v<Params, fmha_kvcache_params>) {
    if (p.pack_gqa != 0) return dispatch_packed<T, kPageScales>(p, stream);
    if constexpr (kPageScales) {  // fp8 with per-page descales: the cp.async kernel
      if (p.hdim_bucket == 128) {
        return with_mask(p, [&](auto masked) {
          return launch_forward<T, 128, 2, 128, decltype(masked)::value, true>(p, stream);
        });
      }
    } else if (p.hdim_bucket == 128) {
      return launch_paged<T, 128, 2, 128>(p, stream);
    } else if constexpr (sizeof(T) == 2) {
      if (p.hdim_bucket == 64) return launch_paged<T, 64, 1, 128>(p, stream);
      if (p.hdim_bucket == 256) return launch_paged<T, 256, 2, 64>(p, stream);
    }
    return static_cast<int32_t>(cudaErrorInvalidValue);
  } else if constexpr (sizeof(T) == 1) {
    if (p.hdim_bucket == 128) return launch_dense<T, 128, 128, 2, 128>(p, stream);
    return static_cast<int32_t>(cudaErrorInvalidValue);
  } else {
    switch (p.hdim_bucket) {
      case 64:
        return launch_dense<T, 64, 64, 1, 128>(p, stream);
      case 128:
        return launch_dense<T, 128, 128, 2, 128>(p, stream);
      case 192:  // falls back to the 256 bucket's cp.async kernel
        return launch_dense<T, 192, 256, 2, 64>(p, stream);
      case 256:  // the fallback: 64 keys per tile (192 KiB)
        return launch_dense<T, 256, 256, 2, 64>(p, stream);
      default:
        return static_cast<int32_t>(cudaErrorInvalidValue);
    }
  }
}

}  // namespace fmha

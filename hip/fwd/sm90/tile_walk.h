// The grid of the warp-specialized dense forward and the order it takes the tiles in: how many CTAs,
// whether they take tiles from a counter (fwd/sm90/tile_queue.h), and tile t's q block and
// (batch, query head) pair. The launch decides it on the host; the kernel only looks positions up, its
// divisions by the call's sizes precomputed (common/fast_divide.h). Plain host-device code: the CPU
// twin (hip/fwd/sm90/tile_walk_cpu.cpp) lets the tests walk every tile without a GPU.
#pragma once

#include <stdint.h>

#include "common/fast_divide.h"
#include "launch.h"

namespace fmha {

// Tile t is q block `block` (counted from the sequence's start) of pair b · nhead_q + y.
struct TilePosition {
  int64_t block, pair;
};

// Two orders. Blocks fastest (one CTA per tile): CTAs that run together share a pair's K and V in L2.
// Sections: the pairs in sections of `width` (the last one: the pairs left over), sections in turn,
// each one's q blocks slowest and the heaviest (masked: the last) first, pairs fastest, so that a
// section's K and V stay in L2 while its tiles run and the longest tiles start first.
struct DenseTileWalk {
  FastDivide blocks, nhead_q, group;   // q blocks per pair; pair → (b, y); query head → kv head
  FastDivide section_tiles, width, rest_width;
  int64_t whole_pairs, whole_tiles;  // in the whole sections
  int32_t masked, blocks_fastest;

  FMHA_HOST_DEVICE TilePosition at(int64_t t) const {
    TilePosition at;
    if (blocks_fastest != 0) {
      at.pair = blocks.quotient(t);
      at.block = t - at.pair * blocks.divisor();
    } else {
      const bool rest = t >= whole_tiles;
      const int64_t section = rest ? 0 : section_tiles.quotient(t);
      const int64_t within = rest ? t - whole_tiles : t - section * section_tiles.divisor();
      const FastDivide& across = rest ? rest_width : width;
      const int64_t slow = across.quotient(within);
      at.pair = (rest ? whole_pairs : section * width.divisor()) + within - slow * across.divisor();
      at.block = slow;
    }
    if (masked != 0) at.block = blocks.divisor() - 1 - at.block;  // the heaviest first
    return at;
  }
};

struct DenseGrid {
  int64_t tiles, ctas;
  bool counted;  // the CTAs take tiles from p.tile_counter
  DenseTileWalk walk;
};

// Whether a grid of `tiles` tiles on `sms` SMs takes them from a tile counter (`counter`: its address, 0
// for none): masked tiles differ in cost, a persistent grid pays where there are more tiles than SMs, and
// the counter's int32 values stay below 2^31. The kv cache's launch (fwd/sm90/instances.h) decides alike.
FMHA_HOST_DEVICE inline bool takes_tile_counter(uint64_t counter, bool masked, int64_t tiles, int64_t sms) {
  return counter != 0 && masked && tiles > sms && tiles <= 0x7fffffff - sms;
}

// K and V bytes of the pairs of one section: a third of the 50 MB L2 (sections of 32 MiB re-read K and
// V from DRAM, docs/perf.md).
constexpr int64_t kDenseSectionBytes = int64_t{16} << 20;

// The grid of a call `p` (its tile_counter 0 when the call has no workspace) of `block_m`-row tiles of
// `element_bytes` elements on a device of `sms` SMs:
// - unmasked batch-mode tiles all cost the same: a persistent grid of one CTA per SM walks them, blocks
//   fastest (a CTA's epilogue runs under its next tile's loads);
// - masked tiles differ: given a tile counter, a persistent grid takes them from it, in sections; without
//   one, one CTA per tile lets the hardware hand the next tile to whichever SM frees first (heaviest
//   first), and masked batch-mode calls over at most 4 q blocks (tiles too short to hide a CTA's start)
//   walk them persistently in one section;
// - unmasked varlen tiles keep one CTA per tile, which measured faster than the counter (docs/perf.md,
//   the 2026-11-26 12:51 UTC section).
// A grid's x is below 2^31: more tiles walk persistently.
FMHA_HOST_DEVICE inline DenseGrid dense_grid(const fmha_fwd_params& p, int block_m, int element_bytes, int64_t sms) {
  DenseGrid g;
  const int64_t m_blocks = (static_cast<int64_t>(p.max_seqlen_q) + block_m - 1) / block_m;
  const int64_t pairs = static_cast<int64_t>(p.nhead_q) * p.batch;
  const bool masked = p.masked != 0;
  g.tiles = m_blocks * pairs;
  g.counted = takes_tile_counter(p.tile_counter, masked, g.tiles, sms);
  const bool persistent = g.counted || (p.group_mode == 0 && (!masked || m_blocks <= 4)) || g.tiles > 0x7fffffff;
  g.ctas = persistent && g.tiles > sms ? sms : g.tiles;
  const int64_t group = p.nhead_k > 0 ? p.nhead_q / p.nhead_k : 1;  // query heads per kv head
  // Pairs per section: a power of two of kv heads (a sequence's K and V of one), times the GQA group.
  int64_t width = pairs;
  if (g.counted) {
    const int64_t rows = p.group_mode != 0 ? p.seqlen_k / (p.batch > 0 ? p.batch : 1) : p.seqlen_k;
    const int64_t head_bytes = (rows > 1 ? rows : 1) * (p.hdim_q + p.hdim_v) * static_cast<int64_t>(element_bytes);
    int64_t kv_heads = 1;
    while (kv_heads * 2 * head_bytes <= kDenseSectionBytes) kv_heads *= 2;
    width = kv_heads * group < pairs ? kv_heads * group : pairs;
  }
  DenseTileWalk& w = g.walk;
  w.blocks = FastDivide(m_blocks);
  w.nhead_q = FastDivide(p.nhead_q);
  w.group = FastDivide(group);
  w.masked = masked;
  w.blocks_fastest = !(masked && g.ctas < g.tiles);
  w.width = FastDivide(width);
  w.whole_pairs = width > 0 ? pairs / width * width : 0;
  w.rest_width = FastDivide(pairs - w.whole_pairs);
  w.section_tiles = FastDivide(width * m_blocks);
  w.whole_tiles = w.whole_pairs * m_blocks;
  return g;
}

}  // namespace fmha

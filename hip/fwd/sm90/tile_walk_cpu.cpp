// fwd/sm90/tile_walk.h and common/fast_divide.h built for the host CPU, in every backend: the tests walk
// every tile of random calls (each tile once, in the promised order) and compare the divisions with
// Rust's, so the code the warp-specialized forward's launch and kernel run is checked without a GPU.
#include "common/fast_divide.h"
#include "fwd/sm90/tile_walk.h"

// The dense grid of `params` (128-row tiles of 16-bit elements) on `sms` SMs: out[0] its tiles,
// out[1] its CTAs, out[2] 1 if counted, then each tile's q block and pair, as far as `capacity` values
// go. Returns the count of values the grid has (3 + 2 · tiles).
extern "C" int64_t fmha_cpu_dense_grid(const fmha_fwd_params* params, int64_t sms, int64_t* out, int64_t capacity) {
  const fmha::DenseGrid g = fmha::dense_grid(*params, 128, 2, sms);
  const int64_t count = 3 + 2 * g.tiles;
  if (count > capacity) return count;
  out[0] = g.tiles;
  out[1] = g.ctas;
  out[2] = g.counted ? 1 : 0;
  for (int64_t t = 0; t < g.tiles; ++t) {
    const fmha::TilePosition at = g.walk.at(t);
    out[3 + 2 * t] = at.block;
    out[4 + 2 * t] = at.pair;
  }
  return count;
}

// FastDivide(*divisor) of n: out[0] the quotient, out[1] the remainder.
extern "C" void fmha_cpu_fast_divide(const int64_t* divisor, int64_t n, int64_t* out) {
  const fmha::FastDivide d(*divisor);
  out[0] = d.quotient(n);
  out[1] = d.remainder(n);
}

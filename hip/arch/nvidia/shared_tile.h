// Shared-memory tiles of the NVIDIA mainloops: the XOR-swizzled layout the tensor cores read, and the
// cp.async copy of a row-major global tile into it. Every tile is rows of `kChunks` 16-byte chunks
// (kChunks a multiple of 8).
#pragma once

#include "arch/nvidia/tensor_core.h"
#include "arch/thread.h"

namespace fmha {

// The wgmma 128-byte swizzle (arch/nvidia/warpgroup.h): blocks of 8 chunks (64 columns), each block
// [kRows][128 B] with chunk c of row r at chunk c XOR (r mod 8), which also spreads the 8 rows of any
// column of chunks over all 32 banks.
template <int kChunks, int kRows>
struct Swizzle128 {
  static constexpr int kRowBytes = 128;
  static constexpr int kSwizzlePeriod = 8;  // rows r and r + 8 have the same chunk order
  static constexpr uint32_t kBlockBytes = kRows * 128;
  __device__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk / 8) * kBlockBytes + row * 128 + (((chunk % 8) ^ (row & 7)) * 16));
  }
};

// The swizzle is on absolute address bits, so Swizzle128 tiles start on 1024-byte boundaries: a kernel
// asks for kSwizzle128Slack more bytes of dynamic shared memory and places its tiles from this base.
constexpr int kSwizzle128Slack = 1024;
__device__ inline uint32_t swizzle128_base(const void* dynamic_shared) {
  return (arch::shared_address(dynamic_shared) + 1023u) & ~1023u;
}

// A thread's share of copying a [kRows][kChunks] tile global → shared (`Layout`: Swizzle128 or a layout
// of the same 128-byte rows): chunks tid, tid + kThreads, ... which are the same (row, chunk) pairs for
// every tile, so their offsets are computed once and a tile's copy is a few adds per chunk. `kUnroll`:
// chunks issued per loop trip (0: all of them; fewer keep a thread with few registers, such as a
// producer warpgroup's, from holding every address at once).
template <typename Tile, int kRows, typename Layout, int kUnroll = 0>
struct TileCopy {
  static constexpr int kPerThread = (kRows * Tile::kChunks + Tile::kThreads - 1) / Tile::kThreads;
  static constexpr int kRowStep = Tile::kThreads / Tile::kChunks;  // rows between a thread's chunks
  static constexpr int kTripChunks = kUnroll == 0 ? kPerThread : kUnroll;
  static_assert(Tile::kThreads % Tile::kChunks == 0, "every thread copies one column of chunks");
  int row;                // first row of this thread
  int chunk;              // its 16-byte chunk of every row
  uint32_t shared_first;  // byte offset of the first chunk in the tile

  __device__ TileCopy() {
    const int c = arch::thread_index();
    row = c / Tile::kChunks;
    chunk = c % Tile::kChunks;
    shared_first = Layout::offset(row, chunk);
  }

  // The shared offset of this thread's i-th chunk: where rows i · kRowStep apart have the same chunk
  // order, the first chunk's offset plus whole rows.
  __device__ uint32_t shared_offset(int i) const {
    if constexpr (kRowStep % Layout::kSwizzlePeriod == 0) {
      return shared_first + i * kRowStep * Layout::kRowBytes;
    } else {
      return Layout::offset(row + i * kRowStep, chunk);
    }
  }

  // Queues the copy of rows [0, kRows) of `global` (row stride in elements) into `shared` (a 32-bit
  // shared address); rows from `valid_rows` on and columns from `cols` on become zeros.
  template <typename T>
  __device__ void issue(uint32_t shared, const T* global, int64_t row_stride, int valid_rows, int cols) const {
    const int column = chunk * (16 / static_cast<int>(sizeof(T)));
    const bool column_valid = column < cols;
    const T* src = global + row * row_stride + column;
#pragma unroll kTripChunks
    for (int i = 0; i < kPerThread; ++i) {
      const int r = row + i * kRowStep;
      if (r < kRows) {
        const bool valid = column_valid && r < valid_rows;
        arch::copy_async_16(shared + shared_offset(i), valid ? src : global, valid);
      }
      src += kRowStep * row_stride;
    }
  }

  // The same copy from rows anywhere in memory: `row_address(i)` is the first element of this thread's
  // i-th row (row `first_row() + i * kRowStep` of the tile), asked only for rows below `valid_rows`
  // (rows from `valid_rows` on and columns from `cols` on become zeros, and their copies read nothing:
  // `fallback`, any valid address, stands in).
  template <typename T, typename RowAddress>
  __device__ void issue_rows(uint32_t shared, const RowAddress& row_address, const T* fallback, int valid_rows,
                             int cols) const {
    const int column = chunk * (16 / static_cast<int>(sizeof(T)));
    const bool column_valid = column < cols;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int r = row + i * kRowStep;
      if (r < kRows) {
        const bool valid = column_valid && r < valid_rows;
        const T* src = valid ? row_address(i) + column : fallback;
        arch::copy_async_16(shared + shared_offset(i), src, valid);
      }
    }
  }

  // This thread's first row of a tile.
  __device__ int first_row() const { return row; }
};
}  // namespace fmha

// The Tensor Memory Accelerator (TMA) on Hopper (sm_90a): tensor maps encoded on the host, and the
// device's tile copies into shared memory that complete on an mbarrier's transaction count.
//
// A map describes a [batch, rows, heads, dim] tensor of 16- or 8-bit elements (any strides that are
// whole 16-byte multiples) as 4-D with a box of 128 bytes of columns (64 16-bit ones, 128 8-bit ones) by
// `box_rows` rows (or, packed, `group` heads by rows) in the 128-byte swizzle, which is exactly
// Swizzle128's layout (arch/nvidia/shared_tile.h): a tile's rows are one box per 128-byte block of
// columns. Elements outside the tensor land as zeros (and count toward the transaction bytes). fp32 maps
// (32 columns a box) serve reductions from shared memory into global, which skip the box's elements
// outside the tensor.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "arch/nvidia/pipeline.h"
#include "arch/platform.h"

namespace fmha {
namespace arch {

// The driver's encoder, fetched once through the runtime (nothing more to link); null when the driver
// has none (the caller then takes a kernel without TMA).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encoder;
}

// Encodes `map` for a tensor of `element_bytes` (2 or 1; 4: fp32) at `base` of 128-byte boxes of columns (the
// 128-byte swizzle) over the 3 outer dimensions `sizes` (innermost first) with element strides
// `strides`, each box `box` of them. False where TMA cannot describe it (alignment, strides, sizes, no
// encoder).
inline bool encode_map(CUtensorMap* map, const void* base, int element_bytes, int64_t cols, const int64_t (&sizes)[3],
                       const int64_t (&strides)[3], const uint32_t (&box)[3]) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4) return false;
  if (cols < 1 || cols > (int64_t{1} << 32)) return false;
  cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols)};
  cuuint64_t byte_strides[3];
  for (int d = 0; d < 3; ++d) {
    // (a dimension of one is never stepped over: its stride only has to be valid)
    const int64_t stride = sizes[d] > 1 ? strides[d] * element_bytes : 16;
    if (sizes[d] < 1 || sizes[d] > (int64_t{1} << 32) || box[d] < 1 || box[d] > 256) return false;
    if (stride <= 0 || stride % 16 != 0 || stride >= (int64_t{1} << 40)) return false;
    dims[d + 1] = static_cast<cuuint64_t>(sizes[d]);
    byte_strides[d] = static_cast<cuuint64_t>(stride);
  }
  const cuuint32_t boxes[4] = {static_cast<cuuint32_t>(128 / element_bytes), box[0], box[1], box[2]};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = element_bytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : element_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16
                                                        : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  return encode(map, type, 4, const_cast<void*>(base), dims, byte_strides, boxes, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A [batch, rows, heads, cols] tensor of `element_bytes` (strides in elements) as (column, row, head,
// batch) boxes of `box_rows` rows of one head.
inline bool encode_rows_map(CUtensorMap* map, const void* base, int element_bytes, int64_t cols, int64_t rows,
                            int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                            int64_t batch_stride, uint32_t box_rows) {
  return encode_map(map, base, element_bytes, cols, {rows, heads, batch}, {row_stride, head_stride, batch_stride},
                    {box_rows, 1, 1});
}

// The same tensor as (column, head, row, batch) boxes of `group` consecutive heads by `box_rows` rows:
// box row r is row r / group of head r % group from the box's first ones (the packed-GQA tile's rows).
inline bool encode_packed_rows_map(CUtensorMap* map, const void* base, int element_bytes, int64_t cols, int64_t rows,
                                   int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride,
                                   int64_t batch_stride, uint32_t group, uint32_t box_rows) {
  return encode_map(map, base, element_bytes, cols, {heads, rows, batch}, {head_stride, row_stride, batch_stride},
                    {group, box_rows, 1});
}

// global[box at (column, c1, c2, c3) of `map`] += shared[the box, 1024-aligned, in the 128-byte swizzle]:
// fp32 adds in L2, tracked in the issuing thread's bulk groups (arch/nvidia/bulk_copy.h); or, where
// `store`, global[the box] = shared[the box]. One predicated instruction each, no branch.
__device__ inline void tma_store_or_add(const CUtensorMap& map, uint32_t shared, int column, int c1, int c2, int c3,
                                        bool store) {
  asm volatile(
      "{\n.reg .pred s;\nsetp.ne.b32 s, %6, 0;\n"
      "@s cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      "@!s cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], "
      "[%1];\n}\n" ::"l"(reinterpret_cast<uint64_t>(&map)),
      "r"(shared), "r"(column), "r"(c1), "r"(c2), "r"(c3), "r"(static_cast<uint32_t>(store))
      : "memory");
}

// Adds `bytes` to the transactions the current phase of `bar` waits for, without arriving.
__device__ inline void mbarrier_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Adds `bytes` to the transactions the current phase of `bar` waits for, and arrives once.
__device__ inline void mbarrier_arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

// Copies the box at (column, row, head, batch) of `map` (a __grid_constant__ parameter) to `shared`
// (1024-aligned for the swizzle), completing its bytes on `bar`.
__device__ inline void tma_load(uint32_t shared, const CUtensorMap& map, uint32_t bar, int column, int row, int head,
                                int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(shared),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(column), "r"(row), "r"(head), "r"(batch)
      : "memory");
}

// The boxes of kCols columns of T at (row, head, batch) of `map` into consecutive 128-byte blocks of
// columns `block_bytes` apart (Swizzle128's), completing on `bar`, which the caller armed with their bytes
// (every box counts in full).
template <typename T, int kCols>
__device__ inline void tma_load_rows(uint32_t shared, uint32_t block_bytes, const CUtensorMap& map, uint32_t bar,
                                     int row, int head, int batch) {
  constexpr int kBoxCols = 128 / static_cast<int>(sizeof(T));
#pragma unroll
  for (int col = 0; col < kCols; col += kBoxCols) {
    tma_load(shared + (col / kBoxCols) * block_bytes, map, bar, col, row, head, batch);
  }
}

// A stage's arrivals for TMA loads of `bytes` in all: lane 0 arms `bar` with the bytes, the producer's
// other threads arrive.
__device__ inline void arm_or_arrive(uint32_t bar, uint32_t bytes, int lane) {
  if (lane == 0) {
    mbarrier_arrive_expect_bytes(bar, bytes);
  } else {
    mbarrier_arrive(bar);
  }
}

// A tile of kCols columns of T at (row, head, batch) of `map`: arms `bar` with its `bytes` and loads its
// boxes (tma_load_rows). Lane 0 issues; the producer's other threads arrive.
template <typename T, int kCols>
__device__ inline void tma_load_tile(uint32_t shared, uint32_t block_bytes, const CUtensorMap& map, uint32_t bar,
                                     uint32_t bytes, int row, int head, int batch, int lane) {
  arm_or_arrive(bar, bytes, lane);
  if (lane == 0) tma_load_rows<T, kCols>(shared, block_bytes, map, bar, row, head, batch);
}

}  // namespace arch
}  // namespace fmha

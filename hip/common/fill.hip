// Fills a buffer with one 32-bit value: the first kernel path, proving build, link and launch on
// every GPU backend (its host-backend twin is src/launch/host/fill.rs).
#include "arch/thread.h"
#include "launch.h"

namespace fmha {

constexpr uint32_t kFillBlock = 256;
// Enough blocks to fill any GPU; each thread then strides over the rest of the buffer.
constexpr uint64_t kFillMaxBlocks = 65535;

__global__ void __launch_bounds__(kFillBlock) fill_u32_kernel(uint32_t* dst, uint32_t value, uint64_t count,
                                                              uint64_t grid_threads) {
  for (uint64_t i = uint64_t(arch::block_index_x()) * kFillBlock + arch::thread_index(); i < count;
       i += grid_threads) {
    dst[i] = value;
  }
}

}  // namespace fmha

extern "C" int32_t fmha_hip_fill_u32(const fmha_fill_params* args, void* stream) {
  if (args == nullptr) return 1;  // hipErrorInvalidValue / cudaErrorInvalidValue
  const uint64_t count = args->count;
  if (count == 0) return 0;
  uint64_t blocks = (count + fmha::kFillBlock - 1) / fmha::kFillBlock;
  if (blocks > fmha::kFillMaxBlocks) blocks = fmha::kFillMaxBlocks;
  fmha::fill_u32_kernel<<<dim3(uint32_t(blocks)), dim3(fmha::kFillBlock), 0, static_cast<hipStream_t>(stream)>>>(
      reinterpret_cast<uint32_t*>(args->dst), args->value, count, blocks * fmha::kFillBlock);
  return static_cast<int32_t>(hipGetLastError());
}

extern "C" int32_t fmha_hip_load_fill(void) { return fmha::arch::load_module(fmha::fill_u32_kernel); }

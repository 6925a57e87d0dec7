// The launch stub of the standalone merge of attention states (the kernel: merge/merge.h): one
// instance per pair of element types, on the vector path or element by element.
#include "merge/merge.h"

namespace fmha {
namespace merge {

constexpr int64_t kMaxBlocks = 1 << 16;  // beyond, the waves loop over the (row, head) pairs

template <int kIn, int kOut>
int32_t launch(const fmha_merge_params& p, dim3 grid, hipStream_t stream) {
  constexpr int kN = vector_columns<kIn, kOut>();
  const dim3 block(kWaves * arch::kWaveSize);
  if (vectorizable<kIn, kOut, kN>(p)) {
    merge_kernel<kIn, kOut, kN><<<grid, block, 0, stream>>>(p);
  } else {
    merge_kernel<kIn, kOut, 1><<<grid, block, 0, stream>>>(p);
  }
  return static_cast<int32_t>(hipGetLastError());
}

constexpr int32_t kInvalidValue = 1;  // hipErrorInvalidValue / cudaErrorInvalidValue

template <int kIn>
int32_t launch_for_output(const fmha_merge_params& p, dim3 grid, hipStream_t stream) {
  switch (p.out_dtype) {
    case kFp16:
      return launch<kIn, kFp16>(p, grid, stream);
    case kBf16:
      return launch<kIn, kBf16>(p, grid, stream);
    case kFp32:
      return launch<kIn, kFp32>(p, grid, stream);
    default:  // the Rust side validated the type
      return kInvalidValue;
  }
}

}  // namespace merge
}  // namespace fmha

extern "C" int32_t fmha_hip_merge(const fmha_merge_params* params, void* stream) {
  using namespace fmha::merge;
  if (params == nullptr) return kInvalidValue;
  const int64_t items = static_cast<int64_t>(params->num_rows) * params->nhead;
  if (items <= 0) return 0;  // nothing to merge
  const int64_t blocks = (items + kWaves - 1) / kWaves;
  const dim3 grid(static_cast<uint32_t>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
  const hipStream_t s = static_cast<hipStream_t>(stream);
  switch (params->in_dtype) {
    case kFp16:
      return launch_for_output<kFp16>(*params, grid, s);
    case kBf16:
      return launch_for_output<kBf16>(*params, grid, s);
    case kFp32:
      return launch_for_output<kFp32>(*params, grid, s);
    default:
      return kInvalidValue;
  }
}

extern "C" int32_t fmha_hip_load_merge(void) {
  return fmha::arch::load_module(fmha::merge::merge_kernel<fmha::merge::kFp32, fmha::merge::kFp32, 1>);
}

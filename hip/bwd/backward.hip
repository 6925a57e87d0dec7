// The backward's launch stub: dot_do_o (with the workspace check and the dq_acc zeroing) → dq_dk_dv →
// convert_dq, on one stream. Only what changes the dq_dk_dv inner loop is compiled per instance: the
// element type, the head-dim bucket, masked or not, and the dQ scheme (bwd/dq_scheme.h).
#include "arch/platform.h"
#include "launch.h"
#include "bwd/convert_dq.h"
#include "bwd/dot_do_o.h"

#if defined(FMHA_PLATFORM_NVIDIA)
#include "bwd/sm90/kernel.h"
#include "bwd/sm90/tile.h"
#else
#include "bwd/amd/kernel.h"
#include "bwd/amd/tile.h"
#endif

namespace fmha {

constexpr int32_t kInvalidValue = 1;  // hipErrorInvalidValue / cudaErrorInvalidValue

#if defined(FMHA_PLATFORM_NVIDIA)
// 8 consumer warps: 128 keys per unit (half the dQ atomics of 64; 64 past D = 128), q steps of 64 rows.
constexpr int kBackwardWarps = 8;
constexpr int kBackwardBlockM = 64;

// dq_acc as the kernel's TMA target (bwd/sm90/mainloop.h's DqTarget): (column, query head of the group,
// row, slot) boxes of 32 columns by kDqBoxRows rows. Batch mode's slots are seqlen_q rows each (one per
// batch, kv head and split), so that TMA skips rows past a sequence; group mode's map is one slot of every
// sequence's rows. False where TMA cannot describe it: the kernel then stores or adds element by element
// (the ordered scheme's launch refuses).
template <typename Tile>
bool encode_dq_acc_map(const fmha_bwd_params& p, CUtensorMap* map) {
  const int64_t group = p.nhead_k > 0 ? p.nhead_q / p.nhead_k : 0, row_elements = group * p.hdim_q;
  if (row_elements <= 0) return false;
  const int64_t rows = p.dq_acc_elements / row_elements, slot_rows = p.group_mode ? rows : p.seqlen_q;
  if (slot_rows < 1 || rows % slot_rows != 0) return false;
  const int64_t slots = rows / slot_rows;
  if (slot_rows > INT32_MAX || slots > INT32_MAX) return false;  // (TMA coordinates are 32-bit)
  const void* base = reinterpret_cast<const void*>(p.workspace + static_cast<uint64_t>(p.metadata_bytes));
  return arch::encode_map(map, base, 4, p.hdim_q, {group, slot_rows, slots},
                          {p.hdim_q, row_elements, slot_rows * row_elements}, {1, Tile::kDqBoxRows, 1});
}

template <typename T, int kHeadDim, int kHeadDimV, bool kMasked, DqScheme kScheme>
int32_t launch_dq_dk_dv(const fmha_bwd_params& p, hipStream_t stream) {
  using Tile = BackwardTile<kHeadDim, kHeadDimV, kBackwardWarps, kBackwardBlockM, kMasked, kScheme>;
  // The workspace (dq_acc split slots, schedule) was laid out for the registry's tile: it must be this one.
  if (p.m0 != Tile::kBlockM || p.n0 != Tile::kBlockN) return kInvalidValue;
  const auto kernel = dq_dk_dv_kernel<Tile, T>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes);
  if (configured != cudaSuccess) return static_cast<int32_t>(configured);
  const UnitGrid grid = dq_dk_dv_grid(p, Tile::kSplitSlots, Tile::kBlockN);
  if (grid.x == 0) return 0;
  BackwardMaps maps{};
  maps.dq_boxes = encode_dq_acc_map<Tile>(p, &maps.dq);
  // The ordered dQ writer sends TMA boxes only.
  if (Tile::kOrdered && !maps.dq_boxes && p.dq_acc_elements > 0) return kInvalidValue;
  // Q and dO as boxes of kBlockM rows (column blocks of 128 bytes), as the forward's query map.
  const int64_t batches = p.group_mode ? 1 : p.batch;
  maps.tiles = arch::encode_rows_map(&maps.q, reinterpret_cast<const void*>(p.q), sizeof(T), p.hdim_q, p.seqlen_q,
                                     p.nhead_q, batches, p.q_row_stride, p.q_head_stride, p.q_batch_stride,
                                     Tile::kBlockM) &&
               arch::encode_rows_map(&maps.d_o, reinterpret_cast<const void*>(p.d_o), sizeof(T), p.hdim_v,
                                     p.seqlen_q, p.nhead_q, batches, p.do_row_stride, p.do_head_stride,
                                     p.do_batch_stride, Tile::kBlockM);
  kernel<<<dim3(grid.x, grid.y, grid.z), Tile::kThreads, Tile::kSharedBytes, stream>>>(p, maps);
  return static_cast<int32_t>(cudaGetLastError());
}

#else
template <typename T, int kHeadDim, int kHeadDimV, bool kMasked, DqScheme kScheme>
int32_t launch_dq_dk_dv(const fmha_bwd_params& p, hipStream_t stream) {
  static_assert(kHeadDimV == kHeadDim, "the AMD tiles' V has Q's head dim");
  constexpr bool kDeterministic = kScheme == DqScheme::kSplitSlots;
  using Tile = AmdBackwardTile<kHeadDim>;
  // The workspace (dq_acc split slots, schedule) was laid out for the registry's tile: it must be this one.
  if (p.m0 != Tile::kBlockM || p.n0 != Tile::kBlockN) return kInvalidValue;
  // The kernel addresses the rows of a K, V, Q or dO tile with 32-bit byte offsets from its first row:
  // 128 rows must span less than 4 GiB (row strides below 2^24 elements). The host refuses larger
  // strides before anything is queued (registry.rs AMD_MAX_INPUT_ROW_STRIDE); this guards the kernel.
  constexpr int64_t kMaxRowStride = int64_t(1) << 24;
  if (p.q_row_stride >= kMaxRowStride || p.k_row_stride >= kMaxRowStride || p.v_row_stride >= kMaxRowStride ||
      p.do_row_stride >= kMaxRowStride) {
    return kInvalidValue;
  }
  const UnitGrid grid = dq_dk_dv_grid(p, kDeterministic, Tile::kBlockN);
  if (grid.x == 0) return 0;
  auto kernel = dq_dk_dv_kernel_amd<T, kHeadDim, kMasked, kDeterministic>;
  kernel<<<dim3(grid.x, grid.y, grid.z), Tile::kThreads, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}
#endif

template <typename T, int kHeadDim, int kHeadDimV, DqScheme kScheme>
int32_t dispatch_masks(const fmha_bwd_params& p, hipStream_t stream) {
  return p.masked ? launch_dq_dk_dv<T, kHeadDim, kHeadDimV, true, kScheme>(p, stream)
                  : launch_dq_dk_dv<T, kHeadDim, kHeadDimV, false, kScheme>(p, stream);
}

template <typename T, int kHeadDim, int kHeadDimV = kHeadDim>
int32_t dispatch_schemes(const fmha_bwd_params& p, hipStream_t stream) {
  switch (dq_scheme(p)) {
    case DqScheme::kAtomic:
      return dispatch_masks<T, kHeadDim, kHeadDimV, DqScheme::kAtomic>(p, stream);
    case DqScheme::kSplitSlots:
      return dispatch_masks<T, kHeadDim, kHeadDimV, DqScheme::kSplitSlots>(p, stream);
    case DqScheme::kOrdered:
#if defined(FMHA_PLATFORM_NVIDIA)
      return dispatch_masks<T, kHeadDim, kHeadDimV, DqScheme::kOrdered>(p, stream);
#else
      return kInvalidValue;  // (the AMD kernels have split slots only: the launcher refuses ordered dQ)
#endif
  }
  return kInvalidValue;
}

// The head-dim bucket is the registry instance's Q/K head dim; 192 is the one with V 128 (DeepSeek's MLA
// shape), whose smaller V gets its own tile.
template <typename T>
int32_t dispatch_dq_dk_dv(const fmha_bwd_params& p, hipStream_t stream) {
  switch (p.hdim_bucket) {
    case 64:
      return dispatch_schemes<T, 64>(p, stream);
    case 128:
      return dispatch_schemes<T, 128>(p, stream);
#if defined(FMHA_PLATFORM_NVIDIA)
    case 192:
      return dispatch_schemes<T, 192, 128>(p, stream);
    case 256:
      return dispatch_schemes<T, 256>(p, stream);
#endif
    default:
      return kInvalidValue;
  }
}

inline int32_t dq_dk_dv(const fmha_bwd_params& p, hipStream_t stream) {
#if defined(FMHA_PLATFORM_NVIDIA)
  return p.dtype == 0 ? dispatch_dq_dk_dv<__half>(p, stream) : dispatch_dq_dk_dv<__nv_bfloat16>(p, stream);
#else
  return p.dtype == 0 ? dispatch_dq_dk_dv<arch::Half>(p, stream) : dispatch_dq_dk_dv<arch::BFloat16>(p, stream);
#endif
}

template <bool kBf16>
int32_t backward(const fmha_bwd_params& p, hipStream_t stream) {
  dot_do_o_kernel<kBf16><<<dot_do_o_grid(p), kDotThreads, 0, stream>>>(p);
  int32_t code = static_cast<int32_t>(hipGetLastError());
  if (code != 0) return code;
  code = dq_dk_dv(p, stream);
  if (code != 0 || p.max_seqlen_q <= 0) return code;
  convert_dq_kernel<kBf16><<<row_tiles_grid(p, kConvertRows), kConvertThreads, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}

}  // namespace fmha

extern "C" int32_t fmha_hip_bwd(const fmha_bwd_params* params, void* stream) {
  if (params == nullptr || params->workspace == 0) return fmha::kInvalidValue;
  if (params->batch <= 0) return 0;  // nothing to compute
  const hipStream_t s = static_cast<hipStream_t>(stream);
  return params->dtype == 0 ? fmha::backward<false>(*params, s) : fmha::backward<true>(*params, s);
}

extern "C" int32_t fmha_hip_load_backward(void) { return fmha::arch::load_module(fmha::dot_do_o_kernel<true>); }

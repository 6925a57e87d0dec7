// The backward workspace's metadata region, built from the sequence starts: the C++ twin of
// `workspace::prepare_metadata` (src/workspace/metadata.rs) with `workspace::fingerprint`,
// `schedule::BatchPersistent` and `schedule::build_group_table` (src/schedule/mod.rs). This ONE
// implementation runs
//   * on the GPU, in one thread (bwd/prepare_workspace.hip): the graph-capture-safe prepare that reads
//     the seqstarts where they already are, on the device, so preparing needs no device-to-host copy,
//     no host function and no pinned staging buffer (spec ck_fmha_bwd.md §4.3);
//   * on the CPU (bwd/prepare_workspace_cpu.cpp), where the tests compare its bytes with the Rust ones
//     in every CI run, without a GPU.
// The bytes must equal the Rust routine's, byte for byte: a change on one side needs the same change on
// the other (and a kFormatVersion bump when the layout changes).
//
// Rules of this file: C++17 without the standard library, allocation or exceptions; fixed-width
// integers; 64-bit arithmetic exactly where the Rust code uses i64; every overflow the Rust code reports
// is detected here too. Any failure leaves an all-zero region: a zero header reads as "not prepared" to
// `run`, and zero work ranges as "no work" to a kernel that reads the region anyway.
#pragma once

#include <stdint.h>

#include "arch/registers.h"
#include "launch.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the workspace metadata is little-endian and this port stores native 32-bit words"
#endif

namespace fmha {
namespace prepare {

// Results: the fmha_status codes of the errors the Rust routine returns in the same situations.
enum Status : int32_t {
  kOk = 0,
  kInvalidArgument = 1,
  kWorkspaceTooSmall = 5,
  kNullPointer = 8,
};

constexpr int64_t kInt32Max = 0x7fffffff;
constexpr int64_t kInt64Max = 0x7fffffffffffffff;
constexpr uint64_t kUint64Max = ~uint64_t(0);

// The header: "FMHW" (little-endian u32), the format version (u32), the fingerprint (u64).
constexpr uint32_t kMagic = 0x57484D46u;
constexpr uint32_t kFormatVersion = 1;
constexpr int64_t kHeaderBytes = 16;
// Every section starts at a multiple of this (the device reads them as aligned structs).
constexpr int64_t kSectionAlignment = 16;
// Element sizes: i32 nsplits, i64 dq_acc offsets, CuState, BatchState.
constexpr int64_t kNsplitsBytes = 4;
constexpr int64_t kOffsetBytes = 8;
constexpr int64_t kCuStateBytes = 32;
constexpr int64_t kBatchStateBytes = 16;

// ---------------------------------------------------------------------------------------------------
// Arithmetic (schedule.rs helpers). C++ and Rust integer division both truncate toward zero.

// a / b, truncated, for b > 0. Every division by a runtime value goes through here (a remainder is
// a - (a / b) * b, which avoids a second division).
FMHA_HOST_DEVICE inline int64_t div_i64(int64_t a, int64_t b) {
  return arch::in_vector_registers(a) / arch::in_vector_registers(b);
}

// ceil(a / b) for b > 0 and any sign of a.
FMHA_HOST_DEVICE inline int64_t ceil_div(int64_t a, int64_t b) {
  const int64_t q = div_i64(a, b);
  return a - q * b > 0 ? q + 1 : q;
}

// a rounded up to a multiple of m > 0.
FMHA_HOST_DEVICE inline int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

FMHA_HOST_DEVICE inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
FMHA_HOST_DEVICE inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

// *out = a * b; false where Rust's `checked_mul` fails. The exact product is taken in 128 bits (a
// multiply-high on GPUs; a division-based test would cost a 64-bit division expansion per check).
// Operands are never negative here; a negative one is treated as a failure rather than multiplied.
FMHA_HOST_DEVICE inline bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  const __int128 product = static_cast<__int128>(a) * b;
  if (a < 0 || b < 0 || product > kInt64Max) return false;
  *out = static_cast<int64_t>(product);
  return true;
}

// *out = a + b for non-negative operands; false where Rust's `checked_add` fails.
FMHA_HOST_DEVICE inline bool checked_add(int64_t a, int64_t b, int64_t* out) {
  if (a < 0 || b < 0 || a > kInt64Max - b) return false;
  *out = a + b;
  return true;
}

// workspace.rs `size_product`: a product of non-negative factors that must fit 64-bit `usize`, taken
// in the same order as the Rust call so that exactly the same inputs fail.
struct SizeProduct {
  uint64_t value = 1;
  bool fits = true;

  FMHA_HOST_DEVICE SizeProduct& times(int64_t factor) {
    const unsigned __int128 product = static_cast<unsigned __int128>(value) * static_cast<uint64_t>(factor);
    if (factor < 0 || product > kUint64Max) fits = false;
    if (fits) value = static_cast<uint64_t>(product);
    return *this;
  }
};

// ---------------------------------------------------------------------------------------------------
// Stores. The region is written in 32-bit words only: one store type for every byte (no
// strict-aliasing questions between the zero fill and the fields), natural alignment (sections are
// 16-byte aligned, fields 4- or 8-byte aligned inside them), little-endian like Rust's `to_le_bytes`.

FMHA_HOST_DEVICE inline void store_u32(uint8_t* region, int64_t at, uint32_t value) {
  *reinterpret_cast<uint32_t*>(region + at) = value;
}

FMHA_HOST_DEVICE inline void store_u64(uint8_t* region, int64_t at, uint64_t value) {
  store_u32(region, at, static_cast<uint32_t>(value));
  store_u32(region, at + 4, static_cast<uint32_t>(value >> 32));
}

FMHA_HOST_DEVICE inline void store_i32(uint8_t* region, int64_t at, int32_t value) {
  store_u32(region, at, static_cast<uint32_t>(value));
}

FMHA_HOST_DEVICE inline void store_i64(uint8_t* region, int64_t at, int64_t value) {
  store_u64(region, at, static_cast<uint64_t>(value));
}

FMHA_HOST_DEVICE inline bool is_aligned(const uint8_t* region) {
  return reinterpret_cast<uintptr_t>(region) % kSectionAlignment == 0;
}

// Sets `bytes` bytes of the region to zero. An aligned region (every valid one) is cleared a word at a
// time, which the GPU compiler merges into 16-byte stores; a misaligned one, only ever cleared on the
// failure path, byte by byte (char stores may alias the words).
FMHA_HOST_DEVICE inline void zero_region(uint8_t* region, int64_t bytes) {
  if (is_aligned(region) && bytes % 4 == 0) {
    uint32_t* words = static_cast<uint32_t*>(__builtin_assume_aligned(region, kSectionAlignment));
    for (int64_t i = 0; i < bytes / 4; ++i) words[i] = 0;
  } else {
    for (int64_t i = 0; i < bytes; ++i) region[i] = 0;
  }
}

// ---------------------------------------------------------------------------------------------------
// Validation.

FMHA_HOST_DEVICE inline bool in_range(int64_t v, int64_t lo, int64_t hi) { return lo <= v && v <= hi; }

// Whether the WorkspaceParams fields are in the ranges `WorkspaceLayout::new` accepts.
FMHA_HOST_DEVICE inline bool params_in_range(const fmha_prepare_params& p) {
  return in_range(p.group_mode, 0, 1) && in_range(p.deterministic, 0, 1) && in_range(p.remap, 0, 1) &&
         in_range(p.ordered_dq, 0, 1) && in_range(p.batch, 0, kInt32Max) && in_range(p.nhead_q, 1, kInt32Max) &&
         in_range(p.nhead_k, 1, kInt32Max) &&
         in_range(p.row_elements, 1, kInt32Max) && in_range(p.seqlen_q, 0, kInt32Max) &&
         in_range(p.seqlen_k, 0, kInt32Max) && in_range(p.max_seqlen_k, 0, kInt32Max) &&
         in_range(p.m0, 1, kInt32Max) && in_range(p.n0, 1, kInt32Max) && in_range(p.num_cus, 1, kInt32Max);
}

// WorkspaceParams::split_slots: deterministic dQ in the persistent schedule's split slots (not ordered).
FMHA_HOST_DEVICE inline bool split_slots(const fmha_prepare_params& p) {
  return p.deterministic != 0 && p.ordered_dq == 0;
}

// Whether the group-mode persistent table (offsets, cu_state, batch_state) is present.
FMHA_HOST_DEVICE inline bool group_persistent(const fmha_prepare_params& p) {
  return p.group_mode != 0 && split_slots(p);
}

// Whether a section holds `count` elements of `elem_bytes` bytes, starts aligned at or after `*end` and
// ends inside the region; advances `*end` past it. (The host computed the layout; the device does not
// recompute it, only makes sure that trusting it never writes outside the region.)
FMHA_HOST_DEVICE inline bool section_fits(int64_t offset, int64_t count, int64_t want_count, int64_t elem_bytes,
                                          int64_t metadata_bytes, int64_t* end) {
  if (count != want_count || offset % kSectionAlignment != 0 || offset < *end) return false;
  if (count > (metadata_bytes - offset) / elem_bytes) return false;
  *end = offset + count * elem_bytes;
  return true;
}

// Whether the layout fields describe this mode's sections, in order, after the header, inside the region.
FMHA_HOST_DEVICE inline bool layout_fits(const fmha_prepare_params& p) {
  const bool g = group_persistent(p);
  const int64_t bytes = p.metadata_bytes;
  int64_t end = kHeaderBytes;
  return bytes >= kHeaderBytes && bytes % kSectionAlignment == 0 &&
         section_fits(p.nsplits_offset, p.nsplits_count, g ? p.batch : 1, kNsplitsBytes, bytes, &end) &&
         section_fits(p.dq_acc_offsets_offset, p.dq_acc_offsets_count, g ? p.batch + 1 : 0, kOffsetBytes, bytes,
                      &end) &&
         section_fits(p.cu_state_offset, p.cu_state_count, g ? p.num_cus : 0, kCuStateBytes, bytes, &end) &&
         section_fits(p.batch_state_offset, p.batch_state_count, g ? p.batch : 0, kBatchStateBytes, bytes, &end);
}

// `check_seqstart` and `check_group_seqstarts` for one array of batch + 1 entries (device memory has no
// length: holding batch + 1 entries is the caller's contract): starts at 0, never decreases, ends at
// the total physical length, and no batch is longer than `max_len`.
FMHA_HOST_DEVICE inline bool seqstart_valid(const int32_t* s, int64_t batch, int64_t total, int64_t max_len) {
  if (s[0] != 0) return false;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = int64_t(s[b + 1]) - int64_t(s[b]);
    if (len < 0 || len > max_len) return false;
  }
  return int64_t(s[batch]) <= total;  // the launcher's total is a bound (workspace.rs)
}

// The seqstarts this mode takes (prepare_metadata's match): both in group mode, valid for the params;
// neither in batch mode.
FMHA_HOST_DEVICE inline int32_t check_seqstarts(const fmha_prepare_params& p, const int32_t* q, const int32_t* k) {
  if (p.group_mode == 0) return q == nullptr && k == nullptr ? kOk : kInvalidArgument;
  if (q == nullptr || k == nullptr) return kNullPointer;
  const bool valid = seqstart_valid(q, p.batch, p.seqlen_q, kInt64Max) &&
                     seqstart_valid(k, p.batch, p.seqlen_k, p.max_seqlen_k);
  return valid ? kOk : kInvalidArgument;
}

// ---------------------------------------------------------------------------------------------------
// Header.

// workspace.rs `absorb`: mix((h ^ word) + golden ratio), mix = the splitmix64 finaliser.
FMHA_HOST_DEVICE inline uint64_t absorb(uint64_t h, uint64_t word) {
  uint64_t z = (h ^ word) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Absorbs one seqstart array as `fingerprint` does: all ones when absent, else its length (batch + 1)
// and every entry sign-extended to 64 bits.
FMHA_HOST_DEVICE inline uint64_t absorb_seqstart(uint64_t h, const int32_t* s, int64_t batch) {
  if (s == nullptr) return absorb(h, kUint64Max);
  h = absorb(h, static_cast<uint64_t>(batch + 1));
  for (int64_t i = 0; i <= batch; ++i) h = absorb(h, static_cast<uint64_t>(int64_t(s[i])));
  return h;
}

// workspace.rs `fingerprint_of_params`: the format version, then every WorkspaceParams field in
// declaration order (fmha_bwd_params::fingerprint_params, into which the kernels absorb the seqstarts).
FMHA_HOST_DEVICE inline uint64_t fingerprint_of_params(const fmha_prepare_params& p) {
  uint64_t h = kFormatVersion;
  h = absorb(h, static_cast<uint64_t>(p.group_mode));
  h = absorb(h, static_cast<uint64_t>(p.deterministic));
  h = absorb(h, static_cast<uint64_t>(p.batch));
  h = absorb(h, static_cast<uint64_t>(p.nhead_k));
  h = absorb(h, static_cast<uint64_t>(p.row_elements));
  h = absorb(h, static_cast<uint64_t>(p.seqlen_q));
  h = absorb(h, static_cast<uint64_t>(p.seqlen_k));
  h = absorb(h, static_cast<uint64_t>(p.max_seqlen_k));
  h = absorb(h, static_cast<uint64_t>(p.m0));
  h = absorb(h, static_cast<uint64_t>(p.n0));
  h = absorb(h, static_cast<uint64_t>(p.num_cus));
  h = absorb(h, static_cast<uint64_t>(p.remap));
  h = absorb(h, static_cast<uint64_t>(p.masked));
  h = absorb(h, static_cast<uint64_t>(p.ordered_dq));
  return absorb(h, static_cast<uint64_t>(p.nhead_q));
}

// workspace.rs `fingerprint`: the params, then the two seqstart arrays.
FMHA_HOST_DEVICE inline uint64_t fingerprint(const fmha_prepare_params& p, const int32_t* q, const int32_t* k) {
  return absorb_seqstart(absorb_seqstart(fingerprint_of_params(p), q, p.batch), k, p.batch);
}

FMHA_HOST_DEVICE inline void write_header(uint8_t* region, uint64_t fingerprint) {
  store_u32(region, 0, kMagic);
  store_u32(region, 4, kFormatVersion);
  store_u64(region, 8, fingerprint);
}

// ---------------------------------------------------------------------------------------------------
// Batch mode (§4.1).

// `BatchPersistent::new`: `batch * nhead_k` kv heads of `ceil(seqlen_k / n0)` K tiles (jobs) cut into
// `num_cus` contiguous runs of `jobs_per_worker`, and the split slots per (batch, head) that needs.
struct BatchPersistent {
  int64_t jobs_per_head, jobs_per_worker, total_jobs, nsplits;
};

// False where the Rust constructor fails (the job count overflows).
FMHA_HOST_DEVICE inline bool batch_persistent(const fmha_prepare_params& p, BatchPersistent* plan) {
  const int64_t jobs_per_head = ceil_div(p.seqlen_k, p.n0);
  int64_t heads = 0, total = 0;
  if (!checked_mul(p.batch, p.nhead_k, &heads) || !checked_mul(heads, jobs_per_head, &total)) return false;
  const int64_t jobs_per_worker = ceil_div(total, p.num_cus);
  plan->jobs_per_head = jobs_per_head;
  plan->jobs_per_worker = jobs_per_worker;
  plan->total_jobs = total;
  if (total == 0) {
    plan->nsplits = 1;  // no jobs; CK would divide by zero here
    return true;
  }
  const int64_t heads_per_worker = div_i64(jobs_per_worker, jobs_per_head);
  const int64_t workers_per_head = div_i64(jobs_per_head, jobs_per_worker);
  if (workers_per_head * jobs_per_worker == jobs_per_head) {
    plan->nsplits = workers_per_head;
  } else if (heads_per_worker * jobs_per_head == jobs_per_worker) {
    plan->nsplits = 1;
  } else {
    plan->nsplits = 1 + ceil_div(jobs_per_head - 1, jobs_per_worker);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Group mode, deterministic: the persistent table (§4.2).

// The group table's records (launch.h, generated from src/schedule/records.rs).
using CuState = fmha_cu_state;
using BatchState = fmha_batch_state;
static_assert(sizeof(CuState) == kCuStateBytes && sizeof(BatchState) == kBatchStateBytes, "record sizes");

FMHA_HOST_DEVICE inline void write_nsplits(uint8_t* region, const fmha_prepare_params& p, int64_t b, int32_t v) {
  store_i32(region, p.nsplits_offset + kNsplitsBytes * b, v);
}

FMHA_HOST_DEVICE inline void write_dq_acc_offset(uint8_t* region, const fmha_prepare_params& p, int64_t b,
                                                 int64_t v) {
  store_i64(region, p.dq_acc_offsets_offset + kOffsetBytes * b, v);
}

FMHA_HOST_DEVICE inline void write_cu_state(uint8_t* region, const fmha_prepare_params& p, int64_t index,
                                            const CuState& s) {
  const int64_t at = p.cu_state_offset + kCuStateBytes * index;
  store_i64(region, at, s.w_lo);
  store_i64(region, at + 8, s.w_hi);
  store_i32(region, at + 16, s.ibatch);
  store_i32(region, at + 20, s.isplit);
  store_i32(region, at + 24, s.head_start);
  store_i32(region, at + 28, s.c_start);
}

// Closes workgroup `index`'s range at `w_hi` (its other fields stay as written).
FMHA_HOST_DEVICE inline void write_cu_w_hi(uint8_t* region, const fmha_prepare_params& p, int64_t index,
                                           int64_t w_hi) {
  store_i64(region, p.cu_state_offset + kCuStateBytes * index + 8, w_hi);
}

// The fourth word (`pad`) stays zero.
FMHA_HOST_DEVICE inline void write_batch_state(uint8_t* region, const fmha_prepare_params& p, int64_t b,
                                               const BatchState& s) {
  const int64_t at = p.batch_state_offset + kBatchStateBytes * b;
  store_i32(region, at, s.sq);
  store_i32(region, at + 4, s.nc);
  store_i32(region, at + 8, s.nsplits);
}

// `XcdRemap::logical_to_output`: the workgroup id that runs logical CU `l` of `ncu`. With 8 XCDs the
// hardware sends workgroup o to XCD o mod 8; the first `tall` XCDs get `ids` consecutive logical CUs,
// the others one fewer, so each XCD walks a contiguous range (one batch's K/V stays in one L2).
FMHA_HOST_DEVICE inline int64_t logical_to_output(int64_t l, int64_t ncu, bool xcd8) {
  if (!xcd8) return l;
  const int64_t ids = ceil_div(ncu, 8);
  const int64_t tall = ncu % 8 == 0 ? 8 : ncu % 8;
  int64_t x = 0, lane = 0;
  if (l < tall * ids) {
    x = div_i64(l, ids);
    lane = l - x * ids;
  } else {
    const int64_t short_ids = max_i64(ids - 1, 1);
    const int64_t r = l - tall * ids;
    const int64_t step = div_i64(r, short_ids);
    x = tall + step;
    lane = r - step * short_ids;
  }
  return lane * 8 + x;
}

// Writes each logical CU's state at its workgroup id, in logical order, and closes the previous CU's
// range where the next one starts (`emit` of build_group_table): the ranges chain and partition the
// work positions.
struct CuStateWriter {
  uint8_t* region;
  const fmha_prepare_params& p;
  int64_t prev = -1;  // workgroup id of the last CU written; -1 before the first

  // False if the remap leaves the grid (it is a bijection of 0..num_cus; checked because a stray store
  // on the device would corrupt memory silently).
  FMHA_HOST_DEVICE bool emit(int64_t logical, const CuState& state) {
    const int64_t out = logical_to_output(logical, p.num_cus, p.remap != 0);
    if (out < 0 || out >= p.num_cus) return false;
    write_cu_state(region, p, out, state);
    if (prev >= 0) write_cu_w_hi(region, p, prev, state.w_lo);
    prev = out;
    return true;
  }

  // The last CU's range ends at the total work.
  FMHA_HOST_DEVICE void close(int64_t total_work) {
    if (prev >= 0) write_cu_w_hi(region, p, prev, total_work);
  }
};

// Work shape of batch b (`BatchWork`).
struct BatchWork {
  int64_t sq;   // physical q rows (dq_acc rows)
  int64_t sqw;  // chunk weight (schedule.rs `chunk_weight`)
  int64_t nc;   // K tiles per head, ceil(sk / n0)
  int64_t hw;   // work per head, nc * sqw
};

// schedule.rs `chunk_weight`: the q rows a chunk keeps (unmasked all; masked, a bottom-right causal
// mask's average over the head's K tiles, in 2^-20 fixed point where the pair count could overflow),
// rounded up to m0, plus m0 for the unit's own cost; m0 without q rows.
FMHA_HOST_DEVICE inline int64_t chunk_weight(int64_t sq, int64_t sk, int64_t nc, int64_t m0, int64_t n0,
                                             bool masked) {
  if (sq == 0) return m0;
  int64_t kept = sq;
  if (masked && nc != 0) {
    if (sq > sk) {
      kept = ceil_div(sk * (sk + 1) / 2, nc * n0);
    } else {
      const int64_t fraction = div_i64((2 * sk - sq + 1) << 20, 2 * nc * n0);
      kept = (sq * fraction + (int64_t(1) << 20) - 1) >> 20;
    }
  }
  return round_up(max_i64(kept, 1), m0) + m0;
}

// `batch_work`; false where Rust fails: the weight must fit the 32-bit table.
FMHA_HOST_DEVICE inline bool batch_work(const int32_t* q, const int32_t* k, int64_t b, const fmha_prepare_params& p,
                                        BatchWork* w) {
  w->sq = int64_t(q[b + 1]) - int64_t(q[b]);
  const int64_t sk = int64_t(k[b + 1]) - int64_t(k[b]);
  w->nc = ceil_div(sk, p.n0);
  w->sqw = chunk_weight(w->sq, sk, w->nc, p.m0, p.n0, p.masked != 0);
  w->hw = w->nc * w->sqw;
  return w->sqw <= kInt32Max;
}

// No K in any batch: no units and no dq_acc; every workgroup is idle (ibatch = batch).
FMHA_HOST_DEVICE inline void write_no_keys_table(uint8_t* region, const fmha_prepare_params& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    write_nsplits(region, p, b, 1);
    write_dq_acc_offset(region, p, b, 0);
    write_batch_state(region, p, b, BatchState{0, 0, 1, 0});
  }
  write_dq_acc_offset(region, p, p.batch, 0);
  for (int64_t c = 0; c < p.num_cus; ++c) {
    write_cu_state(region, p, c, CuState{0, 0, static_cast<int32_t>(p.batch), 0, 0, 0});
  }
}

// Total work `sum_b nhead_k * nc_b * sqw_b`; false where Rust fails (a weight or the sum overflows).
FMHA_HOST_DEVICE inline bool total_work(const int32_t* q, const int32_t* k, const fmha_prepare_params& p,
                                        int64_t* total) {
  *total = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    BatchWork w;
    int64_t batch_total = 0;
    if (!batch_work(q, k, b, p, &w) || !checked_mul(p.nhead_k, w.hw, &batch_total) ||
        !checked_add(*total, batch_total, total)) {
      return false;
    }
  }
  return true;
}

// The state of logical CU `c`, whose raw start `c * target` lies in batch b (work base `pb`, hw > 0):
// it starts at the first whole chunk at or after its raw start; a start inside a head at raw offset
// wc > 0 uses split ceil(wc / max(sqw, target)), clamped to nc - 1 (keeps ceil(max_seqlen_k / n0) a
// valid bound on nsplits).
FMHA_HOST_DEVICE inline CuState cu_start(int64_t c, int64_t target, int64_t b, int64_t pb, const BatchWork& w) {
  const int64_t wl = c * target;
  const int64_t head = max_i64(div_i64(wl - pb, w.hw), 0);
  const int64_t wc = max_i64(wl - (pb + head * w.hw), 0);
  int64_t c0 = 0, isplit = 0;
  if (wc > 0) {
    c0 = ceil_div(wc, w.sqw);
    isplit = min_i64(ceil_div(wc, max_i64(w.sqw, target)), max_i64(w.nc - 1, 0));
  }
  return CuState{pb + head * w.hw + c0 * w.sqw,
                 0,  // w_hi: set when the next CU is written, or by close()
                 static_cast<int32_t>(b), static_cast<int32_t>(isplit), static_cast<int32_t>(head),
                 static_cast<int32_t>(c0)};
}

// `build_group_table` writing straight into the region; false where Rust fails. Seqstarts are valid.
FMHA_HOST_DEVICE inline bool write_group_table(uint8_t* region, const fmha_prepare_params& p, const int32_t* q,
                                               const int32_t* k) {
  if (k[p.batch] == 0) {
    write_no_keys_table(region, p);
    return true;
  }
  int64_t total_w = 0;
  if (!total_work(q, k, p, &total_w)) return false;
  // Some batch has keys, so total_w >= nhead_k * m0 >= 1.
  const int64_t target = ceil_div(total_w, p.num_cus);

  CuStateWriter cus{region, p};
  int64_t cu_lo = 0, pb = 0, offset = 0;
  write_dq_acc_offset(region, p, 0, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    BatchWork w;
    batch_work(q, k, b, p, &w);  // cannot fail: total_work checked every batch
    const int64_t pb_next = pb + p.nhead_k * w.hw;
    const int64_t cu_hi = min_i64(p.num_cus, ceil_div(pb_next, target));
    int64_t ns = 1;
    // The logical CUs whose raw start lies in this batch; none when it has no work, so hw > 0 inside.
    for (int64_t c = cu_lo; c < cu_hi; ++c) {
      const CuState st = cu_start(c, target, b, pb, w);
      // A CU whose start rounds past the head's last chunk runs nothing in this head.
      if (st.c_start < w.nc) ns = max_i64(ns, int64_t(st.isplit) + 1);
      if (!cus.emit(c, st)) return false;
    }
    cu_lo = cu_hi;
    write_nsplits(region, p, b, static_cast<int32_t>(ns));
    write_batch_state(region, p, b,
                      BatchState{static_cast<int32_t>(w.sqw), static_cast<int32_t>(w.nc), static_cast<int32_t>(ns), 0});
    // dq_acc holds the physical rows (sq), not the rounded work weight.
    int64_t block = 0;
    if (!checked_mul(p.nhead_k, ns, &block) || !checked_mul(block, w.sq, &block) ||
        !checked_mul(block, p.row_elements, &block) || !checked_add(offset, block, &offset)) {
      return false;
    }
    write_dq_acc_offset(region, p, b + 1, offset);
    pb = pb_next;
  }
  // Idle workgroups: an empty range at the end, ibatch = batch.
  for (int64_t c = cu_lo; c < p.num_cus; ++c) {
    if (!cus.emit(c, CuState{total_w, total_w, static_cast<int32_t>(p.batch), 0, 0, 0})) return false;
  }
  cus.close(total_w);
  int64_t dq_acc_bytes = 0;
  return checked_mul(offset, 4, &dq_acc_bytes);
}

// ---------------------------------------------------------------------------------------------------
// The whole region.

// The sections after the header, for each mode; false where Rust fails (including its dq_acc size
// checks, which in batch mode cannot fail for params of a valid layout but are kept for parity).
FMHA_HOST_DEVICE inline bool write_tables(uint8_t* region, const fmha_prepare_params& p, const int32_t* q,
                                          const int32_t* k) {
  if (group_persistent(p)) return write_group_table(region, p, q, k);
  if (p.group_mode != 0) {
    write_nsplits(region, p, 0, 1);
    return SizeProduct().times(4).times(p.nhead_k).times(q[p.batch]).times(p.row_elements).fits;
  }
  BatchPersistent plan = {0, 0, 0, 1};
  if (split_slots(p) && !batch_persistent(p, &plan)) return false;
  const int64_t splits = plan.nsplits;
  write_nsplits(region, p, 0, static_cast<int32_t>(splits));
  return SizeProduct().times(4).times(p.batch).times(p.nhead_k).times(splits).times(p.seqlen_q).times(p.row_elements).fits;
}

// Writes the metadata region `[region, region + p.metadata_bytes)`: header, sections, zeros everywhere
// else, byte for byte what `workspace::prepare_metadata` writes. `q`/`k` are the `[batch + 1]` physical
// sequence starts in group mode and null in batch mode.
//
// Returns kOk, or the status of the error the Rust routine reports for the same inputs; the region is
// then all zeros. Params that no valid layout produces (kInvalidArgument) leave it untouched: their
// region size cannot be trusted.
FMHA_HOST_DEVICE inline int32_t prepare_metadata(uint8_t* region, const int32_t* q, const int32_t* k,
                                                 const fmha_prepare_params& p) {
  if (region == nullptr) return kNullPointer;
  if (!params_in_range(p) || !layout_fits(p)) return kInvalidArgument;
  int32_t status = is_aligned(region) ? check_seqstarts(p, q, k) : kInvalidArgument;
  if (status == kOk) {
    zero_region(region, p.metadata_bytes);
    write_header(region, fingerprint(p, q, k));
    if (!write_tables(region, p, q, k)) status = kInvalidArgument;
  }
  if (status != kOk) zero_region(region, p.metadata_bytes);
  return status;
}

}  // namespace prepare
}  // namespace fmha

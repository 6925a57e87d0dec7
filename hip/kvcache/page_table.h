// A kv-cache call's sequences as every kernel reads them (spec/inference.md §1.4–§1.8): the query
// rows, the KV length and where the page ids start, and the page of a token. The C++ twin of
// `src/problem/paged.rs` (`PageTable::sequence`, `locate`, `check_pages`, `resolve_sequences`): the
// tests compare the first fault it finds with the Rust one on random tables (launch/kvcache_prepare_tests.rs).
//
// Device values are never trusted: every value read is clamped into the range that keeps addresses
// inside the buffers (the kernels use the clamped values), and the first rule broken is reported as a
// fault with the field, the value and the bound, in the order the Rust code checks them (the prepare
// records it).
#pragma once

#include <stdint.h>

#include "arch/registers.h"
#include "launch.h"

namespace fmha {
namespace kvcache {

// `problem::paged::KvField`.
enum Field : int32_t {
  kNoFault = 0,
  kSeqstartQ = 1,
  kSeqlenK = 2,
  kCacheBatchIdx = 3,
  kKvIndptr = 4,
  kLastPageLen = 5,
  kBlockTable = 6,
  kPageIndices = 7,
  kMaxSeqlenQ = 8,
  kTotalQ = 9,
  kMaxSeqlenK = 10,
};

// `FMHA_KV_*`.
enum TableKind : int32_t { kKindContiguous = 0, kKindBlockTable = 1, kKindPageCsr = 2 };

struct Fault {
  int32_t field;  // kNoFault: none
  int64_t value, bound;
};

// One sequence, clamped: its query rows (group mode: from q_start in q/o), its KV length, the table
// index of its logical page 0 (CONTIGUOUS: the slot) and its last logical page.
struct Sequence {
  int64_t q_start, sq, kv_len, first, last_page;
};

FMHA_HOST_DEVICE inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Records the first broken rule: `fault` keeps the earliest.
FMHA_HOST_DEVICE inline void require(bool condition, Fault& fault, int32_t field, int64_t value, int64_t bound) {
  if (!condition && fault.field == kNoFault) {
    fault.field = field;
    fault.value = value;
    fault.bound = bound;
  }
}

// Sequence `b` of the call, every value clamped, with its first fault (page ids not included: see
// check_pages).
FMHA_HOST_DEVICE inline Sequence resolve(const fmha_kvcache_params& p, int32_t b, Fault& fault) {
  Sequence s;
  const int64_t page = p.page_size;
  if (p.group_mode != 0) {
    const int32_t* starts = reinterpret_cast<const int32_t*>(p.seqstart_q);
    const int64_t total = p.seqlen_q, start = starts[b], end = starts[b + 1];
    require(start >= 0 && start <= end, fault, kSeqstartQ, start < 0 ? start : end, total);
    require(end <= total, fault, kTotalQ, end, total);
    s.q_start = clamp64(start, 0, total);
    s.sq = clamp64(end, s.q_start, total) - s.q_start;
  } else {
    s.q_start = 0;
    s.sq = p.seqlen_q;
  }
  require(s.sq <= p.max_seqlen_q, fault, kMaxSeqlenQ, s.sq, p.max_seqlen_q);
  s.sq = s.sq < p.max_seqlen_q ? s.sq : p.max_seqlen_q;

  int64_t len = 0;
  if (p.table_kind == kKindContiguous || p.table_kind == kKindBlockTable) {
    const int64_t cap = p.table_kind == kKindContiguous ? page : static_cast<int64_t>(p.max_pages_per_seq) * page;
    const int64_t raw = reinterpret_cast<const int32_t*>(p.seqlen_k)[b];
    require(raw >= 0 && raw <= cap, fault, kSeqlenK, raw, cap);
    len = clamp64(raw, 0, cap);
    if (p.table_kind == kKindContiguous) {
      const int32_t* slots = reinterpret_cast<const int32_t*>(p.cache_batch_idx);
      const int64_t slot = slots != nullptr ? slots[b] : b;
      require(slot >= 0 && slot < p.num_pages, fault, kCacheBatchIdx, slot, p.num_pages);
      s.first = clamp64(slot, 0, p.num_pages - 1);
    } else {
      s.first = b * p.block_table_stride;
    }
  } else {
    const int32_t* indptr = reinterpret_cast<const int32_t*>(p.kv_indptr);
    const int64_t total = p.num_page_indices, start = indptr[b], end = indptr[b + 1];
    require(start >= 0 && start <= end && end <= total, fault, kKvIndptr, start < 0 ? start : end, total);
    s.first = clamp64(start, 0, total);
    const int64_t pages = clamp64(end, s.first, total) - s.first;
    if (pages > 0) {
      const int32_t* lasts = reinterpret_cast<const int32_t*>(p.last_page_len);
      const int64_t last = lasts != nullptr ? lasts[b] : page;
      require(last >= 1 && last <= page, fault, kLastPageLen, last, page);
      len = (pages - 1) * page + clamp64(last, 1, page);
    }
  }
  require(len <= p.max_seqlen_k, fault, kMaxSeqlenK, len, p.max_seqlen_k);
  s.kv_len = len < p.max_seqlen_k ? len : p.max_seqlen_k;
  s.last_page = s.kv_len > 0 ? (s.kv_len - 1) / page : 0;
  return s;
}

// What a page lookup needs, copied out of the parameter block (kernels keep it in registers).
struct PageLookup {
  const int32_t* table;  // BLOCK_TABLE: block_table; PAGE_CSR: page_indices; CONTIGUOUS: none
  int32_t kind, num_pages;

  FMHA_HOST_DEVICE static PageLookup of(const fmha_kvcache_params& p) {
    PageLookup l;
    l.table = reinterpret_cast<const int32_t*>(p.table_kind == kKindBlockTable ? p.block_table : p.page_indices);
    l.kind = p.table_kind;
    l.num_pages = p.num_pages;
    return l;
  }

  struct DirectLoad {
    FMHA_HOST_DEVICE int32_t operator()(const int32_t* entry) const { return *entry; }
  };

  // The physical page of logical page `t` of a non-empty sequence: the table index is clamped to the
  // sequence's last page (entries past it are never read: CK's AICK-1171), the id to the pool.
  // `load(const int32_t*)` reads the entry (the AMD kernels: a global load, which their CPU emulation
  // checks against the entries the test allows).
  template <typename Load = DirectLoad>
  FMHA_HOST_DEVICE int64_t page_id(const Sequence& s, int64_t t, Load load = Load()) const {
    if (kind == kKindContiguous) return s.first;
    return clamp64(load(table + s.first + (t < s.last_page ? t : s.last_page)), 0, num_pages - 1);
  }
};

// The prepare's scan of every page id a sequence uses (`traits.check_tables`).
FMHA_HOST_DEVICE inline void check_pages(const fmha_kvcache_params& p, const Sequence& s, Fault& fault) {
  if (p.table_kind == kKindContiguous || s.kv_len == 0) return;
  const PageLookup lookup = PageLookup::of(p);
  const int32_t field = p.table_kind == kKindBlockTable ? kBlockTable : kPageIndices;
  for (int64_t t = 0; t <= s.last_page && fault.field == kNoFault; ++t) {
    const int64_t id = lookup.table[s.first + t];
    require(id >= 0 && id < p.num_pages, fault, field, id, p.num_pages);
  }
}

// Sequence `b` (clamped, into `s`) and its first fault, as the prepare checks it
// (`problem::paged::resolve_sequences`).
FMHA_HOST_DEVICE inline Fault sequence_fault(const fmha_kvcache_params& p, int32_t b, Sequence& s) {
  Fault fault = {kNoFault, 0, 0};
  s = resolve(p, b, fault);
  if (fault.field == kNoFault && p.check_tables != 0 && s.sq > 0) check_pages(p, s, fault);
  return fault;
}

// The record of the first fault in sequence order (or none).
FMHA_HOST_DEVICE inline fmha_kv_cache_fault record_of(int32_t b, const Fault& f) {
  fmha_kv_cache_fault r;
  r.magic = 0x4B564350u;  // KVCACHE_PREPARED
  r.field = f.field;
  r.sequence = f.field == kNoFault ? 0 : b;
  r.value = f.field == kNoFault ? 0 : f.value;
  r.bound = f.field == kNoFault ? 0 : f.bound;
  return r;
}

}  // namespace kvcache
}  // namespace fmha

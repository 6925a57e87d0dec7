package fmha

/*
#include <stdint.h>
#include <fmha.h>

static fmha_status go_fmha_kvcache_fwd(const fmha_kvcache_traits *traits, const fmha_kvcache_args *args,
                                       uintptr_t stream) {
    return fmha_kvcache_fwd(traits, args, (fmha_stream_t)stream);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// KVTableKind is how a sequence's tokens are found in the cache (FMHA_KV_*).
type KVTableKind int32

// The table kinds.
const (
	// KVContiguous: one slot (page) per sequence, flash-attn's k_cache [slots][capacity][heads][dim];
	// KVCacheArgs.SeqlenK holds the lengths, CacheBatchIdx optionally each sequence's slot.
	KVContiguous KVTableKind = C.FMHA_KV_CONTIGUOUS
	// KVBlockTable: vLLM's / FA3's [batch][MaxPagesPerSeq] page table and SeqlenK.
	KVBlockTable KVTableKind = C.FMHA_KV_BLOCK_TABLE
	// KVPageCSR: SGLang's / flashinfer's KVIndptr, PageIndices and LastPageLen.
	KVPageCSR KVTableKind = C.FMHA_KV_PAGE_CSR
)

func (k KVTableKind) String() string {
	switch k {
	case KVContiguous:
		return "contiguous"
	case KVBlockTable:
		return "block-table"
	case KVPageCSR:
		return "page-csr"
	}
	return fmt.Sprintf("KVTableKind(%d)", int32(k))
}

// KVLayout is the byte order of the K/V pools (FMHA_KV_LAYOUT_*).
type KVLayout int32

// The pool layouts.
const (
	// KVLayoutStrided pools are addressed by page, token and head strides (NHD and HND).
	KVLayoutStrided KVLayout = C.FMHA_KV_LAYOUT_STRIDED
	// KVLayoutVectorized is CK's / vLLM-ROCm's order with 16-byte vectors.
	KVLayoutVectorized KVLayout = C.FMHA_KV_LAYOUT_VECTORIZED
)

func (l KVLayout) String() string {
	switch l {
	case KVLayoutStrided:
		return "strided"
	case KVLayoutVectorized:
		return "vectorized"
	}
	return fmt.Sprintf("KVLayout(%d)", int32(l))
}

// KVScaleGranularity is how fp8 caches' K/V descales are given (FMHA_KV_SCALE_*).
type KVScaleGranularity int32

// The descale granularities.
const (
	// KVScaleTensor: per tensor, or per (sequence, kv head).
	KVScaleTensor KVScaleGranularity = C.FMHA_KV_SCALE_TENSOR
	// KVScalePage: per (physical page, kv head); paged tables only.
	KVScalePage KVScaleGranularity = C.FMHA_KV_SCALE_PAGE
)

func (g KVScaleGranularity) String() string {
	switch g {
	case KVScaleTensor:
		return "tensor"
	case KVScalePage:
		return "page"
	}
	return fmt.Sprintf("KVScaleGranularity(%d)", int32(g))
}

// KVCacheArgs is one attention forward of queries against a kv cache (prefill chunks, decode).
// Group (varlen) mode when SeqstartQ is set: Q and O are [total rows][HeadsQ][dim] by head and row
// strides, LSE [HeadsQ][rows]; batch mode: [Batch][HeadsQ][SeqlenQ][dim], LSE [Batch][HeadsQ][SeqlenQ].
// Strided pools are [NumPages][PageSize][HeadsK][dim] or [NumPages][HeadsK][PageSize][dim] by strides
// (the tensor's batch stride is the page stride, its row stride the token stride).
type KVCacheArgs struct {
	// DType is the type of Q and the cache: FP16, BF16, or an fp8 format; OutDType is O's type for
	// fp8 inputs (BF16, the default when left 0).
	DType, OutDType  DType
	HdimQ, HdimV     int
	HeadsQ, HeadsK   int
	Mask             Mask // none, or aligned to the bottom-right corner (each sequence's KV length)
	TableKind        KVTableKind
	Layout           KVLayout
	ScaleGranularity KVScaleGranularity
	// PageSize is the tokens per page, >= 1 (KVContiguous: the slot capacity).
	PageSize int

	// Bounds of the call. A zero MaxBatch takes Batch; zero MaxTotalQ and MaxSeqlenQ take SeqlenQ.
	MaxBatch, MaxTotalQ, MaxSeqlenQ, MaxSeqlenK int
	// MaxSplits bounds the split-KV chunks per sequence (1: never split, 0: the library's choice;
	// splitting needs a Workspace); KVSplitTokens > 0 fixes the chunk length.
	MaxSplits, KVSplitTokens int

	Q, K, V, O Tensor
	// LSE is optional: the zero Tensor skips it.
	LSE Tensor
	// SeqstartQ, [Batch+1] row offsets into Q and O, selects group mode.
	SeqstartQ *Buffer[int32]
	// Batch is the sequences of this call; SeqlenQ the rows of every sequence (batch mode) or of Q
	// (group mode); NumPages the pages (slots) in the pools.
	Batch, SeqlenQ, NumPages int
	// SeqlenK is the [Batch] KV lengths (KVContiguous, KVBlockTable).
	SeqlenK *Buffer[int32]
	// BlockTable is [Batch][BlockTableStride], its first MaxPagesPerSeq entries of a row used.
	BlockTable                       *Buffer[int32]
	MaxPagesPerSeq, BlockTableStride int
	// KVIndptr [Batch+1], PageIndices [NumPageIndices] and LastPageLen [Batch] (KVPageCSR).
	KVIndptr, PageIndices, LastPageLen *Buffer[int32]
	NumPageIndices                     int
	// CacheBatchIdx, optional, is each sequence's slot (KVContiguous).
	CacheBatchIdx *Buffer[int32]
	// Scale is the softmax scale; 0 selects 1/sqrt(HdimQ).
	Scale                        float32
	QDescale, KDescale, VDescale Descale
	// Workspace (KVCacheWorkspaceSize bytes) holds the split plan; without one the sequences run
	// unsplit.
	Workspace *Buffer[byte]
}

func (a *KVCacheArgs) traits(f *fields) C.fmha_kvcache_traits {
	maxBatch, maxTotalQ, maxSeqlenQ := a.MaxBatch, a.MaxTotalQ, a.MaxSeqlenQ
	if maxBatch == 0 {
		maxBatch = a.Batch
	}
	if maxTotalQ == 0 {
		maxTotalQ = a.SeqlenQ
	}
	if maxSeqlenQ == 0 {
		maxSeqlenQ = a.SeqlenQ
	}
	return C.fmha_kvcache_traits{
		struct_size:          C.size_t(unsafe.Sizeof(C.fmha_kvcache_traits{})),
		dtype:                C.int32_t(a.DType),
		o_dtype:              C.int32_t(outputDType(a.DType, a.OutDType)),
		hdim_q:               f.int32("hdim_q", a.HdimQ),
		hdim_v:               f.int32("hdim_v", a.HdimV),
		nhead_q:              f.int32("nhead_q", a.HeadsQ),
		nhead_k:              f.int32("nhead_k", a.HeadsK),
		is_group_mode:        flag(a.SeqstartQ != nil),
		mask_type:            C.int32_t(a.Mask.Type()),
		has_lse:              flag(a.LSE != (Tensor{})),
		kv_table_kind:        C.int32_t(a.TableKind),
		kv_layout:            C.int32_t(a.Layout),
		kv_scale_granularity: C.int32_t(a.ScaleGranularity),
		page_size:            f.int32("page_size", a.PageSize),
		batch:                f.int32("batch", maxBatch),
		total_q:              f.int32("total_q", maxTotalQ),
		max_seqlen_q:         f.int32("max_seqlen_q", maxSeqlenQ),
		max_seqlen_k:         f.int32("max_seqlen_k", a.MaxSeqlenK),
		max_splits:           f.int32("max_splits", a.MaxSplits),
		kv_split_tokens:      f.int32("kv_split_tokens", a.KVSplitTokens),
	}
}

// KVCacheWorkspaceSize is the workspace bytes KVCacheForward can use for calls within a's traits
// and bounds.
func KVCacheWorkspaceSize(a *KVCacheArgs) (int, error) {
	f := fields{op: "KVCacheWorkspaceSize"}
	if a == nil {
		return 0, invalidArgument(f.op, "args", "nil")
	}
	traits := a.traits(&f)
	if f.err != nil {
		return 0, f.err
	}
	var bytes C.size_t
	err := call("fmha_kvcache_workspace_size_upper_bound", func() C.fmha_status {
		return C.fmha_kvcache_workspace_size_upper_bound(&traits, &bytes)
	})
	return int(bytes), err
}

// KVCacheForward queues the attention on s (nil: the default stream) through a one-shot launcher
// and returns once queued. Bad device lengths or page ids are reported, naming the field, by the
// stream's next Synchronize on the host backend; a GPU clamps them.
func KVCacheForward(s *Stream, a *KVCacheArgs) error {
	f := fields{op: "KVCacheForward"}
	handle, err := s.native(f.op)
	if err != nil {
		return err
	}
	if a == nil {
		return invalidArgument(f.op, "args", "nil")
	}
	traits := a.traits(&f)
	size := a.DType.Size()
	args := C.fmha_kvcache_args{
		struct_size:        C.size_t(unsafe.Sizeof(C.fmha_kvcache_args{})),
		q:                  f.tensor("q", a.Q, size),
		k:                  f.tensor("k", a.K, size),
		v:                  f.tensor("v", a.V, size),
		o:                  f.tensor("o", a.O, outputDType(a.DType, a.OutDType).Size()),
		lse:                f.tensor("lse", a.LSE, 4),
		seqstart_q:         f.ints("seqstart_q", a.SeqstartQ),
		batch:              f.int32("batch", a.Batch),
		seqlen_q:           f.int32("seqlen_q", a.SeqlenQ),
		num_pages:          f.int32("num_pages", a.NumPages),
		max_pages_per_seq:  f.int32("max_pages_per_seq", a.MaxPagesPerSeq),
		num_page_indices:   f.int32("num_page_indices", a.NumPageIndices),
		seqlen_k:           f.ints("seqlen_k", a.SeqlenK),
		block_table:        f.ints("block_table", a.BlockTable),
		block_table_stride: C.int64_t(a.BlockTableStride),
		kv_indptr:          f.ints("kv_indptr", a.KVIndptr),
		page_indices:       f.ints("page_indices", a.PageIndices),
		last_page_len:      f.ints("last_page_len", a.LastPageLen),
		cache_batch_idx:    f.ints("cache_batch_idx", a.CacheBatchIdx),
		scale:              C.float(a.Scale),
		q_descale:          f.descale("q_descale", a.QDescale),
		k_descale:          f.descale("k_descale", a.KDescale),
		v_descale:          f.descale("v_descale", a.VDescale),
	}
	args.window_size_left, args.window_size_right = f.window(a.Mask)
	if a.Workspace != nil {
		args.workspace, err = a.Workspace.open(f.op)
		if err != nil {
			return err
		}
		args.workspace_size = C.size_t(a.Workspace.Len())
	}
	if f.err != nil {
		return f.err
	}
	return call("fmha_kvcache_fwd", func() C.fmha_status { return C.go_fmha_kvcache_fwd(&traits, &args, handle) })
}

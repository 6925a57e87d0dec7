package fmha

/*
#include <stdint.h>
#include <fmha.h>

static fmha_status go_fmha_merge_attention_states(const fmha_merge_args *args, uintptr_t stream) {
    return fmha_merge_attention_states(args, (fmha_stream_t)stream);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// LSEBase is the base of the logarithm of the LSEs a merge reads and writes (FMHA_LSE_*).
type LSEBase int32

// The LSE bases: fmha's operations write natural-log LSEs, flashinfer's are base 2.
const (
	LSENatural LSEBase = C.FMHA_LSE_NATURAL
	LSEBase2   LSEBase = C.FMHA_LSE_BASE2
)

func (b LSEBase) String() string {
	switch b {
	case LSENatural:
		return "natural"
	case LSEBase2:
		return "base2"
	}
	return fmt.Sprintf("LSEBase(%d)", int32(b))
}

// MergeArgs merges partial attention states: state s of (row r, head h) is (OIn[s][h][r][:],
// LSEIn[s][h][r]), with the state stride as the tensors' batch stride. Per (row, head), in fp32 and
// in state order: M = max LSE_s, w_s = exp(LSE_s - M), O = Σ w_s O_s / Σ w_s, LSE = M + log Σ w_s.
type MergeArgs struct {
	NumStates, NumRows, Heads, Hdim int
	// InDType and OutDType are FP32, BF16 or FP16: the types of OIn and OOut.
	InDType, OutDType DType
	LSEBase           LSEBase
	// OIn [states][heads][rows][Hdim] and LSEIn (fp32) [states][heads][rows] by strides.
	OIn, LSEIn Tensor
	// OOut [heads][rows][Hdim] and LSEOut (fp32, optional) [heads][rows] by head and row strides.
	OOut, LSEOut Tensor
}

// MergeAttentionStates queues the merge on s (nil: the default stream) and returns once queued.
func MergeAttentionStates(s *Stream, a *MergeArgs) error {
	f := fields{op: "MergeAttentionStates"}
	handle, err := s.native(f.op)
	if err != nil {
		return err
	}
	if a == nil {
		return invalidArgument(f.op, "args", "nil")
	}
	args := C.fmha_merge_args{
		struct_size: C.size_t(unsafe.Sizeof(C.fmha_merge_args{})),
		num_states:  f.int32("num_states", a.NumStates),
		num_rows:    f.int32("num_rows", a.NumRows),
		nhead:       f.int32("nhead", a.Heads),
		hdim:        f.int32("hdim", a.Hdim),
		in_dtype:    C.int32_t(a.InDType),
		out_dtype:   C.int32_t(a.OutDType),
		lse_base:    C.int32_t(a.LSEBase),
		o_in:        f.tensor("o_in", a.OIn, a.InDType.Size()),
		lse_in:      f.tensor("lse_in", a.LSEIn, 4),
		o_out:       f.tensor("o_out", a.OOut, a.OutDType.Size()),
		lse_out:     f.tensor("lse_out", a.LSEOut, 4),
	}
	if f.err != nil {
		return f.err
	}
	return call("fmha_merge_attention_states", func() C.fmha_status {
		return C.go_fmha_merge_attention_states(&args, handle)
	})
}

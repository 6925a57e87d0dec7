package fmha

/*
#include <stdint.h>
#include <fmha.h>

static fmha_status go_fmha_fwd(const fmha_fwd_traits *traits, const fmha_fwd_args *args, uintptr_t stream) {
    return fmha_fwd(traits, args, (fmha_stream_t)stream);
}
*/
import "C"

import "unsafe"

// Shape is the size of an attention problem.
type Shape struct {
	// Batch is the number of sequences.
	Batch int
	// SeqlenQ and SeqlenK are the rows of every sequence in batch mode; in varlen mode the total
	// physical rows of q and of k.
	SeqlenQ, SeqlenK int
	// MaxSeqlenQ and MaxSeqlenK bound one sequence's physical rows in varlen mode; in batch mode
	// they are 0 or SeqlenQ/SeqlenK.
	MaxSeqlenQ, MaxSeqlenK int
	// HeadsQ is a multiple of HeadsK (GQA/MQA).
	HeadsQ, HeadsK int
	HdimQ, HdimV   int
}

// Varlen describes a packed variable-length (group mode) batch by device int32 arrays: the tensors'
// rows of sequence b start at SeqstartQ[b] and SeqstartK[b] (batch strides are ignored).
type Varlen struct {
	// SeqstartQ and SeqstartK are the [Batch+1] physical row offsets.
	SeqstartQ, SeqstartK *Buffer[int32]
	// SeqlenQ and SeqlenK, optional, are [Batch] logical lengths (<= the physical ones).
	SeqlenQ, SeqlenK *Buffer[int32]
}

// ForwardArgs is one attention forward: O = softmax(Scale · Q Kᵀ + mask) V and its natural-log LSE.
//
// Tensors are [batch][head][row][column] views: Q [.][HeadsQ][SeqlenQ][HdimQ], K [.][HeadsK][SeqlenK]
// [HdimQ], V [.][HeadsK][SeqlenK][HdimV], O [.][HeadsQ][SeqlenQ][HdimV]; LSE is fp32
// [batch][HeadsQ][SeqlenQ] with row stride 1 (varlen: [HeadsQ][total rows]).
type ForwardArgs struct {
	// DType is the type of Q, K and V: FP16, BF16, or an fp8 format.
	DType DType
	// OutDType is O's type for fp8 inputs (BF16, the default when left 0); other inputs write O in
	// their own type.
	OutDType DType
	Shape
	// Varlen selects group mode; nil is batch mode.
	Varlen *Varlen
	Mask   Mask
	// Scale is the softmax scale; 0 selects 1/sqrt(HdimQ).
	Scale      float32
	Q, K, V, O Tensor
	// LSE is optional: the zero Tensor skips it.
	LSE Tensor
	// QDescale, KDescale and VDescale are the fp8 descales (per tensor or per sequence and kv head).
	QDescale, KDescale, VDescale Descale
}

// Forward queues the forward on s (nil: the default stream) and returns once it is queued.
func Forward(s *Stream, a *ForwardArgs) error {
	f := fields{op: "Forward"}
	handle, err := s.native(f.op)
	if err != nil {
		return err
	}
	if a == nil {
		return invalidArgument(f.op, "args", "nil")
	}
	outDType := outputDType(a.DType, a.OutDType)
	traits := C.fmha_fwd_traits{
		struct_size:   C.size_t(unsafe.Sizeof(C.fmha_fwd_traits{})),
		dtype:         C.int32_t(a.DType),
		hdim_q:        f.int32("hdim_q", a.HdimQ),
		hdim_v:        f.int32("hdim_v", a.HdimV),
		is_group_mode: flag(a.Varlen != nil),
		mask_type:     C.int32_t(a.Mask.Type()),
		bias_type:     C.FMHA_BIAS_NONE,
		o_dtype:       C.int32_t(outDType),
	}
	args := C.fmha_fwd_args{
		struct_size: C.size_t(unsafe.Sizeof(C.fmha_fwd_args{})),
		q:           f.tensor("q", a.Q, a.DType.Size()),
		k:           f.tensor("k", a.K, a.DType.Size()),
		v:           f.tensor("v", a.V, a.DType.Size()),
		o:           f.tensor("o", a.O, outDType.Size()),
		lse:         f.tensor("lse", a.LSE, 4),
		scale:       C.float(a.Scale),
		q_descale:   f.descale("q_descale", a.QDescale),
		k_descale:   f.descale("k_descale", a.KDescale),
		v_descale:   f.descale("v_descale", a.VDescale),
	}
	args.batch = f.int32("batch", a.Batch)
	args.seqlen_q = f.int32("seqlen_q", a.SeqlenQ)
	args.seqlen_k = f.int32("seqlen_k", a.SeqlenK)
	args.max_seqlen_q = f.int32("max_seqlen_q", a.MaxSeqlenQ)
	args.max_seqlen_k = f.int32("max_seqlen_k", a.MaxSeqlenK)
	args.nhead_q = f.int32("nhead_q", a.HeadsQ)
	args.nhead_k = f.int32("nhead_k", a.HeadsK)
	args.window_size_left, args.window_size_right = f.window(a.Mask)
	if a.Varlen != nil {
		args.seqstart_q = f.ints("seqstart_q", a.Varlen.SeqstartQ)
		args.seqstart_k = f.ints("seqstart_k", a.Varlen.SeqstartK)
		args.seqlen_q_ptr = f.ints("seqlen_q_ptr", a.Varlen.SeqlenQ)
		args.seqlen_k_ptr = f.ints("seqlen_k_ptr", a.Varlen.SeqlenK)
	}
	if f.err != nil {
		return f.err
	}
	return call("fmha_fwd", func() C.fmha_status { return C.go_fmha_fwd(&traits, &args, handle) })
}

// outputDType is O's type: fp8 inputs write OutDType (bf16 when unset), others their own type.
func outputDType(in, out DType) DType {
	switch {
	case in != FP8E4M3FN && in != FP8E4M3FNUZ:
		return in
	case out == 0: // 0 is FP16, which fp8 cannot write: an unset field
		return BF16
	}
	return out
}

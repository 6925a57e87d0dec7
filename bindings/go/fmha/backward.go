package fmha

/*
#include <stdint.h>
#include <fmha.h>

// Launcher and stream handles cross into Go as integers: they are checked ids, not addresses (see
// stream.go).
static fmha_status go_fmha_bwd_launcher_create(const fmha_bwd_traits *traits, uintptr_t *launcher) {
    fmha_bwd_launcher *l = NULL;
    fmha_status status = fmha_bwd_launcher_create(traits, &l);
    *launcher = (uintptr_t)l;
    return status;
}
static fmha_status go_fmha_bwd_launcher_destroy(uintptr_t launcher) {
    return fmha_bwd_launcher_destroy((fmha_bwd_launcher *)launcher);
}
static fmha_status go_fmha_bwd_launcher_workspace_size(uintptr_t launcher, size_t *bytes) {
    return fmha_bwd_launcher_workspace_size((const fmha_bwd_launcher *)launcher, bytes);
}
static fmha_status go_fmha_bwd_launcher_prepare_workspace(uintptr_t launcher, void *workspace, size_t bytes,
                                                          const int32_t *seqstart_q, const int32_t *seqstart_k) {
    return fmha_bwd_launcher_prepare_workspace((fmha_bwd_launcher *)launcher, workspace, bytes, seqstart_q,
                                               seqstart_k);
}
static fmha_status go_fmha_bwd_launcher_prepare_workspace_async(uintptr_t launcher, void *workspace, size_t bytes,
                                                                const int32_t *seqstart_q,
                                                                const int32_t *seqstart_k, uintptr_t stream) {
    return fmha_bwd_launcher_prepare_workspace_async((fmha_bwd_launcher *)launcher, workspace, bytes, seqstart_q,
                                                     seqstart_k, (fmha_stream_t)stream, NULL, FMHA_PREPARE_AUTO);
}
static fmha_status go_fmha_bwd_launcher_run(uintptr_t launcher, const fmha_bwd_args *args, uintptr_t stream) {
    return fmha_bwd_launcher_run((const fmha_bwd_launcher *)launcher, args, (fmha_stream_t)stream);
}
*/
import "C"

import (
	"sync"
	"unsafe"
)

// BackwardTraits select a backward kernel and size its workspace.
type BackwardTraits struct {
	// DType is FP16 or BF16.
	DType DType
	// Shape in batch mode is the problem's; in varlen mode SeqlenQ/SeqlenK bound the total physical
	// rows and MaxSeqlenQ/MaxSeqlenK one sequence's, so that one launcher serves every varlen batch
	// that fits.
	Shape
	// Varlen selects group mode.
	Varlen bool
	// Mask is the forward's mask.
	Mask Mask
	// Deterministic makes dQ bitwise reproducible (persistent schedule, ordered reduction).
	Deterministic bool
}

func (t *BackwardTraits) c(f *fields) C.fmha_bwd_traits {
	return C.fmha_bwd_traits{
		struct_size:      C.size_t(unsafe.Sizeof(C.fmha_bwd_traits{})),
		seqlen_q:         f.int32("seqlen_q", t.SeqlenQ),
		seqlen_k:         f.int32("seqlen_k", t.SeqlenK),
		batch:            f.int32("batch", t.Batch),
		max_seqlen_q:     f.int32("max_seqlen_q", t.MaxSeqlenQ),
		max_seqlen_k:     f.int32("max_seqlen_k", t.MaxSeqlenK),
		hdim_q:           f.int32("hdim_q", t.HdimQ),
		hdim_v:           f.int32("hdim_v", t.HdimV),
		nhead_q:          f.int32("nhead_q", t.HeadsQ),
		nhead_k:          f.int32("nhead_k", t.HeadsK),
		dtype:            C.int32_t(t.DType),
		is_group_mode:    flag(t.Varlen),
		mask_type:        C.int32_t(t.Mask.Type()),
		bias_type:        C.FMHA_BIAS_NONE,
		is_deterministic: flag(t.Deterministic),
	}
}

// BackwardWorkspaceSizeUpperBound is the workspace a launcher for t would need, without creating one.
func BackwardWorkspaceSizeUpperBound(t BackwardTraits) (int, error) {
	f := fields{op: "BackwardWorkspaceSizeUpperBound"}
	traits := t.c(&f)
	if f.err != nil {
		return 0, f.err
	}
	var bytes C.size_t
	err := call("fmha_bwd_workspace_size_upper_bound", func() C.fmha_status {
		return C.fmha_bwd_workspace_size_upper_bound(&traits, &bytes)
	})
	return int(bytes), err
}

// Backward is a backward launcher: the kernel and workspace layout chosen for its traits. Use it
// as NewBackward → WorkspaceSize → PrepareWorkspace → Run (any number of times) → Close. It is safe
// for concurrent use, but one workspace serves one run at a time.
type Backward struct {
	traits BackwardTraits
	mu     sync.Mutex
	handle C.uintptr_t // 0 once closed
}

// NewBackward creates a launcher for t on the current device.
func NewBackward(t BackwardTraits) (*Backward, error) {
	f := fields{op: "NewBackward"}
	traits := t.c(&f)
	if f.err != nil {
		return nil, f.err
	}
	var handle C.uintptr_t
	if err := call("fmha_bwd_launcher_create", func() C.fmha_status {
		return C.go_fmha_bwd_launcher_create(&traits, &handle)
	}); err != nil {
		return nil, err
	}
	return &Backward{traits: t, handle: handle}, nil
}

// Traits are the traits the launcher was created with.
func (b *Backward) Traits() BackwardTraits { return b.traits }

func (b *Backward) native(op string) (C.uintptr_t, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.handle == 0 {
		return 0, invalidArgument(op, "launcher", "closed")
	}
	return b.handle, nil
}

// WorkspaceSize is the bytes of workspace Run needs with this launcher.
func (b *Backward) WorkspaceSize() (int, error) {
	handle, err := b.native("Backward.WorkspaceSize")
	if err != nil {
		return 0, err
	}
	var bytes C.size_t
	err = call("fmha_bwd_launcher_workspace_size", func() C.fmha_status {
		return C.go_fmha_bwd_launcher_workspace_size(handle, &bytes)
	})
	return int(bytes), err
}

// PrepareWorkspace prepares workspace (at least WorkspaceSize bytes) for the given sequence starts,
// synchronously: in varlen mode the host copies of the [batch+1] seqstarts, in batch mode nil.
// One prepare serves any number of runs with the same sequence starts.
func (b *Backward) PrepareWorkspace(workspace *Buffer[byte], seqstartQ, seqstartK []int32) error {
	const op = "Backward.PrepareWorkspace"
	handle, err := b.native(op)
	if err != nil {
		return err
	}
	if workspace == nil {
		return invalidArgument(op, "workspace", "nil buffer")
	}
	ws, err := workspace.open(op)
	if err != nil {
		return err
	}
	// The library reads batch + 1 entries of each array it is given.
	for _, starts := range []struct {
		field  string
		values []int32
	}{{"seqstart_q", seqstartQ}, {"seqstart_k", seqstartK}} {
		if len(starts.values) != 0 && len(starts.values) != b.traits.Batch+1 {
			return invalidArgument(op, starts.field, "%d entries where batch + 1 = %d are read",
				len(starts.values), b.traits.Batch+1)
		}
	}
	bytes := C.size_t(workspace.Len())
	// Go memory for the duration of the synchronous call.
	q, k := firstInt32(seqstartQ), firstInt32(seqstartK)
	return call("fmha_bwd_launcher_prepare_workspace", func() C.fmha_status {
		return C.go_fmha_bwd_launcher_prepare_workspace(handle, ws, bytes, q, k)
	})
}

// PrepareWorkspaceAsync prepares workspace on s from the device seqstarts (varlen; nil in batch
// mode) without blocking the host. Invalid seqstarts leave the workspace unprepared and are
// reported, naming the field, by the stream's next Synchronize (on the host backend).
func (b *Backward) PrepareWorkspaceAsync(s *Stream, workspace *Buffer[byte], seqstartQ, seqstartK *Buffer[int32]) error {
	f := fields{op: "Backward.PrepareWorkspaceAsync"}
	handle, err := b.native(f.op)
	if err != nil {
		return err
	}
	stream, err := s.native(f.op)
	if err != nil {
		return err
	}
	if workspace == nil {
		return invalidArgument(f.op, "workspace", "nil buffer")
	}
	ws, err := workspace.open(f.op)
	if err != nil {
		return err
	}
	bytes := C.size_t(workspace.Len())
	q, k := f.ints("seqstart_q", seqstartQ), f.ints("seqstart_k", seqstartK)
	if f.err != nil {
		return f.err
	}
	return call("fmha_bwd_launcher_prepare_workspace_async", func() C.fmha_status {
		return C.go_fmha_bwd_launcher_prepare_workspace_async(handle, ws, bytes, q, k, stream)
	})
}

// BackwardArgs is one backward run. Tensors have the forward's layouts; DK and DV have HeadsK
// heads (the GQA reduction happens inside the library), D is fp32 scratch in the LSE layout.
type BackwardArgs struct {
	// Shape is the problem's; the zero Shape takes the launcher's. It must equal the launcher's,
	// except in varlen mode, where the lengths may be smaller than its bounds.
	Shape
	// Varlen holds the device seqstarts (and optional logical lengths) in varlen mode.
	Varlen *Varlen
	// Scale is the forward's softmax scale; 0 selects 1/sqrt(HdimQ).
	Scale float32
	// The forward's inputs, output and LSE, and the output gradient.
	Q, K, V, O, LSE, DO Tensor
	// D is fp32 scratch in the LSE layout.
	D Tensor
	// The gradients.
	DQ, DK, DV Tensor
	// Workspace was prepared for these sequence starts by a launcher with these traits.
	Workspace *Buffer[byte]
}

// Run queues the backward on s (nil: the default stream) and returns once it is queued.
func (b *Backward) Run(s *Stream, a *BackwardArgs) error {
	f := fields{op: "Backward.Run"}
	handle, err := b.native(f.op)
	if err != nil {
		return err
	}
	stream, err := s.native(f.op)
	if err != nil {
		return err
	}
	if a == nil {
		return invalidArgument(f.op, "args", "nil")
	}
	shape := a.Shape
	if shape == (Shape{}) {
		shape = b.traits.Shape
	}
	size := b.traits.DType.Size()
	args := C.fmha_bwd_args{
		struct_size:  C.size_t(unsafe.Sizeof(C.fmha_bwd_args{})),
		q:            f.tensor("q", a.Q, size),
		k:            f.tensor("k", a.K, size),
		v:            f.tensor("v", a.V, size),
		o:            f.tensor("o", a.O, size),
		lse:          f.tensor("lse", a.LSE, 4),
		d_o:          f.tensor("d_o", a.DO, size),
		d:            f.tensor("d", a.D, 4),
		dq:           f.tensor("dq", a.DQ, size),
		dk:           f.tensor("dk", a.DK, size),
		dv:           f.tensor("dv", a.DV, size),
		batch:        f.int32("batch", shape.Batch),
		seqlen_q:     f.int32("seqlen_q", shape.SeqlenQ),
		seqlen_k:     f.int32("seqlen_k", shape.SeqlenK),
		max_seqlen_q: f.int32("max_seqlen_q", shape.MaxSeqlenQ),
		max_seqlen_k: f.int32("max_seqlen_k", shape.MaxSeqlenK),
		nhead_q:      f.int32("nhead_q", shape.HeadsQ),
		nhead_k:      f.int32("nhead_k", shape.HeadsK),
		hdim_q:       f.int32("hdim_q", shape.HdimQ),
		hdim_v:       f.int32("hdim_v", shape.HdimV),
		scale:        C.float(a.Scale),
	}
	args.window_size_left, args.window_size_right = f.window(b.traits.Mask)
	if a.Varlen != nil {
		args.seqstart_q = f.ints("seqstart_q", a.Varlen.SeqstartQ)
		args.seqstart_k = f.ints("seqstart_k", a.Varlen.SeqstartK)
		args.seqlen_q_ptr = f.ints("seqlen_q_ptr", a.Varlen.SeqlenQ)
		args.seqlen_k_ptr = f.ints("seqlen_k_ptr", a.Varlen.SeqlenK)
	}
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
	return call("fmha_bwd_launcher_run", func() C.fmha_status { return C.go_fmha_bwd_launcher_run(handle, &args, stream) })
}

// Close destroys the launcher; work it already queued is unaffected. Closing again does nothing.
func (b *Backward) Close() error {
	b.mu.Lock()
	handle := b.handle
	b.handle = 0
	b.mu.Unlock()
	if handle == 0 {
		return nil
	}
	return call("fmha_bwd_launcher_destroy", func() C.fmha_status { return C.go_fmha_bwd_launcher_destroy(handle) })
}

// firstInt32 is the address of s's first element, NULL for an empty slice.
func firstInt32(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

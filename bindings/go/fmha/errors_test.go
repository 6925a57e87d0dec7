package fmha

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// badForward is a forward whose hdim_q is refused by the library: the error names the field and
// the value.
func badForward(s *Stream, q, o *Buffer[uint16], hdimQ int) error {
	strides := Strides{Batch: 64 * 64, Head: 64 * 64, Row: 64}
	return Forward(s, &ForwardArgs{
		DType: BF16,
		Shape: Shape{Batch: 1, SeqlenQ: 64, SeqlenK: 64, HeadsQ: 1, HeadsK: 1, HdimQ: hdimQ, HdimV: 64},
		Q:     q.Tensor(0, strides), K: q.Tensor(0, strides), V: q.Tensor(0, strides), O: o.Tensor(0, strides),
	})
}

func TestErrorNamesTheField(t *testing.T) {
	d := &device{t: t}
	defer d.close()
	q, o := newBuffer[uint16](d, 64*64), newBuffer[uint16](d, 64*64)

	err := badForward(nil, q, o, -3)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "hdim_q") {
		t.Fatalf("forward with hdim_q = -3: got %v, want ErrInvalidArgument naming hdim_q", err)
	}
	if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrUnsupported) {
		t.Fatalf("errors.Is(%v) does not match its status alone", err)
	}
	if e.Op != "fmha_fwd" || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("error %q: want op fmha_fwd and the status's description", err)
	}
	t.Logf("expected error: %v", err)

	// A window with no mask type is refused by the library, naming the window field.
	strides := Strides{Batch: 64 * 64, Head: 64 * 64, Row: 64}
	err = Forward(nil, &ForwardArgs{
		DType: BF16, Mask: Window(MaskNone, 3, -1),
		Shape: Shape{Batch: 1, SeqlenQ: 64, SeqlenK: 64, HeadsQ: 1, HeadsK: 1, HdimQ: 64, HdimV: 64},
		Q:     q.Tensor(0, strides), K: q.Tensor(0, strides), V: q.Tensor(0, strides), O: o.Tensor(0, strides),
	})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "window_size_left") {
		t.Fatalf("window with MaskNone: got %v, want ErrInvalidArgument naming window_size_left", err)
	}

	// What the binding refuses before the call reads the same way.
	wide := newBuffer[float32](d, 64*64)
	err = Forward(nil, &ForwardArgs{
		DType: BF16,
		Shape: Shape{Batch: 1, SeqlenQ: 64, SeqlenK: 64, HeadsQ: 1, HeadsK: 1, HdimQ: 64, HdimV: 64},
		Q:     wide.Tensor(0, strides), K: q.Tensor(0, strides), V: q.Tensor(0, strides), O: o.Tensor(0, strides),
	})
	if !errors.Is(err, ErrInvalidArgument) || !strings.HasPrefix(errors.Unwrap(err).Error(), "fmha:") ||
		!strings.Contains(err.Error(), "q: a view of 4-byte elements") {
		t.Fatalf("bf16 forward on a float32 q: got %v", err)
	}
	for _, bad := range []struct {
		name string
		err  error
	}{
		{"batch beyond int32", Forward(nil, &ForwardArgs{Shape: Shape{Batch: 1 << 40}})},
		{"nil args", Forward(nil, nil)},
		{"offset outside", Forward(nil, &ForwardArgs{DType: BF16, Q: q.Tensor(q.Len()+1, strides)})},
		{"negative buffer", func() error { _, err := NewBuffer[float32](-1); return err }()},
		{"oversized upload", q.Upload(make([]uint16, q.Len()+1))},
	} {
		if !errors.Is(bad.err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", bad.name, bad.err)
		}
	}
}

// Goroutines failing at once each get their own call's message: the message is per OS thread, and
// the package keeps each goroutine on its thread until it has read it.
func TestConcurrentErrorMessages(t *testing.T) {
	d := &device{t: t}
	defer d.close()
	q, o := newBuffer[uint16](d, 64*64), newBuffer[uint16](d, 64*64)
	previous := runtime.GOMAXPROCS(8)
	defer runtime.GOMAXPROCS(previous)

	const goroutines, calls = 16, 200
	var wg sync.WaitGroup
	failures := make(chan string, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				hdim := -(1000 + g) // the message names this goroutine's value
				err := badForward(nil, q, o, hdim)
				if err == nil || !strings.Contains(err.Error(), fmt.Sprint(hdim)) {
					failures <- fmt.Sprintf("goroutine %d, call %d: %v", g, i, err)
					return
				}
				runtime.Gosched()
			}
		}(g)
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}
}

func TestCloseTwice(t *testing.T) {
	buffer, err := NewBuffer[float32](16)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := NewStream()
	if err != nil {
		t.Fatal(err)
	}
	launcher, err := NewBackward(BackwardTraits{
		DType: FP16, Shape: Shape{Batch: 1, SeqlenQ: 8, SeqlenK: 8, HeadsQ: 1, HeadsK: 1, HdimQ: 64, HdimV: 64},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []interface{ Close() error }{buffer, stream, launcher, (*Stream)(nil)} {
		for i := 0; i < 2; i++ {
			if err := c.Close(); err != nil {
				t.Errorf("%T Close #%d: %v", c, i+1, err)
			}
		}
	}
	// Closed objects refuse work with an error, never a crash.
	if err := buffer.Upload([]float32{1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Upload after Close: %v", err)
	}
	if err := stream.Synchronize(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Synchronize after Close: %v", err)
	}
	if _, err := launcher.WorkspaceSize(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("WorkspaceSize after Close: %v", err)
	}
	if err := Forward(nil, &ForwardArgs{Q: buffer.Tensor(0, Strides{})}); !errors.Is(err, ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "closed") {
		t.Errorf("Forward on a closed buffer: %v", err)
	}
}

func TestStatusStrings(t *testing.T) {
	if s := ErrNullPointer.String(); !strings.Contains(s, "null") {
		t.Errorf("ErrNullPointer.String() = %q", s)
	}
	if s := Status(12345).String(); s != "unknown status" {
		t.Errorf("Status(12345).String() = %q", s)
	}
	for _, s := range []fmt.Stringer{BF16, FP8E4M3FNUZ, MaskBottomRight, Causal(MaskTopLeft), Mask{}, BackendHost,
		LSEBase2, KVPageCSR, KVLayoutVectorized, KVScalePage} {
		if s.String() == "" || strings.Contains(s.String(), "(") && !strings.HasPrefix(s.String(), "window") {
			t.Errorf("%#v.String() = %q", s, s.String())
		}
	}
	if got := DType(99).String(); got != "DType(99)" {
		t.Errorf("DType(99).String() = %q", got)
	}
}

package fmha

/*
#include <fmha.h>
*/
import "C"

// fields converts Go values into C argument fields and keeps the first refusal, so that filling an
// argument struct is a list of assignments followed by one check of err.
type fields struct {
	op  string
	err error
}

func (f *fields) refuse(field, format string, args ...any) {
	if f.err == nil {
		f.err = invalidArgument(f.op, field, format, args...)
	}
}

// int32 refuses values that do not fit instead of letting them wrap into other, possibly valid,
// values.
func (f *fields) int32(field string, v int) C.int32_t {
	if int(int32(v)) != v {
		f.refuse(field, "%d does not fit in int32", v)
	}
	return C.int32_t(v)
}

// tensor checks that t views elements of elementSize bytes (0: any, the library reports a bad
// dtype itself); an absent tensor passes as NULL data.
func (f *fields) tensor(field string, t Tensor, elementSize int) C.fmha_tensor {
	switch {
	case t.problem != "":
		f.refuse(field, "%s", t.problem)
	case t.data != nil && elementSize != 0 && t.elementSize != elementSize:
		f.refuse(field, "a view of %d-byte elements where %d-byte ones are needed", t.elementSize, elementSize)
	}
	return C.fmha_tensor{
		data:         t.data,
		batch_stride: C.int64_t(t.strides.Batch),
		head_stride:  C.int64_t(t.strides.Head),
		row_stride:   C.int64_t(t.strides.Row),
	}
}

// ints is the device address of an optional int32 array (nil: NULL).
func (f *fields) ints(field string, b *Buffer[int32]) *C.int32_t {
	if b == nil {
		return nil
	}
	p := b.Pointer()
	if p == nil {
		f.refuse(field, "the buffer is closed")
	}
	return (*C.int32_t)(p)
}

func (f *fields) descale(field string, d Descale) C.fmha_scale {
	scale := C.fmha_scale{
		batch_stride: C.int64_t(d.BatchStride),
		head_stride:  C.int64_t(d.HeadStride),
		page_stride:  C.int64_t(d.PageStride),
	}
	if d.Data != nil {
		p := d.Data.Pointer()
		if p == nil {
			f.refuse(field, "the buffer is closed")
		}
		scale.data = (*C.float)(p)
	}
	return scale
}

// window is the mask's window as the C fields take it.
func (f *fields) window(m Mask) (left, right C.int32_t) {
	l, r := m.WindowSizes()
	return f.int32("window_size_left", l), f.int32("window_size_right", r)
}

func flag(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

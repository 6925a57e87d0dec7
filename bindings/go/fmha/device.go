package fmha

/*
#include <fmha.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Element is what a Buffer holds: Bfloat16 and Float16 for the 16-bit types, uint8 for fp8 codes,
// float32 for LSEs, descales and fp32 states, int32 for sequence offsets and tables.
type Element interface {
	~uint8 | ~uint16 | ~int32 | ~float32
}

// Buffer is device memory holding Len elements of T (fmha_device_malloc, 256-byte aligned).
// Close frees it. It is safe for concurrent use; work queued on a stream must have finished with a
// buffer before it is closed.
type Buffer[T Element] struct {
	mu  sync.Mutex
	ptr unsafe.Pointer // nil once closed
	n   int
}

// NewBuffer allocates device memory for n elements of T (contents undefined).
func NewBuffer[T Element](n int) (*Buffer[T], error) {
	if n < 0 {
		return nil, invalidArgument("NewBuffer", "n", "%d elements: must be >= 0", n)
	}
	bytes := C.size_t(n) * C.size_t(elementSize[T]())
	var p unsafe.Pointer
	if err := call("fmha_device_malloc", func() C.fmha_status { return C.fmha_device_malloc(&p, bytes) }); err != nil {
		return nil, err
	}
	return &Buffer[T]{ptr: p, n: n}, nil
}

func elementSize[T Element]() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}

// Len is the number of elements.
func (b *Buffer[T]) Len() int { return b.n }

// Pointer is the device address (nil once closed), for passing the memory to other libraries.
func (b *Buffer[T]) Pointer() unsafe.Pointer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ptr
}

// open is the device address, or an error naming the operation when the buffer is closed.
func (b *Buffer[T]) open(op string) (unsafe.Pointer, error) {
	p := b.Pointer()
	if p == nil {
		return nil, invalidArgument(op, "buffer", "closed")
	}
	return p, nil
}

// Upload copies src to the start of the buffer and waits for the copy.
func (b *Buffer[T]) Upload(src []T) error {
	return b.copyHost("Buffer.Upload", "src", src, C.FMHA_MEMCPY_HOST_TO_DEVICE)
}

// Download copies the start of the buffer into dst and waits for the copy. Synchronize the stream
// that wrote the buffer first.
func (b *Buffer[T]) Download(dst []T) error {
	return b.copyHost("Buffer.Download", "dst", dst, C.FMHA_MEMCPY_DEVICE_TO_HOST)
}

func (b *Buffer[T]) copyHost(op, field string, host []T, kind C.int32_t) error {
	if len(host) > b.n {
		return invalidArgument(op, field, "%d elements do not fit in a buffer of %d", len(host), b.n)
	}
	device, err := b.open(op)
	if err != nil || len(host) == 0 {
		return err
	}
	// Go memory may be passed for the duration of a synchronous call (it holds no Go pointers).
	hostPtr := unsafe.Pointer(&host[0])
	bytes := C.size_t(len(host) * elementSize[T]())
	return call("fmha_memcpy", func() C.fmha_status {
		if kind == C.FMHA_MEMCPY_HOST_TO_DEVICE {
			return C.fmha_memcpy(device, hostPtr, bytes, kind)
		}
		return C.fmha_memcpy(hostPtr, device, bytes, kind)
	})
}

// CopyFrom copies all of src, device to device, to the start of b and waits for the copy.
func (b *Buffer[T]) CopyFrom(src *Buffer[T]) error {
	const op = "Buffer.CopyFrom"
	if src == nil {
		return invalidArgument(op, "src", "nil buffer")
	}
	if src.n > b.n {
		return invalidArgument(op, "src", "%d elements do not fit in a buffer of %d", src.n, b.n)
	}
	dst, err := b.open(op)
	if err != nil {
		return err
	}
	from, err := src.open(op)
	if err != nil {
		return err
	}
	bytes := C.size_t(src.n * elementSize[T]())
	return call("fmha_memcpy", func() C.fmha_status {
		return C.fmha_memcpy(dst, from, bytes, C.FMHA_MEMCPY_DEVICE_TO_DEVICE)
	})
}

// Fill sets every byte of the buffer to value and waits (e.g. 0xFF poisons floats with NaN).
func (b *Buffer[T]) Fill(value byte) error {
	p, err := b.open("Buffer.Fill")
	if err != nil {
		return err
	}
	bytes := C.size_t(b.n * elementSize[T]())
	return call("fmha_memset", func() C.fmha_status { return C.fmha_memset(p, C.int32_t(value), bytes) })
}

// Close frees the device memory. Closing again does nothing.
func (b *Buffer[T]) Close() error {
	b.mu.Lock()
	p := b.ptr
	b.ptr = nil
	b.mu.Unlock()
	if p == nil {
		return nil
	}
	return call("fmha_device_free", func() C.fmha_status { return C.fmha_device_free(p) })
}

// Strides of a [batch][head][row][column] view, in elements; columns are contiguous. 0 broadcasts
// an input along that dimension.
type Strides struct {
	Batch, Head, Row int
}

// Tensor is a strided view of a buffer, an operand of the attention operations. The zero Tensor is
// absent (e.g. an LSE that is not written).
type Tensor struct {
	data        unsafe.Pointer
	elementSize int
	strides     Strides
	problem     string // why the binding refused the view; reported by the operation given it
}

// Tensor is the view of b starting offset elements in, with strides s. A bad offset or a closed
// buffer is reported by the operation the tensor is given to.
func (b *Buffer[T]) Tensor(offset int, s Strides) Tensor {
	p := b.Pointer()
	switch {
	case p == nil:
		return Tensor{problem: "a view of a closed buffer"}
	case offset < 0 || offset > b.n:
		return Tensor{problem: fmt.Sprintf("offset %d is outside the buffer of %d elements", offset, b.n)}
	}
	return Tensor{data: unsafe.Add(p, offset*elementSize[T]()), elementSize: elementSize[T](), strides: s}
}

// Descale is an fp8 descale operand (fp32, positive): the descale of (sequence b, kv head g,
// physical page p) is Data[b*BatchStride + g*HeadStride + p*PageStride]. A nil Data means 1.
type Descale struct {
	Data                                *Buffer[float32]
	BatchStride, HeadStride, PageStride int
}

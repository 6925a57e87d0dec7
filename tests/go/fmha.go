// Package fmha is a minimal cgo binding of the fmha C ABI, enough for the smoke test in
// fmha_test.go (cgo is not allowed in _test.go files, so the binding lives here).
//
// Build and run against an installed fmha (scripts/install.sh PREFIX):
//
//	PKG_CONFIG_PATH=PREFIX/lib/pkgconfig LD_LIBRARY_PATH=PREFIX/lib go test ./...
//
// fmha keeps the last error message per OS thread. A goroutine may move to another thread between
// two cgo calls, so every call that can fail runs with the goroutine locked to its thread until the
// message has been read (see call).
package fmha

/*
#cgo pkg-config: fmha
#include <stdlib.h>
#include <fmha.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Status is an fmha_status value.
type Status int32

const (
	OK                   Status = C.FMHA_OK
	ErrInvalidArgument   Status = C.FMHA_ERR_INVALID_ARGUMENT
	ErrUnsupported       Status = C.FMHA_ERR_UNSUPPORTED
	ErrDeviceRuntime     Status = C.FMHA_ERR_DEVICE_RUNTIME
	ErrOutOfMemory       Status = C.FMHA_ERR_OUT_OF_MEMORY
	ErrNoDevice          Status = C.FMHA_ERR_NO_DEVICE
	ErrNullPointer       Status = C.FMHA_ERR_NULL_POINTER
	ErrInternal          Status = C.FMHA_ERR_INTERNAL
	BackendHost                 = int(C.FMHA_BACKEND_HOST)
	BackendCUDA                 = int(C.FMHA_BACKEND_CUDA)
	BackendROCm                 = int(C.FMHA_BACKEND_ROCM)
	HeaderVersionNumber         = uint32(C.FMHA_VERSION_NUMBER)
	HeaderVersionString         = C.FMHA_VERSION_STRING
	MemcpyHostToDevice          = int32(C.FMHA_MEMCPY_HOST_TO_DEVICE)
	MemcpyDeviceToHost          = int32(C.FMHA_MEMCPY_DEVICE_TO_HOST)
	MemcpyDeviceToDevice        = int32(C.FMHA_MEMCPY_DEVICE_TO_DEVICE)
)

func (s Status) String() string { return C.GoString(C.fmha_status_string(C.fmha_status(s))) }

// Error is a failed fmha call: its status and the library's message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("fmha: %v (%d): %s", e.Status, int32(e.Status), e.Message)
}

// lastErrorMessage reads the calling thread's message (the caller holds the OS thread).
func lastErrorMessage() string {
	n := C.fmha_last_error_message(nil, 0)
	buf := make([]byte, int(n)+1)
	C.fmha_last_error_message((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return string(buf[:n])
}

// call runs f on one OS thread and turns a failure into an *Error carrying the message.
func call(f func() C.fmha_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if s := Status(f()); s != OK {
		return &Error{Status: s, Message: lastErrorMessage()}
	}
	return nil
}

// Version is the library's version string.
func Version() string { return C.GoString(C.fmha_version()) }

// VersionNumber is major*10000 + minor*100 + patch of the library.
func VersionNumber() uint32 { return uint32(C.fmha_version_number()) }

// Backend is FMHA_BACKEND_HOST, _CUDA or _ROCM.
func Backend() int { return int(C.fmha_backend()) }

// DeviceCUCount is the device's compute unit count.
func DeviceCUCount() (int, error) {
	var n C.int32_t
	err := call(func() C.fmha_status { return C.fmha_device_cu_count(&n) })
	return int(n), err
}

// DeviceMalloc allocates device memory.
func DeviceMalloc(bytes int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := call(func() C.fmha_status { return C.fmha_device_malloc(&p, C.size_t(bytes)) })
	return p, err
}

// DeviceMallocNullOut calls fmha_device_malloc with a NULL out-pointer (a bad call, for the test).
func DeviceMallocNullOut(bytes int) error {
	return call(func() C.fmha_status { return C.fmha_device_malloc(nil, C.size_t(bytes)) })
}

// DeviceFree frees device memory.
func DeviceFree(p unsafe.Pointer) error {
	return call(func() C.fmha_status { return C.fmha_device_free(p) })
}

// HostMallocPinned allocates page-locked host memory, viewed as a byte slice (C memory: it may be
// used by asynchronous copies after the call that queued them returns).
func HostMallocPinned(bytes int) ([]byte, error) {
	var p unsafe.Pointer
	if err := call(func() C.fmha_status { return C.fmha_host_malloc_pinned(&p, C.size_t(bytes)) }); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), bytes), nil
}

// HostFreePinned frees memory from HostMallocPinned.
func HostFreePinned(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	p := unsafe.Pointer(&b[0])
	return call(func() C.fmha_status { return C.fmha_host_free_pinned(p) })
}

// Memcpy copies synchronously; host memory may be Go memory (it is not kept after the call).
func Memcpy(dst, src unsafe.Pointer, bytes int, kind int32) error {
	return call(func() C.fmha_status { return C.fmha_memcpy(dst, src, C.size_t(bytes), C.int32_t(kind)) })
}

// Stream is an fmha_stream_t; nil is the default stream.
type Stream = C.fmha_stream_t

// MemcpyAsync queues a copy on a stream; host memory must be C memory (e.g. HostMallocPinned).
func MemcpyAsync(dst, src unsafe.Pointer, bytes int, kind int32, s Stream) error {
	return call(func() C.fmha_status { return C.fmha_memcpy_async(dst, src, C.size_t(bytes), C.int32_t(kind), s) })
}

// MemsetAsync queues a memset on a stream.
func MemsetAsync(dst unsafe.Pointer, value int32, bytes int, s Stream) error {
	return call(func() C.fmha_status { return C.fmha_memset_async(dst, C.int32_t(value), C.size_t(bytes), s) })
}

// StreamCreate creates a stream.
func StreamCreate() (Stream, error) {
	var s C.fmha_stream_t
	err := call(func() C.fmha_status { return C.fmha_stream_create(&s) })
	return s, err
}

// StreamDestroy destroys a stream.
func StreamDestroy(s Stream) error {
	return call(func() C.fmha_status { return C.fmha_stream_destroy(s) })
}

// StreamSynchronize waits for the stream's work.
func StreamSynchronize(s Stream) error {
	return call(func() C.fmha_status { return C.fmha_stream_synchronize(s) })
}

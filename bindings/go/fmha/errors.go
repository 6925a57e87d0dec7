package fmha

/*
#cgo pkg-config: fmha
#include <fmha.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Status is an fmha_status error code. The values are the ABI's and never change; a Status is also
// the sentinel an *Error of that status matches with errors.Is.
type Status int32

// The error statuses (FMHA_ERR_*). Success is a nil error, never a Status.
const (
	ErrInvalidArgument      Status = C.FMHA_ERR_INVALID_ARGUMENT
	ErrUnsupported          Status = C.FMHA_ERR_UNSUPPORTED
	ErrDeviceRuntime        Status = C.FMHA_ERR_DEVICE_RUNTIME
	ErrOutOfMemory          Status = C.FMHA_ERR_OUT_OF_MEMORY
	ErrWorkspaceTooSmall    Status = C.FMHA_ERR_WORKSPACE_TOO_SMALL
	ErrWorkspaceNotPrepared Status = C.FMHA_ERR_WORKSPACE_NOT_PREPARED
	ErrNoDevice             Status = C.FMHA_ERR_NO_DEVICE
	ErrNullPointer          Status = C.FMHA_ERR_NULL_POINTER
	ErrInternal             Status = C.FMHA_ERR_INTERNAL
	ErrAsyncFailure         Status = C.FMHA_ERR_ASYNC_FAILURE
)

// String is the library's description of the status ("unknown status" for values it does not know).
func (s Status) String() string { return C.GoString(C.fmha_status_string(C.fmha_status(s))) }

// Error makes a Status usable as an error sentinel.
func (s Status) Error() string { return "fmha: " + s.String() }

// Error is a failed fmha call.
type Error struct {
	// Op is the C function that failed (e.g. "fmha_fwd"), or the Go method that refused its input
	// before calling the library.
	Op string
	// Status is the failure's code.
	Status Status
	// Message is the library's detail: which field, which value, which limit.
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Op, e.Status.String(), int32(e.Status), e.Message)
}

// Unwrap gives the status, so that errors.Is(err, ErrUnsupported) matches.
func (e *Error) Unwrap() error { return e.Status }

// call runs one fmha C call and turns a failure into an *Error. The goroutine stays on its OS
// thread until the thread-local message of that call has been read.
func call(op string, f func() C.fmha_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if status := f(); status != C.FMHA_OK {
		return &Error{Op: op, Status: Status(status), Message: lastErrorMessage()}
	}
	return nil
}

// lastErrorMessage reads this OS thread's message; the caller holds the thread.
func lastErrorMessage() string {
	n := C.fmha_last_error_message(nil, 0)
	buf := make([]byte, int(n)+1)
	C.fmha_last_error_message((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return string(buf[:n])
}

// invalidArgument is the error of input the binding refuses before calling the library, worded
// like the library's messages: the field first.
func invalidArgument(op, field, format string, args ...any) error {
	return &Error{Op: op, Status: ErrInvalidArgument, Message: field + ": " + fmt.Sprintf(format, args...)}
}

package fmha

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unsafe"
)

func TestVersion(t *testing.T) {
	if got := Version(); got != HeaderVersionString {
		t.Fatalf("fmha_version() = %q, header FMHA_VERSION_STRING = %q", got, HeaderVersionString)
	}
	if got := VersionNumber(); got != HeaderVersionNumber {
		t.Fatalf("fmha_version_number() = %d, header FMHA_VERSION_NUMBER = %d", got, HeaderVersionNumber)
	}
	switch b := Backend(); b {
	case BackendHost, BackendCUDA, BackendROCm:
		t.Logf("fmha %s, backend %d", Version(), b)
	default:
		t.Fatalf("fmha_backend() = %d is not a backend", b)
	}
	if s := ErrNullPointer.String(); !strings.Contains(s, "null") {
		t.Fatalf("fmha_status_string(FMHA_ERR_NULL_POINTER) = %q", s)
	}
	if s := Status(12345).String(); s != "unknown status" {
		t.Fatalf("fmha_status_string(12345) = %q", s)
	}
}

func TestErrorMessage(t *testing.T) {
	err := DeviceMallocNullOut(64)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("fmha_device_malloc(NULL, 64) = %v, want an error", err)
	}
	if e.Status != ErrNullPointer || !strings.Contains(e.Message, "ptr") {
		t.Fatalf("fmha_device_malloc(NULL, 64): got %v, want FMHA_ERR_NULL_POINTER naming ptr", e)
	}
	t.Logf("expected error: %v", e)

	if Backend() == BackendHost {
		// The host backend knows its allocations: freeing a pointer it did not hand out is an error.
		var local [16]byte
		err := DeviceFree(unsafe.Pointer(&local[0]))
		if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "ptr") {
			t.Fatalf("fmha_device_free(bogus) = %v, want FMHA_ERR_INVALID_ARGUMENT naming ptr", err)
		}
		t.Logf("expected error: %v", e)
	}
}

// skipWithoutDevice skips on a GPU build without a device.
func skipWithoutDevice(t *testing.T) {
	t.Helper()
	n, err := DeviceCUCount()
	var e *Error
	if errors.As(err, &e) && e.Status == ErrNoDevice && Backend() != BackendHost {
		t.Skipf("no device: %v", e)
	}
	if err != nil || n <= 0 {
		t.Fatalf("fmha_device_cu_count = %d, %v", n, err)
	}
}

func TestDeviceRoundTrip(t *testing.T) {
	skipWithoutDevice(t)
	const n = 1 << 20
	in, err := HostMallocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	defer HostFreePinned(in)
	out, err := HostMallocPinned(n)
	if err != nil {
		t.Fatal(err)
	}
	defer HostFreePinned(out)
	a, err := DeviceMalloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer DeviceFree(a)
	b, err := DeviceMalloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer DeviceFree(b)
	s, err := StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer StreamDestroy(s)

	for i := range in {
		in[i] = byte(i*7 + i>>8)
		out[i] = 0
	}
	steps := []error{
		MemcpyAsync(a, unsafe.Pointer(&in[0]), n, MemcpyHostToDevice, s),
		MemsetAsync(b, 0, n, s),
		MemcpyAsync(b, a, n, MemcpyDeviceToDevice, s),
		MemcpyAsync(unsafe.Pointer(&out[0]), b, n, MemcpyDeviceToHost, s),
		StreamSynchronize(s),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if !bytes.Equal(in, out) {
		t.Fatal("round trip through the device changed the data")
	}

	// A synchronous copy from Go memory.
	goBuf := make([]byte, 4096)
	if err := Memcpy(unsafe.Pointer(&goBuf[0]), a, len(goBuf), MemcpyDeviceToHost); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(goBuf, in[:len(goBuf)]) {
		t.Fatal("synchronous device-to-host copy mismatch")
	}

	// A bad copy kind names the argument.
	err = Memcpy(a, b, n, 42)
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.Contains(e.Message, "kind") {
		t.Fatalf("fmha_memcpy(kind=42) = %v, want FMHA_ERR_INVALID_ARGUMENT naming kind", err)
	}
}

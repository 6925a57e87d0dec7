package fmha

/*
#include <stdlib.h>
#include <fmha.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// The version of the header this package was compiled against (FMHA_VERSION_*).
const (
	HeaderVersion       = C.FMHA_VERSION_STRING
	HeaderVersionNumber = uint32(C.FMHA_VERSION_NUMBER)
)

// Version is the loaded library's version, e.g. "0.2.0".
func Version() string { return C.GoString(C.fmha_version()) }

// VersionNumber is the loaded library's major*10000 + minor*100 + patch.
func VersionNumber() uint32 { return uint32(C.fmha_version_number()) }

// CheckVersion reports an error when the loaded library cannot serve this package: another major
// version, or older than the header the package was compiled against (docs/abi.md).
func CheckVersion() error {
	library := VersionNumber()
	if library/10000 != HeaderVersionNumber/10000 || library < HeaderVersionNumber {
		return fmt.Errorf("fmha: library %s does not serve header %s (same major version, not older, needed)",
			Version(), HeaderVersion)
	}
	return nil
}

// Backend is the kind of device a library build runs on.
type Backend int32

// The backends (FMHA_BACKEND_*).
const (
	BackendHost Backend = C.FMHA_BACKEND_HOST
	BackendCUDA Backend = C.FMHA_BACKEND_CUDA
	BackendROCm Backend = C.FMHA_BACKEND_ROCM
)

func (b Backend) String() string {
	switch b {
	case BackendHost:
		return "host"
	case BackendCUDA:
		return "cuda"
	case BackendROCm:
		return "rocm"
	}
	return fmt.Sprintf("Backend(%d)", int32(b))
}

// LibraryBackend is the backend the loaded library was built with.
func LibraryBackend() Backend { return Backend(C.fmha_backend()) }

// RegistryJSON is the JSON array of this build's kernel instances for the current device.
func RegistryJSON() (string, error) {
	var required C.size_t
	if err := call("fmha_registry_json", func() C.fmha_status {
		return C.fmha_registry_json(nil, 0, &required)
	}); err != nil {
		return "", err
	}
	// C memory: the library writes up to `required` bytes plus the NUL.
	buf := (*C.char)(C.malloc(required + 1))
	defer C.free(unsafe.Pointer(buf))
	if err := call("fmha_registry_json", func() C.fmha_status {
		return C.fmha_registry_json(buf, required+1, &required)
	}); err != nil {
		return "", err
	}
	return C.GoStringN(buf, C.int(required)), nil
}

// DeviceCUCount is the number of compute units the scheduler plans for (SMs, CUs, or the host
// backend's logical CUs).
func DeviceCUCount() (int, error) {
	var n C.int32_t
	err := call("fmha_device_cu_count", func() C.fmha_status { return C.fmha_device_cu_count(&n) })
	return int(n), err
}

// SetHostCUCount sets the host backend's logical CU count (1..4096); GPU builds answer
// ErrUnsupported.
func SetHostCUCount(n int) error {
	f := fields{op: "SetHostCUCount"}
	count := f.int32("count", n)
	if f.err != nil {
		return f.err
	}
	return call("fmha_host_set_cu_count", func() C.fmha_status { return C.fmha_host_set_cu_count(count) })
}

// LoadKernels loads the build's kernels onto the current device now, so that the first operation
// does not wait for it (see fmha_load_kernels).
func LoadKernels() error {
	return call("fmha_load_kernels", func() C.fmha_status { return C.fmha_load_kernels() })
}

// DeviceSynchronize waits for all work on all streams of the device.
func DeviceSynchronize() error {
	return call("fmha_device_synchronize", func() C.fmha_status { return C.fmha_device_synchronize() })
}

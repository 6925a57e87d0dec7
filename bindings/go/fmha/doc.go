// Package fmha is the Go binding of fmha, a fused multi-head attention library with a stable C ABI
// (include/fmha.h): attention forward (batch and varlen, masks, GQA, LSE), the backward launcher,
// the kv-cache forward, the merge of attention states, and the device memory and streams they run on.
//
// The package links libfmha through pkg-config (cgo). Against an installation made by
// scripts/install.sh PREFIX:
//
//	PKG_CONFIG_PATH=PREFIX/lib/pkgconfig LD_LIBRARY_PATH=PREFIX/lib go test ./...
//
// # Errors
//
// Every failing call returns an *Error carrying the fmha status and the library's message, which
// names the offending field. Errors match the Status sentinels with errors.Is:
//
//	if errors.Is(err, fmha.ErrUnsupported) { ... }
//
// fmha keeps the message of a failed call per OS thread, and a goroutine may move between threads
// from one cgo call to the next; the package locks the goroutine to its thread from each call until
// its message has been read, so callers need no runtime.LockOSThread of their own.
//
// # Memory and streams
//
// Device memory is a Buffer (NewBuffer), released by Close; tensors are strided views of buffers
// (Buffer.Tensor). Operations are queued on a Stream (nil is the default stream) and return once
// queued: errors of the queued work are reported by Stream.Synchronize. A buffer must stay open
// until the work using it has finished. Buffer copies to and from Go slices are synchronous and not
// ordered after queued work: synchronize the stream first.
package fmha

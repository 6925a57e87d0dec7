package fmha

/*
#include <stdint.h>
#include <fmha.h>

// Stream handles cross into Go as integers: a host-backend stream is a small id, and Go must never
// hold such a value in a pointer-typed variable (the runtime rejects pointers below 4096).
static fmha_status go_fmha_stream_create(uintptr_t *stream) {
    fmha_stream_t s = NULL;
    fmha_status status = fmha_stream_create(&s);
    *stream = (uintptr_t)s;
    return status;
}
static fmha_status go_fmha_stream_destroy(uintptr_t stream) { return fmha_stream_destroy((fmha_stream_t)stream); }
static fmha_status go_fmha_stream_synchronize(uintptr_t stream) {
    return fmha_stream_synchronize((fmha_stream_t)stream);
}
*/
import "C"

import "sync"

// Stream is an in-order queue of device work (fmha_stream_t). A nil *Stream is the default stream.
// It is safe for concurrent use.
type Stream struct {
	mu     sync.Mutex
	handle C.uintptr_t
	closed bool
}

// NewStream creates a stream; Close destroys it.
func NewStream() (*Stream, error) {
	var handle C.uintptr_t
	if err := call("fmha_stream_create", func() C.fmha_status { return C.go_fmha_stream_create(&handle) }); err != nil {
		return nil, err
	}
	return &Stream{handle: handle}, nil
}

// native is the handle to pass to C (0 for the default stream), or an error naming op when the
// stream is closed.
func (s *Stream) native(op string) (C.uintptr_t, error) {
	if s == nil {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, invalidArgument(op, "stream", "closed")
	}
	return s.handle, nil
}

// Synchronize waits for the work queued on the stream and reports the first error of that work.
func (s *Stream) Synchronize() error {
	handle, err := s.native("Stream.Synchronize")
	if err != nil {
		return err
	}
	return call("fmha_stream_synchronize", func() C.fmha_status { return C.go_fmha_stream_synchronize(handle) })
}

// Close destroys the stream; work already queued on it still completes. Closing again, or closing
// the default (nil) stream, does nothing.
func (s *Stream) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	handle := s.handle
	s.mu.Unlock()
	return call("fmha_stream_destroy", func() C.fmha_status { return C.go_fmha_stream_destroy(handle) })
}

package fmha

/*
#include <fmha.h>
*/
import "C"

import "fmt"

// MaskType is the corner a mask's diagonal is aligned to (FMHA_MASK_*).
type MaskType int32

// The mask types.
const (
	// MaskNone keeps every key.
	MaskNone MaskType = C.FMHA_MASK_NONE
	// MaskTopLeft aligns the diagonal to the top-left corner: causal keeps key j <= row i.
	MaskTopLeft MaskType = C.FMHA_MASK_TOP_LEFT
	// MaskBottomRight aligns it to the bottom-right corner (flash-attn's causal): causal keeps
	// j <= i + seqlen_k - seqlen_q.
	MaskBottomRight MaskType = C.FMHA_MASK_BOTTOM_RIGHT
)

func (m MaskType) String() string {
	switch m {
	case MaskNone:
		return "none"
	case MaskTopLeft:
		return "top-left"
	case MaskBottomRight:
		return "bottom-right"
	}
	return fmt.Sprintf("MaskType(%d)", int32(m))
}

// Mask is a mask type with its window. The zero value is no mask; build others with Causal and
// Window.
type Mask struct {
	typ         MaskType
	windowed    bool
	left, right int
}

// Causal keeps each row's keys up to its diagonal, aligned to the corner of t.
func Causal(t MaskType) Mask { return Mask{typ: t, windowed: true, left: -1, right: 0} }

// Window keeps the keys from `left` before to `right` after each row's diagonal (-1: unbounded on
// that side), aligned to the corner of t. The library refuses a window with MaskNone.
func Window(t MaskType, left, right int) Mask {
	return Mask{typ: t, windowed: true, left: left, right: right}
}

// Type is the mask's corner.
func (m Mask) Type() MaskType { return m.typ }

// WindowSizes are the window's sides as the C ABI takes them (-1 = unbounded).
func (m Mask) WindowSizes() (left, right int) {
	if !m.windowed {
		return -1, -1
	}
	return m.left, m.right
}

func (m Mask) String() string {
	left, right := m.WindowSizes()
	switch {
	case m.typ == MaskNone && !m.windowed:
		return "none"
	case left == -1 && right == 0:
		return "causal " + m.typ.String()
	}
	return fmt.Sprintf("window(%d, %d) %v", left, right, m.typ)
}

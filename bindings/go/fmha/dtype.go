package fmha

/*
#include <fmha.h>
*/
import "C"

import (
	"fmt"
	"math"
)

// DType is an element type of the C ABI (FMHA_DTYPE_*).
type DType int32

// The element types. The fp8 formats are forward inputs only (their output is bf16): OCP E4M3FN
// (NVIDIA sm_90, AMD gfx950) and E4M3FNUZ (AMD gfx942); the host backend computes both.
const (
	FP16        DType = C.FMHA_DTYPE_FP16
	BF16        DType = C.FMHA_DTYPE_BF16
	FP32        DType = C.FMHA_DTYPE_FP32
	FP8E4M3FN   DType = C.FMHA_DTYPE_FP8_E4M3FN
	FP8E4M3FNUZ DType = C.FMHA_DTYPE_FP8_E4M3FNUZ
)

func (t DType) String() string {
	switch t {
	case FP16:
		return "fp16"
	case BF16:
		return "bf16"
	case FP32:
		return "fp32"
	case FP8E4M3FN:
		return "fp8_e4m3fn"
	case FP8E4M3FNUZ:
		return "fp8_e4m3fnuz"
	}
	return fmt.Sprintf("DType(%d)", int32(t))
}

// Size is the bytes of one element, 0 for a value that is not a type.
func (t DType) Size() int {
	switch t {
	case FP16, BF16:
		return 2
	case FP32:
		return 4
	case FP8E4M3FN, FP8E4M3FNUZ:
		return 1
	}
	return 0
}

// Bfloat16 is a bf16 value (the upper half of an IEEE float32), the element of BF16 tensors.
type Bfloat16 uint16

// Bfloat16From rounds f to the nearest bf16 (ties to even); NaN stays NaN.
func Bfloat16From(f float32) Bfloat16 {
	bits := math.Float32bits(f)
	if math.IsNaN(float64(f)) {
		return Bfloat16(bits>>16 | 0x40) // quiet: rounding could carry a NaN's low payload into inf
	}
	bits += 0x7FFF + (bits>>16)&1
	return Bfloat16(bits >> 16)
}

// Float32 is the exact value of x.
func (x Bfloat16) Float32() float32 { return math.Float32frombits(uint32(x) << 16) }

// Float16 is an IEEE binary16 value, the element of FP16 tensors.
type Float16 uint16

// Float16From rounds f to the nearest fp16 (ties to even): beyond the largest finite value it
// gives inf, below the smallest subnormal zero; NaN stays NaN.
func Float16From(f float32) Float16 {
	bits := math.Float32bits(f)
	sign := uint16(bits>>16) & 0x8000
	exponent := int(bits>>23) & 0xFF
	mantissa := bits & 0x7FFFFF
	switch {
	case exponent == 0xFF && mantissa != 0:
		return Float16(sign | 0x7E00)
	case exponent == 0xFF:
		return Float16(sign | 0x7C00)
	case exponent > 127+15: // 2^16 and above: past 65504 even before rounding
		return Float16(sign | 0x7C00)
	}
	// Keep `shift` low bits off the 24-bit significand: 13 for normal results, more for subnormal
	// ones (whose unit is 2^-24). A carry out of the kept bits moves into the exponent field, which
	// is the correct encoding (up to inf).
	significand := mantissa | 0x800000
	shift := uint(13)
	biased := uint32(exponent - 127 + 15)
	if exponent-127+15 <= 0 {
		shift = uint(126 - exponent)
		biased = 0
		if shift > 24 {
			return Float16(sign)
		}
	} else {
		significand = mantissa
	}
	kept := significand >> shift
	rest := significand & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rest > half || rest == half && kept&1 == 1 {
		kept++
	}
	return Float16(uint32(sign) | (biased<<10 + kept))
}

// Float32 is the exact value of x.
func (x Float16) Float32() float32 {
	sign := uint32(x&0x8000) << 16
	exponent := uint32(x>>10) & 0x1F
	mantissa := uint32(x) & 0x3FF
	switch exponent {
	case 0: // zero or subnormal: mantissa · 2^-24, exact in float32
		v := float32(mantissa) / (1 << 24)
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | mantissa<<13)
	}
	return math.Float32frombits(sign | (exponent-15+127)<<23 | mantissa<<13)
}

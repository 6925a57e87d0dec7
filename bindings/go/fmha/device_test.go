package fmha

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

func TestVersion(t *testing.T) {
	if err := CheckVersion(); err != nil {
		t.Fatal(err)
	}
	if Version() != HeaderVersion || VersionNumber() != HeaderVersionNumber {
		t.Errorf("library %s (%d), header %s (%d)", Version(), VersionNumber(), HeaderVersion, HeaderVersionNumber)
	}
	t.Logf("fmha %s, backend %v", Version(), LibraryBackend())
	registry, err := RegistryJSON()
	if err != nil {
		t.Fatal(err)
	}
	var instances []any
	if err := json.Unmarshal([]byte(registry), &instances); err != nil || len(instances) == 0 {
		t.Fatalf("registry %q: %v", registry, err)
	}
}

func TestDeviceRoundTrip(t *testing.T) {
	if n, err := DeviceCUCount(); err != nil || n <= 0 {
		t.Fatalf("DeviceCUCount() = %d, %v", n, err)
	}
	d := &device{t: t}
	defer d.close()
	in := make([]int32, 1<<16)
	for i := range in {
		in[i] = int32(i*7919 - 5)
	}
	a := upload(d, in)
	b := poisoned[int32](d, len(in)+3)
	if err := b.CopyFrom(a); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, len(in)+3)
	if err := b.Download(out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out[:len(in)], in) || out[len(in)] != -1 {
		t.Fatal("the copy through the device changed the data, or wrote past the source's length")
	}
	if err := a.CopyFrom(b); err == nil {
		t.Fatal("copying a longer buffer into a shorter one succeeded")
	}
}

func TestHalfPrecisionConversions(t *testing.T) {
	for bits := 0; bits < 1<<16; bits++ {
		h, b := Float16(bits), Bfloat16(bits)
		if f := h.Float32(); !math.IsNaN(float64(f)) && Float16From(f) != h {
			t.Fatalf("fp16 %#04x → %g → %#04x", bits, f, Float16From(f))
		}
		if f := b.Float32(); !math.IsNaN(float64(f)) && Bfloat16From(f) != b {
			t.Fatalf("bf16 %#04x → %g → %#04x", bits, f, Bfloat16From(f))
		}
	}
	for _, c := range []struct {
		in   float32
		want Float16
	}{
		{1 + 1.0/2048, 0x3C00},           // a tie rounds to even (down)
		{1 + 3.0/2048, 0x3C02},           // a tie rounds to even (up)
		{65520, 0x7C00},                  // halfway past the largest finite value: inf
		{65519, 0x7BFF},                  // below it: the largest finite value
		{float32(math.Ldexp(1, -25)), 0}, // half the smallest subnormal: a tie to zero
		{float32(math.Ldexp(3, -26)), 1}, // above it: the smallest subnormal
		{-2, 0xC000},
	} {
		if got := Float16From(c.in); got != c.want {
			t.Errorf("Float16From(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	nan := float32(math.NaN())
	if !math.IsNaN(float64(Float16From(nan).Float32())) || !math.IsNaN(float64(Bfloat16From(nan).Float32())) {
		t.Error("NaN does not stay NaN")
	}
	if got := Bfloat16From(1 + 1.0/256); got != 0x3F80 { // a tie rounds to even
		t.Errorf("Bfloat16From(1 + 2^-8) = %#04x", got)
	}
}

package fmha

import (
	"math"
	"math/rand"
	"testing"
	"time"
)

// Decode-style attention of 3 new tokens per sequence against a contiguous cache (one slot per
// sequence, slots swapped by CacheBatchIdx), causal from the bottom-right corner. Cache rows past a
// sequence's length hold NaN: reading one would show in O.
func TestKVCacheForward(t *testing.T) {
	const (
		headsQ, headsK, hdim, rows, capacity = 4, 2, 64, 3, 40
	)
	seqlenK := []int32{29, 40}
	slotOf := []int32{1, 0}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	d := &device{t: t}
	defer d.close()
	cd := codecOf(BF16)
	random := func(n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = roundTo(BF16, rng.Float64()*2-1)
		}
		return out
	}

	batch := len(seqlenK)
	q := random(batch * rows * headsQ * hdim) // [batch][row][head][dim]
	pool := func() ([]uint16, [][]float64) {
		packed := make([]uint16, len(slotOf)*capacity*headsK*hdim) // [slot][token][head][dim]
		for i := range packed {
			packed[i] = 0x7FC0 // NaN
		}
		dense := make([][]float64, batch) // per sequence [head][token][dim]
		for b, n := range seqlenK {
			dense[b] = random(headsK * int(n) * hdim)
			for h := 0; h < headsK; h++ {
				for j := 0; j < int(n); j++ {
					for c := 0; c < hdim; c++ {
						packed[((int(slotOf[b])*capacity+j)*headsK+h)*hdim+c] = cd.encode(dense[b][(h*int(n)+j)*hdim+c])
					}
				}
			}
		}
		return packed, dense
	}
	kPacked, kDense := pool()
	vPacked, vDense := pool()
	qBuf, kBuf, vBuf := upload(d, cd.encodeAll(q)), upload(d, kPacked), upload(d, vPacked)
	oBuf, lseBuf := poisoned[uint16](d, len(q)), poisoned[float32](d, batch*headsQ*rows)

	args := &KVCacheArgs{
		DType: BF16, HdimQ: hdim, HdimV: hdim, HeadsQ: headsQ, HeadsK: headsK, Mask: Causal(MaskBottomRight),
		TableKind: KVContiguous, PageSize: capacity, MaxSeqlenK: capacity,
		Q:     qBuf.Tensor(0, Strides{Batch: rows * headsQ * hdim, Head: hdim, Row: headsQ * hdim}),
		K:     kBuf.Tensor(0, Strides{Batch: capacity * headsK * hdim, Head: hdim, Row: headsK * hdim}),
		V:     vBuf.Tensor(0, Strides{Batch: capacity * headsK * hdim, Head: hdim, Row: headsK * hdim}),
		O:     oBuf.Tensor(0, Strides{Batch: rows * headsQ * hdim, Head: hdim, Row: headsQ * hdim}),
		LSE:   lseBuf.Tensor(0, Strides{Batch: headsQ * rows, Head: rows, Row: 1}),
		Batch: batch, SeqlenQ: rows, NumPages: len(slotOf),
		SeqlenK: upload(d, seqlenK), CacheBatchIdx: upload(d, slotOf),
	}
	size, err := KVCacheWorkspaceSize(args)
	if err != nil {
		t.Fatal(err)
	}
	args.Workspace = newBuffer[byte](d, size)
	if err := KVCacheForward(nil, args); err != nil {
		t.Fatal(err)
	}
	if err := (*Stream)(nil).Synchronize(); err != nil {
		t.Fatal(err)
	}

	o, lse := download16(t, oBuf, cd), download32(t, lseBuf)
	for b, n := range seqlenK {
		p := referenceProblem{hq: headsQ, hk: headsK, dq: hdim, dv: hdim, sq: rows, sk: int(n),
			scale: 1 / math.Sqrt(hdim), mask: Causal(MaskBottomRight)}
		var qb, ob, lseb []float64 // [head][row][dim], [head][row]
		for h := 0; h < headsQ; h++ {
			for r := 0; r < rows; r++ {
				at := ((b*rows+r)*headsQ + h) * hdim
				qb = append(qb, q[at:at+hdim]...)
				ob = append(ob, o[at:at+hdim]...)
				lseb = append(lseb, lse[(b*headsQ+h)*rows+r])
			}
		}
		o64, lse64 := p.forward(exact(), qb, kDense[b], vDense[b])
		oLow, lseLow := p.forward(inputPrecision(BF16), qb, kDense[b], vDense[b])
		if err, base, floor := maxError(ob, o64), maxError(oLow, o64), roundingFloor(o64, epsilon(BF16)); !(err <= 2*base+floor) {
			t.Errorf("O, sequence %d: max error %.3e > 2 × %.3e + %.3e", b, err, base, floor)
		}
		if err, base, floor := maxError(lseb, lse64), maxError(lseLow, lse64), roundingFloor(lse64, math.Ldexp(1, -20))+4*math.Ldexp(1, -22)*math.Sqrt(float64(n)); !(err <= 2*base+floor) {
			t.Errorf("LSE, sequence %d: max error %.3e > 2 × %.3e + %.3e", b, err, base, floor)
		}
	}
}

// Two fp32 states per (row, head) merge into their softmax-weighted mean, LSE = log Σ exp(LSE_s).
func TestMergeAttentionStates(t *testing.T) {
	const states, heads, rows, hdim = 2, 2, 5, 8
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	d := &device{t: t}
	defer d.close()
	oIn := make([]float32, states*heads*rows*hdim)
	lseIn := make([]float32, states*heads*rows)
	for i := range oIn {
		oIn[i] = float32(rng.Float64()*2 - 1)
	}
	for i := range lseIn {
		lseIn[i] = float32(rng.Float64()*6 - 3)
	}
	lseIn[heads*rows+1] = float32(math.Inf(-1)) // an empty state: weight 0
	oOut, lseOut := poisoned[float32](d, heads*rows*hdim), poisoned[float32](d, heads*rows)
	err := MergeAttentionStates(nil, &MergeArgs{
		NumStates: states, NumRows: rows, Heads: heads, Hdim: hdim, InDType: FP32, OutDType: FP32,
		LSEBase: LSENatural,
		OIn:     upload(d, oIn).Tensor(0, Strides{Batch: heads * rows * hdim, Head: rows * hdim, Row: hdim}),
		LSEIn:   upload(d, lseIn).Tensor(0, Strides{Batch: heads * rows, Head: rows, Row: 1}),
		OOut:    oOut.Tensor(0, Strides{Head: rows * hdim, Row: hdim}),
		LSEOut:  lseOut.Tensor(0, Strides{Head: rows, Row: 1}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := (*Stream)(nil).Synchronize(); err != nil {
		t.Fatal(err)
	}
	o, lse := download32(t, oOut), download32(t, lseOut)
	for hr := 0; hr < heads*rows; hr++ {
		l0, l1 := float64(lseIn[hr]), float64(lseIn[heads*rows+hr])
		m := math.Max(l0, l1)
		w0, w1 := math.Exp(l0-m), math.Exp(l1-m)
		if want := m + math.Log(w0+w1); math.Abs(lse[hr]-want) > 1e-5 {
			t.Errorf("LSE of (head, row) %d: %g, want %g", hr, lse[hr], want)
		}
		for c := 0; c < hdim; c++ {
			o1 := 0.0
			if w1 != 0 {
				o1 = float64(oIn[(heads*rows+hr)*hdim+c])
			}
			want := (w0*float64(oIn[hr*hdim+c]) + w1*o1) / (w0 + w1)
			if got := o[hr*hdim+c]; math.Abs(got-want) > 1e-5 {
				t.Errorf("O of (head, row) %d, column %d: %g, want %g", hr, c, got, want)
			}
		}
	}
}

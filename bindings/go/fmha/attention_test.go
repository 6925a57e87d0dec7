package fmha

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"
)

// attentionCase is a forward + backward problem. Batch mode lays tensors out as [batch][seq][head]
// [dim] (BSHD), varlen mode packs the sequences back to back as [rows][head][dim].
type attentionCase struct {
	dtype         DType
	mask          Mask
	headsQ        int
	headsK        int
	hdimQ, hdimV  int
	seqlens       [][2]int // (q rows, k rows) per sequence; batch mode: all equal
	varlen        bool
	deterministic bool
}

func (c attentionCase) String() string {
	mode := "batch"
	if c.varlen {
		mode = "varlen"
	}
	return fmt.Sprintf("%v %s heads %d/%d hdim %d/%d %v seqlens %v deterministic %v", c.dtype, mode, c.headsQ,
		c.headsK, c.hdimQ, c.hdimV, c.mask, c.seqlens, c.deterministic)
}

// starts are the sequences' first rows of q (side 0) or k (side 1) in the packed layout, and the
// total in the last entry.
func (c attentionCase) starts(side int) []int32 {
	starts := []int32{0}
	for _, s := range c.seqlens {
		starts = append(starts, starts[len(starts)-1]+int32(s[side]))
	}
	return starts
}

func (c attentionCase) shape() Shape {
	s := Shape{Batch: len(c.seqlens), HeadsQ: c.headsQ, HeadsK: c.headsK, HdimQ: c.hdimQ, HdimV: c.hdimV}
	if !c.varlen {
		s.SeqlenQ, s.SeqlenK = c.seqlens[0][0], c.seqlens[0][1]
		return s
	}
	q, k := c.starts(0), c.starts(1)
	s.SeqlenQ, s.SeqlenK = int(q[len(q)-1]), int(k[len(k)-1])
	for _, l := range c.seqlens {
		s.MaxSeqlenQ = maxInt(s.MaxSeqlenQ, l[0])
		s.MaxSeqlenK = maxInt(s.MaxSeqlenK, l[1])
	}
	return s
}

// layout maps the dense per-sequence [head][row][dim] arrays of one operand to its device tensor.
type layout struct {
	c       attentionCase
	side    int // 0: q rows, 1: k rows
	heads   int
	dim     int
	strides Strides
}

func (c attentionCase) layout(side, heads, dim int) layout {
	if c.varlen {
		return layout{c, side, heads, dim, Strides{Batch: 0, Head: dim, Row: heads * dim}}
	}
	rows := c.seqlens[0][side]
	return layout{c, side, heads, dim, Strides{Batch: rows * heads * dim, Head: dim, Row: heads * dim}}
}

// lseLayout is the fp32 [batch][heads][rows] (varlen: [heads][total rows]) layout, row stride 1.
func (c attentionCase) lseLayout() layout {
	if c.varlen {
		total := int(c.starts(0)[len(c.seqlens)])
		return layout{c, 0, c.headsQ, 1, Strides{Batch: 0, Head: total, Row: 1}}
	}
	rows := c.seqlens[0][0]
	return layout{c, 0, c.headsQ, 1, Strides{Batch: c.headsQ * rows, Head: rows, Row: 1}}
}

func (l layout) size() int {
	if l.c.varlen {
		total := int(l.c.starts(l.side)[len(l.c.seqlens)])
		return total * l.heads * l.dim
	}
	return len(l.c.seqlens) * l.strides.Batch
}

// index is the element of (sequence b, head h, row r, column d).
func (l layout) index(b, h, r, d int) int {
	if l.c.varlen {
		r += int(l.c.starts(l.side)[b])
	}
	return b*l.strides.Batch + h*l.strides.Head + r*l.strides.Row + d
}

func (l layout) rows(b int) int { return l.c.seqlens[b][l.side] }

// pack scatters dense per-sequence values into the packed array.
func (l layout) pack(dense [][]float64, encode func(float64) uint16) []uint16 {
	out := make([]uint16, l.size())
	for b, values := range dense {
		for h := 0; h < l.heads; h++ {
			for r := 0; r < l.rows(b); r++ {
				for d := 0; d < l.dim; d++ {
					out[l.index(b, h, r, d)] = encode(values[(h*l.rows(b)+r)*l.dim+d])
				}
			}
		}
	}
	return out
}

// unpack gathers sequence b as a dense [head][row][dim] array.
func (l layout) unpack(b int, packed []float64) []float64 {
	out := make([]float64, 0, l.heads*l.rows(b)*l.dim)
	for h := 0; h < l.heads; h++ {
		for r := 0; r < l.rows(b); r++ {
			for d := 0; d < l.dim; d++ {
				out = append(out, packed[l.index(b, h, r, d)])
			}
		}
	}
	return out
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// codec is a 16-bit dtype's conversion.
type codec struct {
	encode func(float64) uint16
	decode func(uint16) float64
}

func codecOf(t DType) codec {
	if t == FP16 {
		return codec{
			func(x float64) uint16 { return uint16(Float16From(float32(x))) },
			func(x uint16) float64 { return float64(Float16(x).Float32()) },
		}
	}
	return codec{
		func(x float64) uint16 { return uint16(Bfloat16From(float32(x))) },
		func(x uint16) float64 { return float64(Bfloat16(x).Float32()) },
	}
}

func (c codec) encodeAll(values []float64) []uint16 {
	out := make([]uint16, len(values))
	for i, x := range values {
		out[i] = c.encode(x)
	}
	return out
}

// device holds a case's buffers; close releases them.
type device struct {
	t       *testing.T
	buffers []interface{ Close() error }
}

func newBuffer[T Element](d *device, n int) *Buffer[T] {
	d.t.Helper()
	b, err := NewBuffer[T](n)
	if err != nil {
		d.t.Fatal(err)
	}
	d.buffers = append(d.buffers, b)
	return b
}

// upload is a new buffer holding values.
func upload[T Element](d *device, values []T) *Buffer[T] {
	d.t.Helper()
	b := newBuffer[T](d, len(values))
	if err := b.Upload(values); err != nil {
		d.t.Fatal(err)
	}
	return b
}

// poisoned is a new buffer of NaNs (all bits set), so that unwritten outputs show.
func poisoned[T Element](d *device, n int) *Buffer[T] {
	d.t.Helper()
	b := newBuffer[T](d, n)
	if err := b.Fill(0xFF); err != nil {
		d.t.Fatal(err)
	}
	return b
}

func download16(t *testing.T, b *Buffer[uint16], c codec) []float64 {
	t.Helper()
	raw := make([]uint16, b.Len())
	if err := b.Download(raw); err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(raw))
	for i, x := range raw {
		out[i] = c.decode(x)
	}
	return out
}

func download32(t *testing.T, b *Buffer[float32]) []float64 {
	t.Helper()
	raw := make([]float32, b.Len())
	if err := b.Download(raw); err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(raw))
	for i, x := range raw {
		out[i] = float64(x)
	}
	return out
}

func (d *device) close() {
	for _, b := range d.buffers {
		if err := b.Close(); err != nil {
			d.t.Error(err)
		}
	}
}

// randomDense is one operand of every sequence, uniform in [-1, 1) and representable in dtype.
func randomDense(rng *rand.Rand, c attentionCase, side, heads, dim int) [][]float64 {
	out := make([][]float64, len(c.seqlens))
	for b, l := range c.seqlens {
		out[b] = make([]float64, heads*l[side]*dim)
		for i := range out[b] {
			out[b][i] = roundTo(c.dtype, rng.Float64()*2-1)
		}
	}
	return out
}

func flatten(perSequence [][]float64) []float64 {
	var all []float64
	for _, values := range perSequence {
		all = append(all, values...)
	}
	return all
}

// checkRule applies the field's error rule to one output of every sequence.
func checkRule(t *testing.T, c attentionCase, what string, kernel, exact, samePrecision [][]float64, factor, floor float64) {
	t.Helper()
	for b := range kernel {
		err, base := maxError(kernel[b], exact[b]), maxError(samePrecision[b], exact[b])
		if !(err <= factor*base+floor) {
			t.Errorf("%s, sequence %d: max error %.3e > %g × %.3e (same-precision error) + %.3e; case %v",
				what, b, err, factor, base, floor, c)
		}
	}
}

func runAttention(t *testing.T, c attentionCase, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	d := &device{t: t}
	defer d.close()
	stream, err := NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()

	qL, kL, vL := c.layout(0, c.headsQ, c.hdimQ), c.layout(1, c.headsK, c.hdimQ), c.layout(1, c.headsK, c.hdimV)
	oL, lseL := c.layout(0, c.headsQ, c.hdimV), c.lseLayout()
	q, k, v := randomDense(rng, c, 0, c.headsQ, c.hdimQ), randomDense(rng, c, 1, c.headsK, c.hdimQ),
		randomDense(rng, c, 1, c.headsK, c.hdimV)
	dO := randomDense(rng, c, 0, c.headsQ, c.hdimV)
	cd := codecOf(c.dtype)
	qBuf, kBuf, vBuf := upload(d, qL.pack(q, cd.encode)), upload(d, kL.pack(k, cd.encode)), upload(d, vL.pack(v, cd.encode))
	dOBuf := upload(d, oL.pack(dO, cd.encode))
	oBuf, lseBuf := poisoned[uint16](d, oL.size()), poisoned[float32](d, lseL.size())
	dqBuf, dkBuf, dvBuf := poisoned[uint16](d, qL.size()), poisoned[uint16](d, kL.size()), poisoned[uint16](d, vL.size())
	dBuf := poisoned[float32](d, lseL.size())
	shape := c.shape()
	var varlen *Varlen
	if c.varlen {
		varlen = &Varlen{SeqstartQ: upload(d, c.starts(0)), SeqstartK: upload(d, c.starts(1))}
	}

	err = Forward(stream, &ForwardArgs{
		DType: c.dtype, Shape: shape, Varlen: varlen, Mask: c.mask,
		Q: qBuf.Tensor(0, qL.strides), K: kBuf.Tensor(0, kL.strides), V: vBuf.Tensor(0, vL.strides),
		O: oBuf.Tensor(0, oL.strides), LSE: lseBuf.Tensor(0, lseL.strides),
	})
	if err != nil {
		t.Fatal(err)
	}

	traits := BackwardTraits{DType: c.dtype, Shape: shape, Varlen: c.varlen, Mask: c.mask, Deterministic: c.deterministic}
	launcher, err := NewBackward(traits)
	if err != nil {
		t.Fatal(err)
	}
	defer launcher.Close()
	size, err := launcher.WorkspaceSize()
	if err != nil {
		t.Fatal(err)
	}
	workspace := newBuffer[byte](d, size)
	var seqstartQ, seqstartK []int32
	if c.varlen {
		seqstartQ, seqstartK = c.starts(0), c.starts(1)
	}
	if err := launcher.PrepareWorkspace(workspace, seqstartQ, seqstartK); err != nil {
		t.Fatal(err)
	}
	err = launcher.Run(stream, &BackwardArgs{
		Varlen: varlen,
		Q:      qBuf.Tensor(0, qL.strides), K: kBuf.Tensor(0, kL.strides), V: vBuf.Tensor(0, vL.strides),
		O: oBuf.Tensor(0, oL.strides), LSE: lseBuf.Tensor(0, lseL.strides), DO: dOBuf.Tensor(0, oL.strides),
		D:  dBuf.Tensor(0, lseL.strides),
		DQ: dqBuf.Tensor(0, qL.strides), DK: dkBuf.Tensor(0, kL.strides), DV: dvBuf.Tensor(0, vL.strides),
		Workspace: workspace,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Synchronize(); err != nil {
		t.Fatal(err)
	}

	o, lse := download16(t, oBuf, cd), download32(t, lseBuf)
	dq, dk, dv := download16(t, dqBuf, cd), download16(t, dkBuf, cd), download16(t, dvBuf, cd)
	var got, exactOut, lowOut [5][][]float64 // O, LSE, dQ, dK, dV by sequence
	maxKeys := 0
	for b, l := range c.seqlens {
		maxKeys = maxInt(maxKeys, l[1])
		p := referenceProblem{hq: c.headsQ, hk: c.headsK, dq: c.hdimQ, dv: c.hdimV, sq: l[0], sk: l[1],
			scale: 1 / math.Sqrt(float64(c.hdimQ)), mask: c.mask}
		for i, pr := range []precision{exact(), inputPrecision(c.dtype)} {
			fo, flse := p.forward(pr, q[b], k[b], v[b])
			gq, gk, gv := p.backward(pr, q[b], k[b], v[b], dO[b])
			results := &exactOut
			if i == 1 {
				results = &lowOut
			}
			for j, r := range [][]float64{fo, flse, gq, gk, gv} {
				results[j] = append(results[j], r)
			}
		}
		for j, r := range [][]float64{oL.unpack(b, o), lseL.unpack(b, lse), qL.unpack(b, dq), kL.unpack(b, dk), vL.unpack(b, dv)} {
			got[j] = append(got[j], r)
		}
	}
	eps := epsilon(c.dtype)
	checkRule(t, c, "O", got[0], exactOut[0], lowOut[0], 2, roundingFloor(flatten(exactOut[0]), eps))
	// LSE is fp32; a GPU's exp2 unit adds about 2^-22 per probability, summed like a random walk
	// (the Rust tests' floor).
	lseFloor := roundingFloor(flatten(exactOut[1]), math.Ldexp(1, -20)) + 4*math.Ldexp(1, -22)*math.Sqrt(float64(maxKeys))
	checkRule(t, c, "LSE", got[1], exactOut[1], lowOut[1], 2, lseFloor)
	for j, name := range []string{"dQ", "dK", "dV"} {
		checkRule(t, c, name, got[2+j], exactOut[2+j], lowOut[2+j], 3, roundingFloor(flatten(exactOut[2+j]), eps))
	}
}

func TestForwardBackward(t *testing.T) {
	cases := []attentionCase{
		{dtype: BF16, mask: Causal(MaskTopLeft), headsQ: 4, headsK: 2, hdimQ: 64, hdimV: 64,
			seqlens: [][2]int{{40, 56}, {40, 56}}},
		{dtype: FP16, headsQ: 2, headsK: 2, hdimQ: 64, hdimV: 64, seqlens: [][2]int{{33, 33}}, deterministic: true},
		{dtype: BF16, mask: Causal(MaskBottomRight), headsQ: 4, headsK: 1, hdimQ: 64, hdimV: 64,
			seqlens: [][2]int{{17, 30}, {0, 12}, {45, 45}}, varlen: true, deterministic: true},
		{dtype: FP16, mask: Window(MaskTopLeft, 8, 4), headsQ: 2, headsK: 1, hdimQ: 128, hdimV: 128,
			seqlens: [][2]int{{24, 20}, {9, 31}}, varlen: true},
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	for i, c := range cases {
		c := c
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Logf("%v", c)
			runAttention(t, c, seed+int64(i))
		})
	}
}

package fmha

import "math"

// The float64 attention reference of one sequence, and the field's error rule (design.md,
// "Correctness rules"; a port of src/reference.rs): a kernel's max error against the float64
// result is at most 2× (outputs) / 3× (gradients) the error of the same computation done in the
// input precision, plus a small absolute floor.
//
// Layouts are dense: q [hq][sq][dq], k [hk][sk][dq], v [hk][sk][dv], o and dO [hq][sq][dv],
// lse [hq][sq], dq like q, dk like k, dv like v.

// precision is float64 arithmetic, or the input precision as the kernels compute: f32
// intermediates, P and dS rounded to dtype as GEMM operands, outputs rounded to dtype.
type precision struct {
	low   bool
	dtype DType
}

func exact() precision                 { return precision{} }
func inputPrecision(t DType) precision { return precision{low: true, dtype: t} }

// acc is an intermediate result.
func (p precision) acc(x float64) float64 {
	if p.low {
		return float64(float32(x))
	}
	return x
}

// operand is a GEMM operand or an output.
func (p precision) operand(x float64) float64 {
	if p.low {
		return roundTo(p.dtype, x)
	}
	return x
}

// roundTo is x rounded to a 16-bit dtype.
func roundTo(t DType, x float64) float64 {
	if t == FP16 {
		return float64(Float16From(float32(x)).Float32())
	}
	return float64(Bfloat16From(float32(x)).Float32())
}

type referenceProblem struct {
	hq, hk, dq, dv int
	sq, sk         int
	scale          float64
	mask           Mask
}

// kept says whether (row i, key j) takes part in the softmax (src/problem/mask.rs).
func (p referenceProblem) kept(i, j int) bool {
	if p.mask.Type() == MaskNone {
		return true
	}
	topLeft := p.mask.Type() == MaskTopLeft
	unbounded := func(w, topLeftAll, bottomRightAll int) int {
		switch {
		case w >= 0:
			return w
		case topLeft:
			return topLeftAll
		}
		return bottomRightAll
	}
	l, r := p.mask.WindowSizes()
	left := unbounded(l, p.sq-1, p.sk-1)
	right := unbounded(r, p.sk-1, p.sq-1)
	offset := 0
	if !topLeft {
		offset = p.sk - p.sq
	}
	return i+offset-left <= j && j <= i+offset+right
}

// softmaxRow is the probabilities of row i of q-head h ([sk], 0 where masked) and its LSE.
func (p referenceProblem) softmaxRow(pr precision, q, k []float64, h, i int) ([]float64, float64) {
	kv := h / (p.hq / p.hk)
	qRow := q[(h*p.sq+i)*p.dq:][:p.dq]
	scale := pr.acc(p.scale)
	scores := make([]float64, p.sk)
	largest := math.Inf(-1)
	for j := range scores {
		scores[j] = math.NaN() // masked
		if !p.kept(i, j) {
			continue
		}
		kRow := k[(kv*p.sk+j)*p.dq:][:p.dq]
		s := 0.0
		for c := range qRow {
			s = pr.acc(s + pr.acc(qRow[c]*kRow[c]))
		}
		scores[j] = pr.acc(scale * s)
		largest = math.Max(largest, scores[j])
	}
	probabilities := make([]float64, p.sk)
	if math.IsInf(largest, -1) {
		return probabilities, largest
	}
	sum := 0.0
	for _, s := range scores {
		if !math.IsNaN(s) {
			sum = pr.acc(sum + pr.acc(math.Exp(pr.acc(s-largest))))
		}
	}
	lse := pr.acc(largest + pr.acc(math.Log(sum)))
	for j, s := range scores {
		if !math.IsNaN(s) {
			probabilities[j] = pr.acc(math.Exp(pr.acc(s - lse)))
		}
	}
	return probabilities, lse
}

func (p referenceProblem) outputRow(pr precision, v, probabilities []float64, h int) []float64 {
	kv := h / (p.hq / p.hk)
	o := make([]float64, p.dv)
	for d := range o {
		acc := 0.0
		for j, pj := range probabilities {
			acc = pr.acc(acc + pr.acc(pr.operand(pj)*v[(kv*p.sk+j)*p.dv+d]))
		}
		o[d] = pr.operand(acc)
	}
	return o
}

func (p referenceProblem) forward(pr precision, q, k, v []float64) (o, lse []float64) {
	for h := 0; h < p.hq; h++ {
		for i := 0; i < p.sq; i++ {
			probabilities, l := p.softmaxRow(pr, q, k, h, i)
			o = append(o, p.outputRow(pr, v, probabilities, h)...)
			lse = append(lse, l)
		}
	}
	return o, lse
}

// backward is the gradients for dO: D = rowsum(dO∘O), dS = P∘(dO·Vᵀ − D), dQ = scale·dS·K,
// dK = scale·dSᵀ·Q, dV = Pᵀ·dO, dK and dV summed over the q-heads of each kv head.
func (p referenceProblem) backward(pr precision, q, k, v, dO []float64) (dq, dk, dv []float64) {
	dq = make([]float64, p.hq*p.sq*p.dq)
	dk = make([]float64, p.hk*p.sk*p.dq)
	dv = make([]float64, p.hk*p.sk*p.dv)
	scale := pr.acc(p.scale)
	dkHead := make([]float64, p.sk*p.dq)
	dvHead := make([]float64, p.sk*p.dv)
	for h := 0; h < p.hq; h++ {
		kv := h / (p.hq / p.hk)
		for i := range dkHead {
			dkHead[i] = 0
		}
		for i := range dvHead {
			dvHead[i] = 0
		}
		for i := 0; i < p.sq; i++ {
			probabilities, _ := p.softmaxRow(pr, q, k, h, i)
			o := p.outputRow(pr, v, probabilities, h)
			g := dO[(h*p.sq+i)*p.dv:][:p.dv]
			qRow := q[(h*p.sq+i)*p.dq:][:p.dq]
			bigD := 0.0
			for c := range g {
				bigD = pr.acc(bigD + pr.acc(g[c]*o[c]))
			}
			dqRow := make([]float64, p.dq)
			for j, pj := range probabilities {
				if pj == 0 {
					continue
				}
				vRow := v[(kv*p.sk+j)*p.dv:][:p.dv]
				kRow := k[(kv*p.sk+j)*p.dq:][:p.dq]
				dp := 0.0
				for c := range g {
					dp = pr.acc(dp + pr.acc(g[c]*vRow[c]))
				}
				ds := pr.operand(pr.acc(pj * pr.acc(dp-bigD)))
				pOperand := pr.operand(pj)
				for c := 0; c < p.dq; c++ {
					dqRow[c] = pr.acc(dqRow[c] + pr.acc(ds*kRow[c]))
					dkHead[j*p.dq+c] = pr.acc(dkHead[j*p.dq+c] + pr.acc(ds*qRow[c]))
				}
				for c := 0; c < p.dv; c++ {
					dvHead[j*p.dv+c] = pr.acc(dvHead[j*p.dv+c] + pr.acc(pOperand*g[c]))
				}
			}
			for c, acc := range dqRow {
				dq[(h*p.sq+i)*p.dq+c] = pr.operand(pr.acc(acc * scale))
			}
		}
		for i, acc := range dkHead {
			dk[kv*p.sk*p.dq+i] = pr.acc(dk[kv*p.sk*p.dq+i] + pr.acc(acc*scale))
		}
		for i, acc := range dvHead {
			dv[kv*p.sk*p.dv+i] = pr.acc(dv[kv*p.sk*p.dv+i] + acc)
		}
	}
	for _, g := range [][]float64{dk, dv} {
		for i := range g {
			g[i] = pr.operand(g[i])
		}
	}
	return dq, dk, dv
}

// maxError is the largest |a - b|; a NaN on one side only is infinite.
func maxError(a, b []float64) float64 {
	worst := 0.0
	for i := range a {
		switch {
		case a[i] == b[i]:
		case math.IsNaN(a[i]) || math.IsNaN(b[i]):
			return math.Inf(1)
		default:
			worst = math.Max(worst, math.Abs(a[i]-b[i]))
		}
	}
	return worst
}

// roundingFloor is a quarter of eps times the largest finite reference magnitude: the rounding
// noise of one output element.
func roundingFloor(exact []float64, eps float64) float64 {
	largest := 1e-3
	for _, x := range exact {
		if !math.IsInf(x, 0) {
			largest = math.Max(largest, math.Abs(x))
		}
	}
	return 0.25 * eps * largest
}

func epsilon(t DType) float64 {
	if t == FP16 {
		return math.Ldexp(1, -10)
	}
	return math.Ldexp(1, -7)
}

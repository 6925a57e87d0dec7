package fmha_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/fmha/fmha/bindings/go/fmha"
)

// A causal bf16 forward of one sequence with 2 query heads sharing 1 kv head, in [seq][head][dim]
// layout. Every value row is the same, so every output row equals it.
func Example() {
	const seq, headsQ, headsK, dim = 16, 2, 1, 64
	q := make([]fmha.Bfloat16, seq*headsQ*dim)
	k := make([]fmha.Bfloat16, seq*headsK*dim)
	v := make([]fmha.Bfloat16, seq*headsK*dim)
	for i := range q {
		q[i] = fmha.Bfloat16From(float32(i%7) / 7)
	}
	for i := range k {
		k[i] = fmha.Bfloat16From(float32(i%5) / 5)
		v[i] = fmha.Bfloat16From(0.25 * float32(i%dim))
	}

	upload := func(host []fmha.Bfloat16) *fmha.Buffer[fmha.Bfloat16] {
		b, err := fmha.NewBuffer[fmha.Bfloat16](len(host))
		if err != nil {
			log.Fatal(err)
		}
		if err := b.Upload(host); err != nil {
			log.Fatal(err)
		}
		return b
	}
	qDev, kDev, vDev := upload(q), upload(k), upload(v)
	defer qDev.Close()
	defer kDev.Close()
	defer vDev.Close()
	oDev, err := fmha.NewBuffer[fmha.Bfloat16](len(q))
	if err != nil {
		log.Fatal(err)
	}
	defer oDev.Close()
	stream, err := fmha.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Close()

	qo := fmha.Strides{Batch: seq * headsQ * dim, Head: dim, Row: headsQ * dim}
	kv := fmha.Strides{Batch: seq * headsK * dim, Head: dim, Row: headsK * dim}
	err = fmha.Forward(stream, &fmha.ForwardArgs{
		DType: fmha.BF16,
		Shape: fmha.Shape{Batch: 1, SeqlenQ: seq, SeqlenK: seq, HeadsQ: headsQ, HeadsK: headsK, HdimQ: dim, HdimV: dim},
		Mask:  fmha.Causal(fmha.MaskTopLeft),
		Q:     qDev.Tensor(0, qo), K: kDev.Tensor(0, kv), V: vDev.Tensor(0, kv), O: oDev.Tensor(0, qo),
	})
	if err == nil {
		err = stream.Synchronize()
	}
	if err != nil {
		log.Fatal(err)
	}
	o := make([]fmha.Bfloat16, len(q))
	if err := oDev.Download(o); err != nil {
		log.Fatal(err)
	}
	fmt.Println("row 5, head 1, columns 0..3:", o[(5*headsQ+1)*dim].Float32(), o[(5*headsQ+1)*dim+1].Float32(),
		o[(5*headsQ+1)*dim+2].Float32(), o[(5*headsQ+1)*dim+3].Float32())

	// A bad field is an *Error whose status matches with errors.Is and whose message names it.
	err = fmha.Forward(stream, &fmha.ForwardArgs{DType: fmha.DType(42)})
	var e *fmha.Error
	fmt.Println(errors.Is(err, fmha.ErrInvalidArgument), errors.As(err, &e) && e.Op == "fmha_fwd")
	// Output:
	// row 5, head 1, columns 0..3: 0 0.25 0.5 0.75
	// true true
}

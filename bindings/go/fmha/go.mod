module github.com/fmha/fmha/bindings/go/fmha

go 1.19

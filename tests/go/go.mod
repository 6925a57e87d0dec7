module fmha_test

go 1.19

"""`python -m fmha.bench`: its reading of fmha-bench's matrices and counts (no PyTorch needed: the wheel
stage of scripts/test.sh runs these), and a run beside SDPA's math backend whose differences are checked
and reported (a wrong rival output fails the run)."""

import json
import os

import pytest

from fmha import bench


def test_shipped_matrices_load_and_name_fmha_bench_fields():
    for name in ("smoke", "full", "nightly"):
        cases = bench.load_matrix(name)
        assert cases and all(set(c) == set(bench.FIELDS) for c in cases), name
    smoke = bench.load_matrix("smoke")
    assert {c["op"] for c in smoke} == {"fwd", "bwd", "kvcache"}
    assert any(c["varlen"] for c in smoke) and any(c["deterministic"] for c in smoke)


def test_groups_expand_like_fmha_bench(tmp_path):
    """The same product and `tokens` rule as tools/fmha-bench/src/matrix.rs (its test has these numbers)."""
    path = tmp_path / "m.toml"
    path.write_text('[[group]]\nop = ["fwd", "bwd"]\ndtype = ["bf16"]\nheads = ["8/2"]\nhdim = ["128", "192/128"]\n'
                    'seqlen = ["100", "1/300"]\ntokens = [400]\nmask = ["0", "b"]\n')
    cases = bench.load_matrix(str(path))
    assert len(cases) == 16
    c = next(c for c in cases if c["seqlen_q"] == 1 and c["hdim_q"] == 192)
    assert (c["batch"], c["seqlen_k"], c["hdim_v"], c["nhead_q"], c["nhead_k"]) == (400, 300, 128, 8, 2)
    assert next(c for c in cases if c["seqlen_q"] == 100)["batch"] == 4
    # varlen spreads the lengths as fmha-bench does
    c = dict(cases[0], batch=4, seqlen_q=10, seqlen_k=7, varlen=True)
    assert bench.seqlens(c) == [(3, 2), (5, 4), (8, 6), (10, 7)]


@pytest.mark.parametrize("text", ['dtype = ["int4"]', 'colour = ["red"]', 'tokens = [5]'])
def test_bad_matrices_name_the_field(tmp_path, text):
    base = 'op = ["fwd"]\ndtype = ["bf16"]\nheads = ["8"]\nhdim = ["64"]\nseqlen = ["64"]\nbatch = [1]\n'
    if text.startswith("dtype"):
        base = base.replace('dtype = ["bf16"]\n', "")
    path = tmp_path / "bad.toml"
    path.write_text("[[group]]\n" + base + text + "\n")
    with pytest.raises(SystemExit, match=text.split(" ")[0] if not text.startswith("tokens") else "batch and tokens"):
        bench.load_matrix(str(path))


def test_masks_and_counts():
    assert bench.parse_mask("0") == ("none", -1, -1)
    assert bench.parse_mask("b") == ("bottom_right", -1, 0)
    assert bench.parse_mask("t:3,1") == ("top_left", 3, 1)
    assert bench.parse_mask("xb:5") == ("bottom_right", 2, 2)
    with pytest.raises(ValueError, match="mask"):
        bench.parse_mask("g:1,2")
    case = dict(op="fwd", dtype="bf16", batch=1, nhead_q=2, nhead_k=1, hdim_q=8, hdim_v=4, seqlen_q=4, seqlen_k=6,
                mask="b", varlen=False, deterministic=False, page_size=0, table="")
    # bottom-right causal over 4 x 6: rows keep 3, 4, 5, 6 keys
    assert bench.kept_pairs(case) == 18
    flops, nbytes = bench.work(case)
    assert flops == 2.0 * 18 * 2 * (8 + 4)
    assert nbytes == 4 * 2 * 8 * 2 + 6 * 1 * 12 * 2 + 4 * 2 * 4 * 2
    assert bench.kept_pairs(dict(case, mask="t:1,0")) == 1 + 2 + 2 + 2


def test_a_run_checks_every_rival_against_fmha(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if bench.L.backend() != bench.L.BACKEND_HOST:
        pytest.skip("the host backend run (SDPA math on CPU tensors)")
    path = tmp_path / "m.toml"
    path.write_text('[[group]]\nop = ["fwd", "bwd"]\ndtype = ["bf16"]\nheads = ["4/2"]\nhdim = ["64"]\n'
                    'seqlen = ["33/47"]\nbatch = [2]\nmask = ["0", "b:8,0"]\n')
    out = tmp_path / "out.json"
    args = ["--matrix", str(path), "--impl", "fmha,sdpa_math", "--repeat", "1", "--warmup", "0", "--json", str(out)]
    assert bench.main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    rivals = [r for r in rows if r["impl"] == "sdpa_math"]
    assert len(rivals) == 4 and all(r["status"] == "ok" and r["max_abs_diff"] < 0.05 for r in rivals), rivals
    # A rival whose output is wrong is reported and fails the run.
    real = bench.Problem._dense

    def wrong(self, impl):
        fn = real(self, impl)
        return (lambda: fn() * 1.5) if impl == "sdpa_math" else fn

    monkeypatch.setattr(bench.Problem, "_dense", wrong)
    assert bench.main(args + ["--filter", "op=fwd"]) == 1
    assert any(r.get("mismatch") for r in json.loads(out.read_text())["rows"])

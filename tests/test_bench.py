"""The benchmark programs stay runnable: every bench/*.py compiles, and bench_model's dry run (no GPU: a small model
in the Q4_K_M mix written as GGUF, read back, planned for an H200) names a kernel for every tensor; bench_gemv's
command line, dry run and decode-loop table (decode_loop.py, bench_op's decode loop too) from made-up timings."""
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_programs_compile(script, tmp_path):
    py_compile.compile(str(BENCH / script), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_bench_model_dry_run_plans_every_tensor_of_the_q4_k_m_mix():
    out = subprocess.run([sys.executable, "bench_model.py", "--dry-run", "--layers", "1"], cwd=BENCH,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if " T=" in line]
    assert len(lines) == 2 * 8  # 7 tensors of the layer and the output, at T = 1 and T = 512
    assert any("q6_K" in line and "gemv_q6_k_f32_t1" in line for line in lines)  # attn_v / ffn_down / output
    assert any("mmq_q6_k_wgmma_ra" in line for line in lines)  # their prefill (register-A GEMM: K a multiple of 2048)


def test_bench_moe_dry_run_plans_both_expert_shapes_and_checks_the_reference():
    out = subprocess.run([sys.executable, "bench_moe.py", "--dry-run"], cwd=BENCH, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "128 experts top-8 768×2048" in out.stdout and "32 experts top-4 1792×2048" in out.stdout
    cells = [line for line in out.stdout.splitlines() if " T=" in line and "experts used" in line]
    assert len(cells) == 2 * 6  # both shapes at T = 1, 8, 32, 64, 128, 512
    assert "gemv_q4_k_f32_id" in out.stdout and out.stdout.count(": ok") == 2  # x (T, K) and (T, top, K)


def test_the_sanitizer_sweep_reaches_every_dispatchable_kernel():
    """bench/sanitize.py, the program compute-sanitizer runs (#35's memcheck / racecheck / synccheck), planned on the
    stand-in H200: every emitted sm_90a / sm_89 kernel a plan can dispatch is in some call of the sweep — the fp16-x
    twins, the cluster split-K GEMMs and mul_mat_id's fp16 routes included — so a new build cannot ship unswept."""
    out = subprocess.run([sys.executable, "sanitize.py", "--plan"], cwd=BENCH, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    missing = next(line for line in out.stdout.splitlines() if line.startswith("not reached:"))
    assert missing.startswith("not reached: none "), missing


@pytest.fixture
def bench_modules(monkeypatch):
    """(bench_gemv, decode_loop), imported from bench/ as the scripts import each other."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_gemv
    import decode_loop

    return bench_gemv, decode_loop


def test_bench_gemv_parses_formats_shapes_tokens_and_modes(bench_modules):
    bench_gemv, _ = bench_modules
    args = bench_gemv.parse([])
    assert args.formats == list(bench_gemv.FORMATS) and args.shapes is None
    assert args.tokens == [1, 2, 4, 8] and args.modes == ["exact", "fast"] and not args.isolated
    default = bench_gemv.cases(args)  # #36's shapes among each format's defaults
    for case in [(f, 4096, 14336) for f in ("q4_K", "q5_K", "q6_K", "q8_0")] + [("tq4_1s", 3584, 18944)]:
        assert case in default
    assert [c for c in default if c[0] == "q4_K"] == [("q4_K", 4096, 14336), ("q4_K", 14336, 4096)]
    args = bench_gemv.parse(["--formats", "q8_0,tq4_1s", "--shapes", "4096x14336,3584x18944", "--tokens", "1,8",
                             "--modes", "fast", "--isolated"])
    assert bench_gemv.cases(args) == [("q8_0", 4096, 14336), ("q8_0", 3584, 18944), ("tq4_1s", 4096, 14336),
                                      ("tq4_1s", 3584, 18944)]
    assert args.tokens == [1, 8] and args.modes == ["fast"] and args.isolated
    assert bench_gemv.parse(["--shapes", "all"]).shapes == bench_gemv.SHAPES
    for bad in (["--formats", "q4_0"], ["--modes", "turbo"], ["--shapes", "4096"], ["--shapes", "4096xK"],
                ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            bench_gemv.parse(bad)


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _fake_row(**kw):
    """A decode-loop cell as decode_loop.measure returns it, with made-up timings (µs)."""
    row = {"fmt": "q4_K", "m": 4096, "k": 14336, "T": 1, "mode": "exact", "weights": 24, "calls": 96,
           "weight_bytes": 33030144, "llamacpp": 16.3, "rel_err": 1e-7,
           "ptxgen": {"eager": 17.0, "graph": 15.5, "graph_nolead": 16.04, "graph_profiled": 15.6, "graph_busy": 15.4},
           "floor_graph": 7.1, "floor_plain_graph": 9.5, "cublas_fp16": {"eager": 33.0, "graph": 31.0},
           "kernels": ["prep_q4k_t1", "gemv_q4_k_mma_t1"], "eager_kernels": ["gemv_q4_k_mma_t1_fused"]}
    row.update(kw)
    return row


def test_decode_loop_table_rows_from_fake_timings(bench_modules):
    _, decode_loop = bench_modules
    head, rule = decode_loop.header().splitlines()
    cols = _cells(head)
    assert cols == list(decode_loop.COLUMNS) and rule == "|---" * len(cols) + "|"
    cells = dict(zip(cols, _cells(decode_loop.table_row(_fake_row()))))
    assert len(cells) == len(cols) == 14
    assert cells["ptxgen eager µs"] == "17.0" and cells["ptxgen graph µs (no lead)"] == "15.5 (16.0)"
    assert cells["% of 4.27 TB/s (graph)"] == "50%"  # 33.0 MB in 15.5 µs
    assert cells["floor graph µs (PDL; plain)"] == "7.1 (9.5)" and cells["% of floor (floor ÷ graph)"] == "46%"
    assert cells["cuBLAS fp16 graph µs"] == "31.0" and cells["cuBLAS / ptxgen"] == "2.00×"
    assert cells["llama.cpp µs"] == "16.3" and cells["busy µs (graph ÷ busy)"] == "15.4 (1.01)"
    assert cells[cols[-1]] == "prep_q4k_t1 + gemv_q4_k_mma_t1 (eager: gemv_q4_k_mma_t1_fused)"
    # no floor off sm_90, no llama.cpp figure at T = 2, the same kernels eager and captured
    row = _fake_row(T=2, llamacpp=None, floor_graph=None, floor_plain_graph=None,
                    eager_kernels=["prep_q4k_t1", "gemv_q4_k_mma_t1"])
    cells = dict(zip(cols, _cells(decode_loop.table_row(row))))
    assert cells["floor graph µs (PDL; plain)"] == cells["% of floor (floor ÷ graph)"] == "—"
    assert cells["llama.cpp µs"] == "—"
    assert cells[cols[-1]] == "prep_q4k_t1 + gemv_q4_k_mma_t1"
    # --isolated: one more column, before the kernels
    head = _cells(decode_loop.header(isolated=True).splitlines()[0])
    row = _fake_row()
    row["ptxgen"]["isolated"] = 14.25
    cells = _cells(decode_loop.table_row(row, isolated=True))
    assert len(cells) == len(head) == 15 and head[-2] == decode_loop.ISOLATED and cells[-2] == "14.2"
    # a skipped cell keeps the table's shape
    skipped = {k: v for k, v in _fake_row(mode="fast").items() if k in ("fmt", "m", "k", "T", "mode")}
    cells = _cells(decode_loop.table_row({**skipped, "skipped": "mul_mat raised ValueError: a | b"}))
    assert len(cells) == 14 and cells[:4] == ["q4_K", "4096×14336", "fast", "1"]
    assert cells[4] == "skipped: mul_mat raised ValueError: a / b" and cells[5:] == [""] * 9


def test_decode_loop_skips_a_mode_that_raises_or_plans_the_exact_kernels(bench_modules):
    _, decode_loop = bench_modules
    plans = {"exact": ["prep_q4k_t1", "gemv_q5_k_mma_t1"], "fast": ["prep_q8_lanes", "gemv_q5_k_fast_t1"]}
    assert decode_loop.skip_reason(plans.get, "q5_K", 1, "exact") is None
    assert decode_loop.skip_reason(plans.get, "q5_K", 1, "fast") is None
    same = {"exact": plans["exact"], "fast": plans["exact"]}.get
    assert decode_loop.skip_reason(same, "q5_K", 1, "fast") == (
        "plans exact's kernels (prep_q4k_t1 + gemv_q5_k_mma_t1): no fast kernel for q5_K at T=1")

    def raises(mode):
        raise ValueError(f"mul_mat: mode={mode!r} has no kernel for q5_K yet")
    assert decode_loop.skip_reason(raises, "q5_K", 1, "fast").startswith("mul_mat raised ValueError: mul_mat: mode=")
    assert decode_loop.routed_modes("q4_K") == ("exact", "fast")  # Q4_K has had a fast GEMV from the start
    assert decode_loop.llama_us("tq4_1s", 18944, 3584, 8) == 71.2
    assert decode_loop.llama_us("q6_K", 14336, 4096, 1) is None  # PERF.md has no such figure: blank
    cap = decode_loop.caption("q4_K", 3584, 3584, ("exact",))
    assert "34 distinct q4_K 3584×3584 weights (7.2 MB each" in cap and "136 calls a loop" in cap  # 4× the L2


def test_bench_gemv_dry_run_lists_the_cells_with_their_kernels(bench_modules):
    bench_gemv, decode_loop = bench_modules
    out = subprocess.run([sys.executable, "bench_gemv.py", "--dry-run", "--tokens", "1,8"], cwd=BENCH,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    note, *lines = out.stdout.splitlines()
    assert note.startswith("floors at the H200's 4.27 TB/s")  # no GPU here: the H200's figure, said so
    assert _cells(lines[0]) == list(decode_loop.COLUMNS)
    cases = bench_gemv.cases(bench_gemv.parse([]))
    assert sum(line.startswith("decode loop: ") for line in lines) == len(cases)
    cells = [line.strip() for line in lines if " T=" in line]
    assert len(cells) == 2 * sum(len(decode_loop.routed_modes(f)) for f, *_ in cases)
    assert all(": kernels " in c or ": skipped: " in c for c in cells)
    q4k = next(c for c in cells if c.startswith("q4_K 4096×14336 exact T=1:"))
    assert "gemv_q4_k" in q4k and q4k.endswith("llama.cpp 16.3 µs")
    assert next(c for c in cells if c.startswith("tq4_1s 18944×3584 exact T=8:")).endswith("llama.cpp 71.2 µs")
    out = subprocess.run([sys.executable, "bench_gemv.py", "--dry-run", "--formats", "q6_K", "--modes", "exact",
                          "--shapes", "4096x14336", "--tokens", "1"], cwd=BENCH, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [line.strip().split(":")[0] for line in out.stdout.splitlines() if " T=" in line] == [
        "q6_K 4096×14336 exact T=1"]


def test_bench_op_decode_loop_runs_decode_loop_at_its_shapes(bench_modules):
    _, decode_loop = bench_modules
    assert {f: s[0] for f, s in decode_loop.SHAPES.items()} == {  # bench_op's loop: each format's first shape
        "q4_K": (4096, 14336), "q5_K": (4096, 14336), "q6_K": (4096, 14336), "q8_0": (4096, 14336),
        "tq4_1s": (18944, 3584)}
    out = subprocess.run([sys.executable, "bench_op.py", "--loop-formats", "q4_K,q4_0"], cwd=BENCH,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "--loop-formats: unknown ['q4_0']" in out.stderr

"""The benchmark programs stay runnable: every bench/*.py compiles, and bench_model's dry run (no GPU: a small model
in the Q4_K_M mix written as GGUF, read back, planned for an H200) names a kernel for every tensor."""
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

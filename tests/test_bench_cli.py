"""bench_model's and bench_moe's command lines: `--help` describes the program in its docstring's whole first
paragraph (not its first line, cut mid-sentence), and the formats are taken in any case (`--format Q5_K`, as issues
spell them, runs q5_K) while an unknown one is an error that lists the choices."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=BENCH, capture_output=True, text=True, timeout=timeout)


def words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def bench_modules(monkeypatch):
    """(bench_model, bench_moe), imported from bench/ as the scripts import each other."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_model
    import bench_moe

    return bench_model, bench_moe


@pytest.mark.parametrize("script", ["bench_model.py", "bench_moe.py"])
def test_help_shows_the_docstrings_first_paragraph(script, bench_modules):
    module = bench_modules[0] if script == "bench_model.py" else bench_modules[1]
    paragraph = words(module.__doc__.split("\n\n")[0])
    assert paragraph.endswith(".") and len(paragraph) > len(module.__doc__.splitlines()[0])
    out = run(script, "--help", timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert paragraph in words(out.stdout)  # wrapped to the terminal, whole


def test_bench_model_takes_formats_in_any_case(bench_modules):
    bench_model, _ = bench_modules
    for given, canonical in [("Q5_K", "q5_K"), ("q5_k", "q5_K"), ("TQ4_1S", "tq4_1s"), ("Q4_K_M", "q4_K_M"),
                             ("q8_0", "q8_0"), ("Q6_K", "q6_K"), ("q4_k", "q4_K")]:
        assert bench_model.format_arg(given) == canonical
    out = run("bench_model.py", "--format", "Q5_K", "--dry-run", "--layers", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if " T=" in line]
    assert len(lines) == 2 * 8 and all(" q5_K " in line for line in lines)  # every tensor, planned as q5_K


def test_bench_model_rejects_an_unknown_format_with_the_choices():
    out = run("bench_model.py", "--format", "Q7_K", "--dry-run", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "unknown format 'Q7_K'" in out.stderr
    assert "q4_K_M, q4_K, q5_K, q6_K, q8_0, tq4_1s" in out.stderr


def test_bench_moe_takes_formats_in_any_case_and_rejects_unknown_ones(bench_modules):
    _, bench_moe = bench_modules
    assert bench_moe.formats_arg("Q4_K,q8_0,TQ4_1S,q5_k") == ["q4_K", "q8_0", "tq4_1s", "q5_K"]
    out = run("bench_moe.py", "--formats", "Q8_0", "--tokens", "1,8", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "q8_0 128 experts top-8 768×2048" in out.stdout and "q8_0 x (T, K)" in out.stdout
    out = run("bench_moe.py", "--formats", "q4_K,Q9", "--dry-run", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "'Q9'" in out.stderr and "q4_K, q5_K, q6_K, q8_0, tq4_1s" in out.stderr


def test_bench_model_times_the_step_layer_by_layer_and_by_kind(bench_modules):
    """bench_model's graphs: the whole step, each layer's seven matmuls, each kind over the layers (the output
    layer's own kind): every tensor once in the step, once in its layer (but output.weight), once in its kind."""
    bench_model, _ = bench_modules

    tensors = bench_model.model_tensors("q4_K_M", 3, 16)
    kinds = list(dict.fromkeys(k for _, k, *_ in tensors))
    got = dict(bench_model.groups(tensors, kinds))
    names = [n for n, *_ in tensors]
    assert got["all"] == names and [k for k in got if k.startswith("blk.")] == ["blk.0", "blk.1", "blk.2"]
    assert sorted(sum((got[f"blk.{i}"] for i in range(3)), [])) == sorted(n for n in names if n != "output.weight")
    assert sorted(sum((got[k] for k in kinds), [])) == sorted(names) and got["output"] == ["output.weight"]


def test_bench_model_takes_either_model_s_shapes_for_any_format(bench_modules):
    """--model: Llama-3-8B's shapes by default, Qwen2.5-7B's for TQ4_1S, either for any format (a Q6_K file of
    Qwen's shapes reaches the Q6_K GEMMs on rows that are not 16-byte multiples); Qwen's Q4_K_M mix keeps its depth's
    Q6_K layers (28 layers: use_more_bits on that depth)."""
    bench_model, _ = bench_modules
    shape = {n: s for n, _, _, s in bench_model.model_tensors("q6_K", 1)}
    assert shape["blk.0.ffn_down.weight"] == (4096, 14336) and shape["output.weight"] == (128256, 4096)
    assert dict((n, s) for n, _, _, s in bench_model.model_tensors("tq4_1s", 1))["blk.0.ffn_down.weight"] == (3584, 18944)
    qwen = bench_model.model_tensors("q4_K_M", 4, model="qwen2.5-7b")
    assert {s for n, _, _, s in qwen if "ffn_down" in n} == {(3584, 18944)}
    assert [f for n, _, f, _ in qwen if "ffn_down" in n] == [
        "q6_K" if bench_model.use_more_bits(i, 28) else "q4_K" for i in range(4)]


def test_bench_model_charges_cublas_one_conversion_an_activation(bench_modules):
    """cuBLAS + x.half() (fp32 x): a layer's q / k / v read one activation, gate / up another, attn_output and
    ffn_down one each, the output layer its own — fused tensors their members' — so a layer converts 4 times."""
    bench_model, _ = bench_modules
    tensors = bench_model.model_tensors("q4_K_M", 2) + [("output.weight", "output", "q6_K", (128256, 4096))]
    act = bench_model.activations([n for n, *_ in tensors])
    assert act["blk.1.attn_q.weight"] == act["blk.1.attn_v.weight"] == ("blk.1", "attn_in")
    assert act["blk.1.ffn_gate.weight"] == act["blk.1.ffn_up.weight"] != act["blk.1.ffn_down.weight"]
    assert act["blk.0.attn_q.weight"] != act["blk.1.attn_q.weight"] and act["output.weight"] == ("", "final")
    assert len(set(act.values())) == 2 * 4 + 1
    fused = bench_model.activations([name for name, *_ in bench_model.fuse(tensors)])
    assert set(fused.values()) == set(act.values())


def test_bench_model_fuse_joins_the_projections_of_one_activation_and_format(bench_modules):
    """--fuse: q / k (/ v where its format is theirs) and gate / up as one tensor each, in layer order; Q4_K_M's
    Q6_K attn_v (a more-bits layer) stays apart."""
    bench_model, _ = bench_modules
    fused = bench_model.fuse(bench_model.model_tensors("q4_K_M", 2))
    names = [name for name, *_ in fused]
    assert names[:5] == ["blk.0.attn_q+attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                         "blk.0.ffn_gate+ffn_up.weight", "blk.0.ffn_down.weight"]
    assert fused[0][3] == (5120, 4096) and fused[0][4] == ["blk.0.attn_q.weight", "blk.0.attn_k.weight"]
    assert fused[3][3] == (28672, 4096)
    one = bench_model.fuse(bench_model.model_tensors("q8_0", 1))
    assert [name for name, *_ in one][:2] == ["blk.0.attn_q+attn_k+attn_v.weight", "blk.0.attn_output.weight"]
    assert one[0][3] == (6144, 4096) and names[-1] == "output.weight"
    out = run("bench_model.py", "--fuse", "--dry-run", "--layers", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--fuse: 2 fused tensors, 6 ops a step" in out.stdout


@pytest.mark.parametrize("script", ["bench_op.py", "bench_gemv.py", "bench_moe.py", "bench_model.py", "bench_mmq.py"])
def test_a_benchmark_without_torch_says_what_to_install(script):
    """Without torch a benchmark stops with one line naming the extra to install, not an ImportError's traceback."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    r = run(script, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert 'pip install -e ".[bench]"' in r.stderr, r.stderr

"""Runtime checks that need no GPU: the compile cache, error messages, GGUF reading, packaging."""
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from conftest import REPO, setknob
from hypothesis import given, settings, strategies as st
from ptxgen import formats
from ptxgen.runtime import compiler
from ptxgen.runtime.kernels import candidate_arches, manifest, ptx_source
from ptxgen.runtime.tensors import QuantTensor, read_gguf_tensor, write_gguf

PTX = ptx_source("quantize_q8_1", "sm_89")[0]


def test_cache_key_covers_everything(monkeypatch):
    base = compiler.cache_key(PTX, "sm_90")
    assert compiler.cache_key(PTX + "\n", "sm_90") != base
    assert compiler.cache_key(PTX, "sm_89") != base
    assert compiler.cache_key(PTX, "sm_90", ("-O2",)) != base
    monkeypatch.setattr(compiler, "nvjitlink_version", lambda: (99, 0))
    assert compiler.cache_key(PTX, "sm_90") != base
    monkeypatch.undo()
    monkeypatch.setattr(compiler, "__version__", "9.9.9")
    assert compiler.cache_key(PTX, "sm_90") != base


def _compile_in_fresh_process(cache, extra_env=None):
    env = dict(os.environ, PTXGEN_CACHE_DIR=str(cache), PTXGEN_VERBOSE="1", **(extra_env or {}))
    code = ("from ptxgen.runtime.kernels import ptx_source; from ptxgen.runtime.compiler import compile_ptx;"
            "r = compile_ptx(ptx_source('quantize_q8_1', 'sm_89')[0], 'sm_90', name='q'); print(len(r.cubin))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)


def test_disk_cache_miss_then_hit_then_corruption(tmp_path):
    first = _compile_in_fresh_process(tmp_path)
    assert "compiled" in first.stderr
    second = _compile_in_fresh_process(tmp_path)
    assert "cache disk" in second.stderr and second.stdout == first.stdout
    (entry,) = [p for p in tmp_path.rglob("*.cubin")]
    entry.write_bytes(entry.read_bytes()[:-7])  # truncated
    third = _compile_in_fresh_process(tmp_path)
    assert "corrupt" in third.stderr and "compiled" in third.stderr and third.stdout == first.stdout
    blob = bytearray(entry.read_bytes())
    blob[-1] ^= 0xFF  # flipped bit, same length
    entry.write_bytes(bytes(blob))
    assert "corrupt" in _compile_in_fresh_process(tmp_path).stderr
    assert not list(tmp_path.rglob(".tmp-*")), "a temp file was left behind"


def test_keep_artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("PTXGEN_KEEP", str(tmp_path))
    monkeypatch.setenv("PTXGEN_NO_CACHE", "1")
    compiler._MEMORY.clear()
    compiler.compile_ptx(PTX, "sm_90", name="quantize_q8_1")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"quantize_q8_1.sm_90.{e}" for e in ("cubin", "log", "ptx", "sass")]
    assert "registers" in (tmp_path / "quantize_q8_1.sm_90.log").read_text()


def test_resource_log_dialects():
    ptxas = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Function properties for k\n"
             "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
             "ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem\n")
    linker = ("info    : Function properties for 'k':\ninfo    : used 24 registers, used 0 barriers, 16 stack, "
              "2048 bytes smem, 548 bytes cmem[0], 16 bytes lmem\n")
    a = compiler.parse_resources(ptxas)["k"]
    assert (a["registers"], a["smem"], a["stack"], a["spill_stores"]) == (40, 4096, 8, 4)
    b = compiler.parse_resources(linker)["k"]
    assert (b["registers"], b["smem"], b["stack"], b["lmem"]) == (24, 2048, 16, 16)


def test_dynamic_smem_kernel_compiles():
    from ptxgen.arch import get_arch
    from ptxgen.probes import dynamic_smem_kernel

    for arch in ("sm_89", "sm_90a", "sm_120a"):
        k = dynamic_smem_kernel(get_arch(arch), 64 * 1024)
        assert ".extern .shared .align 128 .b8 dsmem[];" in k.ptx()
        compiler.compile_ptx(k.ptx(), arch, name="dsmem_probe")


def test_compile_error_names_a_repro():
    with pytest.raises(compiler.CompileError, match=r"reproduce: ptxas -arch=sm_90"):
        compiler.compile_ptx(PTX.replace("add.rn.f32", "add.rn.f99"), "sm_90", name="broken")


def test_runtime_imports_without_jinja2():
    code = ("import sys\nclass Block:\n def find_spec(self, name, *a):\n  if name.split('.')[0] == 'jinja2':"
            " raise ImportError('blocked')\nsys.meta_path.insert(0, Block())\n"
            "import ptxgen.runtime as r\nfrom ptxgen.runtime.kernels import ptx_source\n"
            "r.compile_ptx(ptx_source('dequantize_q4_k', 'sm_90a')[0], 'sm_90a')\n"
            "assert 'jinja2' not in sys.modules\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_first_gpu_call_without_gpu_is_one_clear_error():
    code = ("import numpy as np, ptxgen.runtime as r\n"
            "try:\n r.quantize_q8_1(np.ones((1, 32), np.float32))\nexcept RuntimeError as e:\n print('RuntimeError', e)\n"
            "else:\n print('ran on a GPU')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("ran on a GPU") or ("RuntimeError" in out and "no usable CUDA driver/GPU" in out)


def test_bad_inputs_fail_before_any_launch():
    from ptxgen.runtime import dequantize, quantize_q8_1

    with pytest.raises(ValueError, match="multiple of 32, got shape"):
        quantize_q8_1(np.zeros((2, 30), np.float32))
    with pytest.raises(TypeError, match="expected dtype float32, got float64"):
        quantize_q8_1(np.zeros((2, 32)))
    with pytest.raises(ValueError, match=r"q4_K: shape \(2, 256\) needs 288 bytes"):
        QuantTensor.from_raw("q4_K", np.zeros(100, np.uint8), (2, 256))
    with pytest.raises(ValueError, match="K=300 is not a positive multiple"):
        QuantTensor.from_raw("q4_K", np.zeros(100, np.uint8), (1, 300))
    with pytest.raises(TypeError, match="expected a QuantTensor"):
        dequantize(np.zeros((4, 4)))
    tq = QuantTensor.from_raw("tq4_1s", np.zeros(2 * 8 * 20, np.uint8), (2, 256))
    with pytest.raises(ValueError, match=r"no GPU kernel for tq4_1s yet \(have: q4_K, q5_K, q6_K, q8_0\)"):
        dequantize(tq)
    with pytest.raises(TypeError, match="expected a NumPy array or a CUDA array"):
        quantize_q8_1([1.0] * 32)


def test_kernel_selection_order():
    assert candidate_arches(90) == ["sm_90a", "sm_89", "sm_80"]
    assert candidate_arches(89) == ["sm_89", "sm_80"]
    assert candidate_arches(120) == ["sm_120a", "sm_89", "sm_80"]
    assert "quantize_q8_1" in manifest("sm_120a")


def test_gguf_q4_k_via_gguf_package(tmp_path):
    from gguf import GGMLQuantizationType as GT, GGUFWriter

    w = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    raw = formats.quantize("q4_K", w)
    wr = GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    wr.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=GT.Q4_K)
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()  # noqa: E702
    fmt, shape, got = read_gguf_tensor(tmp_path / "m.gguf", "blk.0.ffn_up.weight")
    assert (fmt, shape) == ("q4_K", (3, 512)) and got.tobytes() == raw.tobytes()
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        read_gguf_tensor(tmp_path / "m.gguf", "nope")


@pytest.mark.parametrize("type_id", [46, 48])
def test_gguf_tq4_1s_by_fork_id_and_size(tmp_path, type_id):
    x = np.random.default_rng(1).standard_normal((5, 96)).astype(np.float32)
    raw = formats.quantize("tq4_1s", x)
    write_gguf(tmp_path / "t.gguf", {"a": (12, (2, 256), formats.quantize("q4_K", np.ones((2, 256), np.float32))),
                                     "w": (type_id, (5, 96), raw)})
    fmt, shape, got = read_gguf_tensor(tmp_path / "t.gguf", "w")
    assert (fmt, shape) == ("tq4_1s", (5, 96)) and got.tobytes() == raw.tobytes()
    write_gguf(tmp_path / "u.gguf", {"w": (77, (5, 96), raw)})
    with pytest.raises(ValueError, match="type id 77 is not one ptxgen reads"):
        read_gguf_tensor(tmp_path / "u.gguf", "w")


@pytest.mark.slow
def test_wheel_ships_emitted_kernels(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                    str(REPO)], check=True, capture_output=True)
    (whl,) = tmp_path.glob("ptxgen-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    for arch in ("sm_89", "sm_90a", "sm_120a"):
        assert f"ptxgen/emitted/{arch}/manifest.json" in names
        assert f"ptxgen/emitted/{arch}/dequantize_q4_k.ptx" in names
    assert "ptxgen/runtime/driver.py" in names and "ptxgen/templates/module.ptx.j2" in names


def test_kernel_arguments_are_packed_by_the_manifest_abi():
    """Each argument becomes exactly its parameter's C type; a CUtensorMap-sized blob is copied by value."""
    import ctypes

    from ptxgen.runtime.driver import Function

    params = [{"name": "p", "type": "u64", "size": 8}, {"name": "n", "type": "u32", "size": 4},
              {"name": "s", "type": "f32", "size": 4}, {"name": "tmap", "type": "b8", "size": 128}]
    fn = Function(None, None, "k", params, (128, 1, 1))
    blob = bytes(range(128))
    cells, addr = fn.pack((0x7F0012345678, 3, np.float32(0.5), blob))
    ptrs = (ctypes.c_void_p * 4).from_address(addr)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x7F0012345678
    assert ctypes.c_uint32.from_address(ptrs[1]).value == 3
    assert ctypes.c_float.from_address(ptrs[2]).value == 0.5
    assert ctypes.string_at(ptrs[3], 128) == blob
    with pytest.raises(TypeError, match=r"takes 4 arguments \(p, n, s, tmap\), got 3"):
        fn.pack((1, 2, 3))
    with pytest.raises(ValueError, match="parameter tmap is 128 B, got 64"):
        fn.pack((1, 2, np.float32(0), bytes(64)))
    with pytest.raises(ValueError, match="parameter n is unsigned, got -1"):
        fn.pack((1, -1, np.float32(0), blob))


def test_tensor_map_arguments_are_checked_before_the_driver():
    from ptxgen.runtime.tma import check_tensor_map_2d

    assert check_tensor_map_2d(0x10000, "f16", 4096, 4096, 64, 64) == 8192
    with pytest.raises(ValueError, match="16-byte aligned"):
        check_tensor_map_2d(0x10008, "f16", 64, 64, 64, 64)
    with pytest.raises(ValueError, match="row stride 72 B must be a multiple of 16"):
        check_tensor_map_2d(0, "u8", 10, 72, 8, 16, "none")
    with pytest.raises(ValueError, match="exceeds the 128B swizzle span"):
        check_tensor_map_2d(0, "f16", 64, 256, 64, 128)
    with pytest.raises(ValueError, match="a box dimension is 1..256"):
        check_tensor_map_2d(0, "f16", 1024, 64, 512, 64)
    assert check_tensor_map_2d(0, "f16", 64, 256, 64, 64, "128B", None, 4) == 512  # (4 column chunks a box)
    with pytest.raises(ValueError, match="a multiple of box_cols"):
        check_tensor_map_2d(0, "f16", 64, 200, 64, 64, "128B", None, 2)


@settings(max_examples=200, deadline=None)
@given(tiles=st.integers(1, 600), steps=st.integers(4, 512), slots=st.integers(1, 600))
def test_one_round_split_plan_fits_the_slots_and_covers_k(tiles, steps, slots):
    from ptxgen.runtime.ops import splitk_plan_one_round

    splits, per = splitk_plan_one_round(tiles, steps, slots)
    assert splits >= 1 and per >= 1
    assert (splits - 1) * per < steps <= splits * per  # every K-step in exactly one split, none empty
    if splits > 1:
        assert tiles * splits <= slots and per >= 8


@settings(max_examples=150, deadline=None)
@given(tiles=st.integers(1, 4000), steps=st.integers(1, 300), slots=st.sampled_from([1, 3, 132, 264, 396]))
def test_tail_split_plan_covers_every_tile_and_k_step_once(tiles, steps, slots):
    """splitk_plan_tail: whole rounds of whole tiles, the rest split into K ranges that cover K exactly, and a
    split only when the model says it saves time."""
    from ptxgen.runtime import ops

    whole, splits, per = ops.splitk_plan_tail(tiles, steps, slots)
    assert 0 <= whole <= tiles and whole % slots == 0 or whole == tiles
    assert (splits - 1) * per < steps <= splits * per
    if splits == 1:
        assert whole == tiles and per == steps
    else:
        tail, c = tiles - whole, ops.RULES.split_item_cost + ops.RULES.split_fixup_cost
        last = steps - (splits - 1) * per
        span = ops._list_schedule([per + c] * (tail * (splits - 1)) + [last + c] * tail, slots)
        assert span < steps + ops.RULES.split_item_cost


def test_tail_split_plan_on_the_h200_shapes():
    """132 resident CTAs (the n128 MMQ on an H200): 14336 x 4096 at T = 4096 (3584 tiles) splits only the last
    20; at T = 128 (112 tiles, fewer than the CTAs) every tile splits unevenly, its long part first; 4096 x 4096
    at T = 512 (128 tiles, one round) does not split."""
    from ptxgen.runtime.ops import splitk_plan_tail

    whole, splits, per = splitk_plan_tail(3584, 64, 132)
    assert whole == 27 * 132 and splits > 1
    whole, splits, per = splitk_plan_tail(112, 64, 132)
    assert whole == 0 and splits == 2 and per > 32
    assert splitk_plan_tail(128, 64, 132) == (128, 1, 64)


@given(ctas=st.integers(1, 5000), k=st.sampled_from([256, 1024, 3584, 4096, 14336, 18944]),
       per_sm=st.integers(1, 8), sms=st.sampled_from([1, 84, 132]), lane_cols=st.sampled_from([8, 32, 64]),
       max_splits=st.sampled_from([8, 16]))
def test_gemv_splits_fill_one_wave_and_keep_a_step_each(ctas, k, per_sm, sms, lane_cols, max_splits):
    from ptxgen.runtime.ops import gemv_splits

    s = gemv_splits(ctas, k, per_sm, sms, lane_cols, max_splits)
    steps = -(-(k // lane_cols) // 32)  # a lane step: 32 lanes x lane_cols columns (Q4_K: 64; tensor-core: 8 blocks)
    assert 1 <= s <= min(max_splits, steps)
    assert s == 1 or ctas * s <= sms * per_sm  # never a second, partial wave of CTAs
    if ctas * 2 <= sms * per_sm and steps >= 2:
        assert s >= 2  # rows alone fill at most half the GPU: split K


@given(ctas=st.integers(1, 300), k=st.sampled_from([1024, 3584, 4096, 14336, 18944]), min_steps=st.integers(1, 16))
def test_gemv_splits_keep_the_builds_min_split_steps(ctas, k, min_steps):
    """A build's min_split_steps caps the splits at ceil(steps / min_steps), and only caps: otherwise the plan is
    the one without it."""
    from ptxgen.runtime.ops import gemv_splits

    steps = -(-(k // 8) // 32)
    s = gemv_splits(ctas, k, 2, 132, 8, 32, min_steps)
    assert s == min(gemv_splits(ctas, k, 2, 132, 8, 32), max(1, -(-steps // min_steps)))


@given(warps=st.sampled_from([4, 6, 8]), rpw=st.sampled_from([16, 32]), m=st.integers(1, 40000),
       k=st.sampled_from([256, 1024, 3584, 4096, 14336, 18944]), per_sm=st.sampled_from([1, 2, 3, 4]),
       sms=st.sampled_from([84, 132]))
def test_gemv_k_parts_split_k_in_the_cta_before_the_grid(warps, rpw, m, k, per_sm, sms):
    """The GEMVs with the kparts parameter: kparts a power of two dividing the CTA's warps (6: 1 or 2; a part's
    warps are one row tile's) and ≤ the K steps; a grid of
    more than one round only at kparts 1; no other kparts would give more warps work, and a larger one that gives
    as many would not fit one round."""
    from ptxgen.runtime.ops import gemv_k_parts, gemv_splits

    ctas, splits, kp = gemv_k_parts(warps, rpw, m, k, per_sm, sms, 8, 32)
    tiles, slots, steps = -(-m // rpw), sms * per_sm, k // 256
    assert kp & (kp - 1) == 0 and warps % kp == 0 and (kp == 1 or kp <= steps)
    assert ctas == -(-tiles * kp // warps) and (kp == 1 or ctas <= slots)
    assert splits == gemv_splits(ctas, k, per_sm, sms, 8 * kp, 32)

    def busy(p):
        c = -(-tiles * p // warps)
        return None if p > 1 and (c > slots or p > steps) else min(tiles * p * gemv_splits(c, k, per_sm, sms, 8 * p, 32),
                                                                   slots * warps)
    mine = busy(kp)
    for p in (1, 2, 4, 8):
        if warps % p == 0 and busy(p) is not None:
            assert busy(p) <= mine and (p <= kp or busy(p) < mine)


def test_gemv_k_parts_on_the_decode_shapes():
    """The H200's shapes for the few-token build (2 CTAs of 8 warps an SM, 16 rows a warp): 4096 rows split K 8
    ways in the CTA and not over the grid, 14336 rows 2 ways, 18944 rows not at all (148 CTAs of 128 rows: twice
    as many would take two rounds); the codecs' tensor-core GEMV (3 CTAs of 4 warps) on 4096x14336: 2 parts x 3
    grid splits, as many warps busy as 6 grid splits."""
    from ptxgen.runtime.ops import gemv_k_parts

    few = [gemv_k_parts(8, 16, m, k, 2, 132, 8, 32) for m, k in ((4096, 14336), (4096, 4096), (14336, 4096),
                                                                  (18944, 3584), (1024, 4096))]
    assert few == [(256, 1, 8), (256, 1, 8), (224, 1, 2), (148, 1, 1), (64, 2, 8)]
    assert gemv_k_parts(4, 16, 4096, 14336, 3, 132, 8, 32) == (128, 3, 2)
    assert gemv_k_parts(4, 16, 128256, 4096, 3, 132, 8, 32) == (2004, 1, 1)
    # a cap (the few-token builds' rule few_max_k_parts): 2 parts, the grid splits fill the rest
    assert gemv_k_parts(8, 16, 4096, 14336, 2, 132, 8, 32, most=2) == (64, 4, 2)


def test_multi_round_grids_take_kparts_for_fuller_rounds_up_to_the_rule():
    """A GEMV grid over more than one round of resident CTAs (Q6_K's output layer: 2004 CTAs of 64 rows on 396
    slots) takes the kparts, up to the rule multi_round_k_parts for the call's T, whose rounds are the fullest (4
    parts: 8016 CTAs in 21 rounds, 96% full, against 84% in 6); one-round grids keep their plans."""
    from ptxgen.runtime.ops import _by_tokens, gemv_k_parts

    args = (4, 16, 128256, 4096, 3, 132, 8, 32)
    assert gemv_k_parts(*args) == (2004, 1, 1)
    assert gemv_k_parts(*args, round_most=2) == (4008, 1, 2)
    assert gemv_k_parts(*args, round_most=4) == (8016, 1, 4)
    assert gemv_k_parts(*args, most=2, round_most=4) == (4008, 1, 2)
    assert gemv_k_parts(4, 16, 4096, 14336, 3, 132, 8, 32, round_most=4) == (128, 3, 2)
    assert [_by_tokens({"1": 4, "2": 2, "8": 1}, t) for t in (1, 2, 4, 8, 16)] == [4, 2, 2, 1, 1]
    assert _by_tokens(3, 5) == 3


def test_the_output_layer_gemv_takes_the_multi_round_kparts_of_its_tokens(monkeypatch):
    """mul_mat's plan for Q6_K's 128256x4096 output layer (the codecs' tensor-core GEMV, 3 CTAs of 4 warps an SM on
    the H200): kparts from RULES.multi_round_k_parts by T (4 at T = 1, 2 at T = 2-4, 1 from 8, as measured) — the
    launch's last argument and its grid; an override of the rule reaches the plan."""
    from ptxgen import tuning
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    w = fakegpu.weights("q6_K", 128256, 4096)
    with tuning.override(codec_few_max_tokens={"q5_K": 32}):  # the codecs' GEMV, not the few-token builds first
        for t, kp in ((1, 4), (4, 2), (8, 1)):  # the shipped rule (h200.json), then an override
            gemv = ops.mul_mat_plan(w, t).launches[-1]
            assert gemv.fn.name.startswith("gemv_q6_k_mma_tma") and gemv.args[-1] == kp and gemv.grid[0] == 2004 * kp
        w._plans.clear()
        with tuning.override(multi_round_k_parts=2):
            assert ops.mul_mat_plan(w, 1).launches[-1].args[-1] == 2


def test_small_t16h_build_splits_k_in_runs_of_eight_super_blocks():
    """The sm_89 / sm_120a t16h build (2 CTAs per SM on the H200) measured faster with splits of ≥ 8 super-blocks
    (4096² at T=16: 2 splits 14.2 µs, 4 splits 15.0); the sm_90a build has no such floor (4 splits there 13.9 vs
    2 16.2)."""
    from ptxgen.kernels import KERNELS
    from ptxgen.runtime.ops import gemv_splits

    small = KERNELS["gemv_q4_k_mma_t16h"].for_arch("sm_89").meta
    big = KERNELS["gemv_q4_k_mma_t16h"].for_arch("sm_90a").meta
    assert small["min_split_steps"] == 8 and big["min_split_steps"] == 1
    assert gemv_splits(4096 // small["rows_per_cta"], 4096, 2, 132, 8, 32, small["min_split_steps"]) == 2
    assert gemv_splits(4096 // small["rows_per_cta"], 14336, 2, 132, 8, 32, small["min_split_steps"]) == 4
    assert gemv_splits(4096 // big["rows_per_cta"], 4096, 1, 132, 8, 32, big["min_split_steps"]) == 4


def test_q4_k_lane_gemv_steps_are_64_columns_wide():
    """The Q4_K lane kernels step 64 columns per lane (a sub-block pair), so K = 2048 has one step: no split
    may be planned that would get none (it would launch idle CTAs)."""
    from ptxgen.kernels import KERNELS
    from ptxgen.runtime.ops import gemv_splits

    assert KERNELS["gemv_q4_k_fast_t1"].for_arch("sm_89").meta["lane_cols"] == 64
    assert KERNELS["gemv_q8_0_t1"].for_arch("sm_89").meta["lane_cols"] == 32
    assert gemv_splits(10, 2048, 8, 132, 64) == 1
    assert gemv_splits(10, 2048, 8, 132, 32) == 2


def test_fast_mode_picks_the_q8_1_mmq_where_it_measured_faster():
    """mode="fast" prefill: the fused n16 Q8_1 GEMM up to 16 tokens, quantize-first n32 up to 32 when only the
    mma.sync fp16 GEMM competes (on sm_90 the wgmma GEMM is faster past 16 tokens), the fp16 GEMM above."""
    from ptxgen.runtime.ops import q8_path

    assert [q8_path(t, "wgmma") for t in (9, 16, 17, 64)] == ["q8", "q8", None, None]
    assert [q8_path(t, "mma.sync") for t in (9, 16, 17, 32, 33)] == ["q8", "q8", "q8_pre", "q8_pre", None]


def test_mma_sync_mmq_converts_x_first_from_2_to_the_31_multiply_adds(monkeypatch):
    """The mma.sync MMQ takes fp16 x from convert_f16 (mmq_q4_k_f16_n*_x16) from M·T·K = 2^31 (where it measured
    faster on the H200), converts inside the GEMM below; PTXGEN_MMQ_X16 forces either."""
    from ptxgen.runtime.ops import mma_sync_x16

    setknob(monkeypatch, "PTXGEN_MMQ_X16", None)
    assert [mma_sync_x16(4096, 4096, t, "sm_89") for t in (96, 127, 128, 4096)] == [False, False, True, True]
    assert mma_sync_x16(14336, 4096, 37, "sm_120a") and not mma_sync_x16(14336, 4096, 36, "sm_120a")
    setknob(monkeypatch, "PTXGEN_MMQ_X16", "1")
    assert mma_sync_x16(128, 256, 9, "sm_89")
    setknob(monkeypatch, "PTXGEN_MMQ_X16", "0")
    assert not mma_sync_x16(4096, 4096, 4096, "sm_89")


@pytest.mark.parametrize("var,fn", [("PTXGEN_TQ4_MMA", "tq4_mma"), ("PTXGEN_Q4K_MMA", "q4k_mma"), ("PTXGEN_Q4K_T1", "q4k_t1"),
                                    ("PTXGEN_MMQ_X16", "mmq_x16")])
def test_tensor_core_gemv_knobs_are_auto_on_or_off_and_reject_anything_else(monkeypatch, var, fn):
    from ptxgen import knobs

    for v, want in (("", "auto"), ("auto", "auto"), ("1", "on"), ("yes", "on"), ("0", "off"), ("false", "off")):
        setknob(monkeypatch, var, v)
        assert getattr(knobs, fn)() == want
    setknob(monkeypatch, var, "fast")
    with pytest.raises(ValueError, match=var):
        getattr(knobs, fn)()


def test_fullest_residency_picks_the_grid_that_fills_more_slots(monkeypatch):
    """ops._fullest_residency on the H200's 132 SMs with the Q4_K tensor-core GEMV's 64 rows per CTA: 14336 rows
    (224 CTAs) fill 448 of 528 slots at 4 per SM but 224 of 396 at 3; 18944 rows (296) the other way round."""
    from types import SimpleNamespace

    from ptxgen.runtime import driver, ops

    monkeypatch.setattr(driver, "current", lambda: SimpleNamespace(sm_count=132))
    fn = SimpleNamespace(meta={"rows_per_cta": 64, "lane_cols": 8, "max_splits": 32})
    assert ops._fullest_residency(fn, 14336, 4096, (4, 3)) == 4
    assert ops._fullest_residency(fn, 18944, 3584, (4, 3)) == 3
    assert ops._fullest_residency(fn, 4096, 14336, (4, 3)) == 4  # 512 / 528 vs 384 / 396: a tie within 0.1%
    # the cp.async build (3 per SM, or 2): 296 CTAs on 264 slots would take two rounds (half of the second idle);
    # counting them as 112% full put 18944x3584 at 34.7 us on the H200 (2026-11-30)
    assert ops._fullest_residency(fn, 18944, 3584, (3, 2)) == 3


def test_sixteen_token_skinny_gemm_rule(monkeypatch):
    """mul_mat's rule for 9-16 tokens (README): mmq_q4_k_rega_n16 where gemv_q4_k_mma_t16h's 128-row CTAs exceed
    one round of its planned residency (one per SM on sm_90a: M > 16896 on 132 SMs), from the emitted manifests;
    never where n16 is not built (sm_89) or with PTXGEN_MMQ_SKINNY=0."""
    from types import SimpleNamespace

    from ptxgen.runtime import driver, ops

    monkeypatch.setattr(driver, "current", lambda: SimpleNamespace(sm_count=132))
    setknob(monkeypatch, "PTXGEN_MMQ_SKINNY", None)
    assert not ops.skinny16_ok("q4_K", 16896, "sm_90a") and ops.skinny16_ok("q4_K", 16897, "sm_90a")
    assert ops.skinny16_ok("q4_K", 18944, "sm_90a")
    assert not ops.skinny16_ok("q4_K", 18944, "sm_89") and not ops.skinny16_ok("q4_K", 18944, "sm_120a")
    monkeypatch.setattr(driver, "current", lambda: SimpleNamespace(sm_count=170))  # more SMs: a later switch
    assert not ops.skinny16_ok("q4_K", 18944, "sm_90a") and ops.skinny16_ok("q4_K", 170 * 128 + 1, "sm_90a")
    setknob(monkeypatch, "PTXGEN_MMQ_SKINNY", "0")
    assert not ops.skinny16_ok("q4_K", 20000, "sm_90a")


def test_tensor_core_gemv_token_rule():
    """mul_mat's rule (README): Q4_K from 2 tokens, single tokens too from 2^25 weights (4096x14336 and 18944x3584
    yes, 4608x3584 no; TMA and cp.async builds alike); TQ4_1S from 3 tokens from 14·2^20 weights (4608x3584 and
    larger), from 5 below (3584x3584)."""
    from ptxgen.runtime.ops import mma_min_tokens

    assert [mma_min_tokens("q4_K", m, k) for m, k in ((4096, 14336), (18944, 3584), (4608, 3584), (300, 4096))] == [1, 1, 2, 2]
    assert [mma_min_tokens("tq4_1s", m, k) for m, k in ((18944, 3584), (4608, 3584), (3584, 3584), (300, 256))] == [3, 3, 5, 5]


def test_q4k_tensor_core_gemv_builds_per_target():
    """Which build of the Q4_K tensor-core GEMVs mul_mat runs for a pinned target: sm_90a's TMA one, the cp.async
    one for the mma.sync targets (sm_89, sm_120a) — the 8-token GEMV and the 16-token one (T = 9-16, a knob's: built
    on demand, not shipped) alike."""
    from ptxgen.runtime import kernels
    from ptxgen.runtime.ops import _mma_build

    assert [_mma_build(a, "gemv_q4_k_mma") for a in ("sm_89", "sm_90a", "sm_120a")] == ["sm_89", "sm_90a", "sm_120a"]
    assert [_mma_build(a, "gemv_q4_k_mma_n16") for a in ("sm_89", "sm_90a", "sm_120a")] == ["sm_89", "sm_90a", "sm_120a"]
    assert _mma_build("sm_89", "no_such_kernel") is None
    copies = {name: [kernels.entry(name, a)["meta"]["copy"] for a in ("sm_89", "sm_90a", "sm_120a")]
              for name in ("gemv_q4_k_mma", "gemv_q4_k_mma_n16")}
    # TMA for the 8-token build where the target has it (sm_90a, sm_120a): the 16-token one measured faster with
    # cp.async on the H200
    assert copies == {"gemv_q4_k_mma": ["cp.async", "tma", "tma"], "gemv_q4_k_mma_n16": ["cp.async"] * 3}
    # programmatic dependent launch: the 8-token build (measured faster with it), not the 16-token one (slower)
    assert kernels.manifest("sm_90a")["gemv_q4_k_mma"]["meta"]["pdl"] is True
    assert kernels.entry("gemv_q4_k_mma_n16", "sm_90a")["meta"]["pdl"] is False
    assert "griddepcontrol.wait" not in kernels.ptx_source("gemv_q4_k_mma_n16", "sm_90a")[0]


def test_convert_f16_k_order_is_checked_before_any_launch():
    from ptxgen.runtime import ops

    with pytest.raises(ValueError, match="k_order"):
        ops.convert_f16(np.zeros((2, 64), np.float32), None, k_order="permuted")


def test_whole_program_kernels_load_through_the_driver_jit(monkeypatch):
    """A kernel whose manifest says compile "whole-program" (it needs setmaxnreg, which nvJitLink's relocatable
    compile ignores) reaches the driver as PTX text, which the driver JIT-compiles whole; the others as nvJitLink
    cubins."""
    from types import SimpleNamespace

    from ptxgen.runtime import kernels

    loaded = {}

    class FakeModule:
        def __init__(self, image, name):
            loaded[name] = image

        def function(self, *a):
            return SimpleNamespace()

    monkeypatch.setattr(kernels, "Module", FakeModule)
    monkeypatch.setattr(kernels, "current", lambda: SimpleNamespace(sm=90, name="fake H200"))
    monkeypatch.setattr(kernels, "_LOADED", {})
    monkeypatch.setattr(kernels, "_BEST", {})
    assert kernels.manifest("sm_90a")["mmq_q4_k_wgmma_ra_n256"]["meta"]["compile"] == "whole-program"
    assert "compile" not in kernels.entry("mmq_q4_k_wgmma_ra_n192", "sm_90a")["meta"]
    kernels.load("mmq_q4_k_wgmma_ra_n256")
    kernels.load("mmq_q4_k_wgmma_ra_n192")
    assert loaded["mmq_q4_k_wgmma_ra_n256"].endswith(b"\0") and b".target sm_90a" in loaded["mmq_q4_k_wgmma_ra_n256"]
    assert loaded["mmq_q4_k_wgmma_ra_n192"][:4] == b"\x7fELF"


def test_mmq_plan_matches_its_parts():
    """ops.mmq_plan (what mmq_launch launches): the mma.sync builds' tail plan with the spread fixup where every
    split item holds a CTA; the wgmma builds' one-round plan over the items (clusters: items of cl M-tiles over the
    resident clusters), never spread; the grid never exceeds the resident slots."""
    from ptxgen.runtime import ops

    class Fn:  # a loaded build as far as the plan looks: its residency and cluster shape
        def __init__(self, per_sm, cluster=1):
            self.per_sm, self.meta = per_sm, {"cluster": (cluster, 1, 1)} if cluster > 1 else {}

        def resident_per_sm(self):
            return self.per_sm

        def resident_clusters(self, cl):
            return 132 // cl

    p = ops.mmq_plan(Fn(1), 4096, 1024, 128, 128, True, 132)  # 32 tiles x 16 K-steps on 132 CTAs
    whole, splits, per = ops.splitk_plan_tail(32, 16, 132)
    assert (p.tiles_n, p.tiles, p.whole, p.splits, p.per) == (1, 32, whole, splits, per) and splits > 1
    assert p.items == whole + (32 - whole) * splits and p.ctas == min(p.items, 132)
    assert p.spread == ops.mmq_spread_fixup(32 - whole, splits, p.ctas)
    p = ops.mmq_plan(Fn(1), 4096, 4096, 512, 256, False, 132)  # wgmma n256: 64 tiles, 2 splits
    assert (p.tiles_n, p.tiles, p.whole) == (2, 64, 0) and (p.splits, p.per) == ops.splitk_plan_one_round(64, 64, 132)
    assert p.items == 64 * p.splits and p.ctas == min(p.items, 132) and not p.spread and p.grid == (p.ctas,)
    p = ops.mmq_plan(Fn(1, cluster=2), 4096, 4096, 512, 256, False, 132)  # clusters of 2: 32 groups of 2 M-tiles
    assert (p.splits, p.per) == ops.splitk_plan_one_round(32, 64, 66) and p.ctas == min(32 * p.splits, 66)
    assert p.cluster == 2 and p.grid == (2 * p.ctas,)  # the launch: every cluster's CTAs
    p = ops.mmq_plan(Fn(2), 14336, 4096, 4096, 128, True, 132)  # 3584 tiles: whole rounds, then the tail split
    assert (p.tiles, p.whole % 264, p.ctas) == (32 * 112, 0, 264) and p.items == p.whole + (p.tiles - p.whole) * p.splits
    assert not p.spread  # more split items than resident CTAs: the last-CTA fixup (the spread one could deadlock)


def test_register_a_mmq_converts_x_itself_when_its_plan_has_no_k_split(monkeypatch):
    """mul_mat's rule for the sm_90 register-A MMQ (README): mmq_q4_k_wgmma_ra_n*_cx (x converted inside the
    launch) from ops.RULES.mmq_cx_min_tokens tokens when the plan has at most ops.RULES.mmq_cx_max_splits K splits,
    convert_f16_perm + mmq_q4_k_wgmma_ra_n* otherwise;
    PTXGEN_MMQ_CX=1 / 0 force it, anything else is an error. The builds are in the sm_90a manifest with the chunking
    the runtime sizes x_ready from, and only there (no wgmma on sm_89 / sm_120a)."""
    from ptxgen.runtime import kernels, ops

    man = kernels.manifest("sm_90a")
    for bn in (128, 256):
        meta = man[f"mmq_q4_k_wgmma_ra_n{bn}_cx"]["meta"]
        assert meta["convert_steps"] * 64 == 256 and meta["pdl"] is False and "fp32" in meta["activations"]
        assert f"mmq_q4_k_wgmma_ra_n{bn}_cx" not in kernels.manifest("sm_89")
        assert f"mmq_q4_k_wgmma_ra_n{bn}_cx" not in kernels.manifest("sm_120a")
    setknob(monkeypatch, "PTXGEN_MMQ_CX", None)
    assert ops.mmq_convert_in_gemm(1024, 1) and ops.mmq_convert_in_gemm(4096, 1)
    assert not ops.mmq_convert_in_gemm(1024, 2) and not ops.mmq_convert_in_gemm(1023, 1)
    setknob(monkeypatch, "PTXGEN_MMQ_CX", "1")
    assert ops.mmq_convert_in_gemm(64, 4)
    setknob(monkeypatch, "PTXGEN_MMQ_CX", "0")
    assert not ops.mmq_convert_in_gemm(4096, 1)
    setknob(monkeypatch, "PTXGEN_MMQ_CX", "sometimes")
    with pytest.raises(ValueError, match="PTXGEN_MMQ_CX"):
        ops.mmq_convert_in_gemm(4096, 1)


def test_register_a_mmq_token_tile_rule():
    """mul_mat's register-A token tile (README): n64 up to ops.RULES.wgmma_ra_n64_max_tokens, n128 up to
    WGMMA_RA_N128_MAX_TOKENS, n256 above; every tile of the rule is an emitted sm_90a build (and no other target's)."""
    from ptxgen.runtime import kernels, ops

    assert [ops._rega_tile(t) for t in (1, 49, 64, 65, 128, 129, 4096)] == [64, 64, 64, 128, 128, 256, 256]
    for bn in {ops._rega_tile(t) for t in range(1, 600)}:
        assert kernels.available(f"mmq_q4_k_wgmma_ra_n{bn}") == ["sm_90a"]
    assert set(ops.WGMMA_RA_TILES) >= {64, 128, 256}


def test_prepared_mmq_rule_and_builds(monkeypatch):
    """mul_mat's rule for the prepared register-A MMQ (README): from ops.RULES.mmq_pre_min_tokens tokens; PTXGEN_MMQ_PRE=1
    wherever the register-A path runs its n256 tile, 0 never, anything else an error. Its builds and
    dequantize_q4_k_frags are sm_90a only; the prepared builds' 4-stage ring fits the shared memory (the converting one
    beside 2-step conversion units) and they launch with PDL behind dequantize_q4_k_frags, which writes 16 KB blocks."""
    from ptxgen import layouts
    from ptxgen.runtime import kernels, ops

    man = kernels.manifest("sm_90a")
    for name in ("dequantize_q4_k_frags", "mmq_q4_k_wgmma_pre_n256", "mmq_q4_k_wgmma_pre_n256_cx"):
        assert kernels.available(name) == ["sm_90a"]
    assert man["dequantize_q4_k_frags"]["meta"]["block_bytes"] == layouts.RA_FRAG_BYTES == 16384
    for sfx in ("", "_cx"):
        meta = man[f"mmq_q4_k_wgmma_pre_n256{sfx}"]["meta"]
        assert meta["stages"] == 4 and meta["pdl"] is True and "dequantize_q4_k_frags" in meta["prepared"]
        assert meta["dynamic_smem"] <= 227 * 1024
    assert man["mmq_q4_k_wgmma_pre_n256_cx"]["meta"]["convert_steps"] == 2  # half-size units beside 4 stages
    setknob(monkeypatch, "PTXGEN_MMQ_PRE", None)
    assert ops.mmq_prepared(ops.RULES.mmq_pre_min_tokens) and ops.mmq_prepared(8192)
    assert not ops.mmq_prepared(ops.RULES.mmq_pre_min_tokens - 1)
    setknob(monkeypatch, "PTXGEN_MMQ_PRE", "1")
    assert ops.mmq_prepared(ops.RULES.wgmma_ra_n128_max_tokens + 1) and not ops.mmq_prepared(ops.RULES.wgmma_ra_n128_max_tokens)
    setknob(monkeypatch, "PTXGEN_MMQ_PRE", "0")
    assert not ops.mmq_prepared(8192)
    setknob(monkeypatch, "PTXGEN_MMQ_PRE", "maybe")
    with pytest.raises(ValueError, match="PTXGEN_MMQ_PRE"):
        ops.mmq_prepared(8192)


def test_prepared_fragments_model_places_every_weight_once():
    """layouts.q4k_rega_fragments: every weight of an (M, K) matrix appears exactly once, at the register-A
    fragment place of its (row, column) — thread ct = 32·(row // 16) + 4·(row % 8) + t holds it in slice kk —
    and the padding rows past M are zero."""
    from ptxgen import layouts

    m, k = 131, 128
    vals = (np.arange(m * k) % 2039 + 1).astype(np.float16).reshape(m, k)  # distinct enough, all nonzero
    ids = np.arange(m * k, dtype=np.int64).reshape(m, k)
    f = layouts.q4k_rega_fragments(vals).view(np.uint16).reshape(2, 2, 4, 256, 4, 2)
    assert f.shape[:2] == (2, 2)  # ceil(131 / 128) M-tiles x 2 K-steps
    order = layouts.q4k_rega_k_order()
    seen = np.zeros(m * k, bool)
    for tm in range(2):
        for s in range(2):
            for kk in range(4):
                for ct in range(256):
                    cw, g, t = ct // 32, (ct % 32) // 4, ct % 4
                    for j in range(4):
                        row = 128 * tm + 16 * cw + g + 8 * (j & 1)
                        for e in range(2):
                            col = 64 * s + order[16 * kk + 2 * t + 8 * (j >> 1) + e]
                            got = f[tm, s, kk, ct, j, e]
                            if row < m:
                                assert got == vals[row, col].view(np.uint16)
                                assert not seen[ids[row, col]]
                                seen[ids[row, col]] = True
                            else:
                                assert got == 0
    assert seen.all()


def test_a_per_thread_stream_buffer_dropped_in_another_thread_is_freed_on_the_legacy_stream(monkeypatch):
    """A buffer from the per-thread default stream (0x2) names a different stream in each thread: dropped by its own
    thread it is freed in that stream's order; dropped by another (a GC pass, a worker) on the legacy stream, whose
    free waits for the earlier work of every blocking stream (the allocating thread's included)."""
    import threading

    from ptxgen.runtime import driver

    freed = []

    class Drv:
        @staticmethod
        def cuMemFreeAsync(ptr, stream):
            freed.append((ptr, stream))

    monkeypatch.setattr(driver, "_drv", lambda: Drv)
    monkeypatch.setattr(driver, "_fresh_status", lambda stream: 0)  # (__del__'s own capture query)

    def buffer(ptr, thread):
        b = driver.DeviceBuffer.__new__(driver.DeviceBuffer)
        b.ptr, b.nbytes, b.stream, b._kind, b._owner, b._thread = ptr, 4, driver.PER_THREAD_STREAM, "stream", None, thread
        return b

    here = threading.get_ident()
    buffer(0x1000, here).__del__()
    buffer(0x2000, here + 1).__del__()
    assert freed == [(0x1000, driver.PER_THREAD_STREAM), (0x2000, driver.LEGACY_STREAM)]


def test_frees_that_would_invalidate_a_capture_wait_or_go_relaxed(monkeypatch):
    """A buffer a GC pass drops while a capture records: cuMemFree goes at once with the thread's capture mode
    relaxed (a global-mode capture would refuse it and be invalidated; relaxed, the graph is kept — H100, 2026-12-06)
    and the mode is put back; a legacy-stream free dropped while an op records into a capture (driver.hold_frees)
    waits in driver._HELD; one on another stream is freed at once. free_held frees the held ones once nothing holds
    — at synchronize(), or after a cuMemAlloc outside relaxed_capture (a global capture would have refused it), not
    inside one — and keeps a free that fails for a later pass; a cuMemFree that fails waits in driver._UNFREED and
    is retried there too."""
    import ctypes

    from ptxgen.runtime import driver

    calls, fail, mode = [], set(), [0]  # mode: this thread's capture mode (0: global)

    class Drv:
        @staticmethod
        def cuMemFree(ptr):
            calls.append(("free", ptr, mode[0]))
            return (1 if ptr in fail else 0,)

        @staticmethod
        def cuMemFreeAsync(ptr, stream):
            calls.append(("async", ptr, stream))
            return (1 if ptr in fail else 0,)

        @staticmethod
        def cuMemAlloc(size):
            return (0, 0xA000)

    class Lib:
        @staticmethod
        def cuThreadExchangeStreamCaptureMode(ref):
            m = ctypes.cast(ref, ctypes.POINTER(ctypes.c_int)).contents
            m.value, mode[0] = mode[0], m.value
            return 0

    monkeypatch.setattr(driver, "_drv", lambda: Drv)
    monkeypatch.setattr(driver, "libcuda", lambda: Lib)
    monkeypatch.setattr(driver, "_fresh_status", lambda stream: 0)
    monkeypatch.setattr(driver, "current", lambda: None)
    monkeypatch.setattr(driver, "check", lambda result, what="": result[1] if len(result) > 1 else None)
    monkeypatch.setattr(driver, "_HELD", [])
    monkeypatch.setattr(driver, "_UNFREED", [])

    def buffer(ptr, kind, stream=None):
        b = driver.DeviceBuffer.__new__(driver.DeviceBuffer)
        b.ptr, b.nbytes, b.stream, b._kind, b._owner, b._thread = ptr, 4, stream, kind, None, 0
        return b

    driver.hold_frees(1)
    try:
        buffer(0x1000, "sync").__del__()
        buffer(0x2000, "stream", driver.LEGACY_STREAM).__del__()
        buffer(0x3000, "stream", 0x77).__del__()
        assert calls == [("free", 0x1000, 2), ("async", 0x3000, 0x77)] and mode == [0]
        assert driver._HELD == [0x2000]
        driver.free_held()  # (an op still records: nothing goes)
        assert len(calls) == 2
    finally:
        driver.hold_frees(-1)
    driver._TLS.relaxed = 1  # (relaxed_capture's thread flag) a cuMemAlloc inside it proves nothing: no drain
    try:
        driver.DeviceBuffer(16).ptr = 0  # (its own free out of the way)
    finally:
        driver._TLS.relaxed = 0
    assert len(calls) == 2
    fail.add(0x2000)
    driver.DeviceBuffer(16).ptr = 0  # outside it: the drain, the failed free kept
    assert calls[2:] == [("async", 0x2000, driver.LEGACY_STREAM)] and driver._HELD == [0x2000]
    fail.clear()
    driver.free_held()
    assert driver._HELD == [] and calls[-1] == ("async", 0x2000, driver.LEGACY_STREAM)
    buffer(0x4000, "sync").__del__()  # (no capture anywhere: the same relaxed free)
    assert calls[-1] == ("free", 0x4000, 2) and mode == [0]
    fail.add(0x5000)  # a cuMemFree that fails (a context not current in a GC thread, say) is kept and retried
    buffer(0x5000, "sync").__del__()
    assert driver._UNFREED == [0x5000] and mode == [0]
    driver.free_held()
    assert driver._UNFREED == [0x5000] and calls[-1] == ("free", 0x5000, 2)
    fail.clear()
    driver.free_held()
    assert driver._UNFREED == [] and calls[-1] == ("free", 0x5000, 2) and mode == [0]


def test_an_op_writing_a_device_array_out_makes_its_numpy_wait_for_that_stream():
    """DeviceArray.stream is the stream whose work writes it: an op that fills `out` on another stream moves it
    there, so out.numpy() waits for that op rather than for the stream the array was allocated on."""
    from ptxgen.runtime import ops
    from ptxgen.runtime.arrays import DeviceArray

    out = DeviceArray(0x1000, (2, 4), np.dtype(np.float32), stream=7)
    o, ret = ops._output(out, (2, 4), np.float32, "out", None, 9)
    assert o is out and ret is out and out.stream == 9


def test_torch_cuda_tensors_are_read_from_their_attributes(monkeypatch):
    """A CUDA torch tensor becomes a DeviceArray from its attributes (data_ptr, shape, dtype), not from
    __cuda_array_interface__, which torch builds anew on every read; dtype, contiguity and alignment are checked as
    for any array. (A stand-in class plays the CUDA tensor: no GPU or torch needed.)"""
    from ptxgen.runtime import arrays, driver

    class FakeCuda:
        is_cuda = True

        def __init__(self, shape, dtype, contiguous=True, ptr=0x7F0000001000):
            self.shape, self.dtype, self._c, self._p = shape, dtype, contiguous, ptr

        def is_contiguous(self):
            return self._c

        def numel(self):
            return int(np.prod(self.shape))

        def stride(self):
            return (1, self.shape[0])

        def data_ptr(self):
            return self._p

        @property
        def __cuda_array_interface__(self):
            raise AssertionError("read the CUDA array interface")

    monkeypatch.setattr(driver, "_TORCH", [(FakeCuda, None, None)])
    monkeypatch.setattr(arrays, "_TORCH_NP", {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)})
    a = arrays.as_device_array(FakeCuda((2, 3), "f32"), "x", np.float32, ndim=2, align=16)
    assert (a.ptr, a.shape, a.dtype) == (0x7F0000001000, (2, 3), np.dtype(np.float32))
    assert arrays.shape_of(FakeCuda((5,), "f16")) == (5,)
    with pytest.raises(TypeError, match="expected dtype float32, got float16"):
        arrays.as_device_array(FakeCuda((2, 3), "f16"), "x", np.float32)
    with pytest.raises(ValueError, match="non-contiguous"):
        arrays.as_device_array(FakeCuda((2, 3), "f32", contiguous=False), "x")
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        arrays.as_device_array(FakeCuda((2, 3), "f32", ptr=0x7F0000001004), "x", align=16)


def test_few_token_gemv_launches_pick_the_ctas_warps_and_k_parts(monkeypatch):
    """On the (fake) H200 the few-token Q4_K GEMV runs 8-warp CTAs with 8 K parts on 4096 rows (no grid split),
    4-warp CTAs where the rows alone fill the GPU (18944x3584: 296 CTAs, as many warps as 148 of 8 but at most 12
    on an SM instead of 16) or where 4-warp CTAs take the same parts with finer CTAs (14336x4096), and at most 2
    parts at T = 4 (few_max_k_parts: the 4-token records outweigh the weights)."""
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)

    def plan(t, m, k):
        ln = ops.choose("q4_K", "exact", None, t, m, k).launches[-1]
        assert ln.fn.name.startswith(("gemv_q4_k_mma_t", "gemv_q4_k_i8_t"))  # (1-2 tokens: the int8 builds, same plans)
        return ln.grid, (ln.block or ln.fn.block)[0] // 32, ln.args[-1]
    assert plan(1, 4096, 14336) == ((256, 1), 8, 8)
    assert plan(1, 18944, 3584) == ((296, 1), 4, 1)
    assert plan(1, 14336, 4096) == ((448, 1), 4, 2)
    grid, warps, kp = plan(4, 4096, 14336)
    assert kp <= 2


def test_quant_tensor_reads_its_blocks_largest_scale():
    """QuantTensor.max_scale: the largest |fp16 scale field| of the blocks, from the host bytes (None for bytes
    wrapped on the GPU, unless given); fp16_weights: within formats.fp16_weight_scale, the largest scale at which
    every weight the format can express fits in fp16."""
    rng = np.random.default_rng(5)
    for fmt, field in (("q4_K", "dmin"), ("q5_K", "d"), ("q6_K", "d"), ("q8_0", "d"), ("tq4_1s", "d1")):
        raw = formats.quantize(fmt, rng.standard_normal((3, 512)).astype(np.float32))
        f = formats.get(fmt)
        blocks = f.fields(raw, (3, 512))
        want = max(float(np.abs(blocks[n].astype(np.float32)).max()) for n in f.dtype.names if f.dtype[n] == "<f2")
        qt = QuantTensor.from_raw(fmt, raw, (3, 512))
        assert qt.max_scale == want and qt.fp16_weights
        edge = formats.fp16_weight_scale(fmt)
        assert edge * formats.WEIGHT_PER_SCALE[fmt] <= 65504 < float(np.nextafter(np.float16(edge), np.float16(np.inf))) * formats.WEIGHT_PER_SCALE[fmt]
        blocks[field][4] = np.float16(-2 * edge)  # one block's field past the bound
        big = QuantTensor.from_raw(fmt, blocks.view(np.uint8).reshape(-1), (3, 512))
        assert big.max_scale == 2 * np.float32(np.float16(edge)) and not big.fp16_weights
        assert big.expert(0).max_scale == big.max_scale if len(big.shape) == 3 else True
        blocks[field][4] = np.float16(np.nan)
        assert QuantTensor.from_raw(fmt, blocks.view(np.uint8).reshape(-1), (3, 512)).max_scale == np.inf


def test_cat_joins_the_rows_of_one_format_and_k():
    """QuantTensor.cat: the inputs' GGUF bytes one after another, shape (ΣM, K), max_scale the largest (read from
    the bytes, also where an input's was not known); mixed formats or K, experts, nothing, or a non-tensor are
    clear errors."""
    rng = np.random.default_rng(0)
    a, b = (QuantTensor.from_numpy(rng.standard_normal((m, 512)).astype(np.float32), "q4_K") for m in (3, 5))
    c = QuantTensor.cat([a, b])
    assert c.fmt == "q4_K" and c.shape == (8, 512) and not c.on_device
    np.testing.assert_array_equal(c.raw(), np.concatenate([a.raw(), b.raw()]))
    assert c.max_scale == max(a.max_scale, b.max_scale)
    assert QuantTensor.cat([a]).shape == a.shape
    wrapped = QuantTensor("q4_K", (5, 512), host=b.raw())
    wrapped.max_scale = None  # (as for bytes wrapped on the GPU)
    assert QuantTensor.cat([a, wrapped]).max_scale == c.max_scale
    with pytest.raises(ValueError, match="item 1 is q6_K with K = 512, item 0 q4_K"):
        QuantTensor.cat([a, QuantTensor.from_numpy(np.ones((2, 512), np.float32), "q6_K")])
    with pytest.raises(ValueError, match="item 1 is q4_K with K = 256"):
        QuantTensor.cat([a, QuantTensor.from_numpy(np.ones((2, 256), np.float32), "q4_K")])
    with pytest.raises(ValueError, match="holds experts"):
        QuantTensor.cat([a, QuantTensor.from_numpy(np.ones((2, 2, 512), np.float32), "q4_K")])
    with pytest.raises(ValueError, match="no tensors"):
        QuantTensor.cat([])
    with pytest.raises(TypeError, match="item 1 is a ndarray"):
        QuantTensor.cat([a, np.ones((2, 512))])


def test_a_cat_of_small_projections_plans_one_op(monkeypatch):
    """Llama's q and k (4096 + 1024 rows) as one (5120, 4096) tensor: one plan (one activation prep or conversion,
    one GEMV or GEMM, its fixup), as q's alone, where the two separate ops launch two of each (k alone at T = 1:
    the one-launch codec GEMV of small weights)."""
    from ptxgen.runtime import ops
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    q, k, qk = (fakegpu.weights("q4_K", m, 4096) for m in (4096, 1024, 5120))
    for t in (1, 512):
        one = len(ops.mul_mat_plan(q, t, graph=True).kernels)
        assert len(ops.mul_mat_plan(qk, t, graph=True).kernels) == one < one + len(ops.mul_mat_plan(k, t, graph=True).kernels)

"""A user's mistake at the NumPy references, the GGUF writer and reader and the compiler gives one clear exception
that names it (what was expected, what came), never a NumPy traceback, an AttributeError or a file the reader
refuses later; a failed compile keeps one PTX file per distinct failure."""
import re
import tempfile

import numpy as np
import pytest

from ptxgen import formats
from ptxgen.gguf import (GGML_IDS, GGML_TYPES, GGUFError, GGUFTensorNotFound, list_gguf_tensors, read_gguf_tensor,
                         type_name, write_gguf)
from ptxgen.runtime import compiler
from ptxgen.runtime.tensors import QuantTensor

M, K = 8, 512


def _q4k(m=M, k=K, seed=0):
    return formats.quantize("q4_K", np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32))


# --- 1. the float64 references check x, raw, m and k ---------------------------------------------------------

@pytest.mark.parametrize("args,match", [
    (lambda raw, x: (raw, M, K, x[:, :256]), r"x must be \(T, K\) = \(T, 512\) for W \(M, K\) = \(8, 512\), got shape \(3, 256\)"),
    (lambda raw, x: (raw, M, K, x.T), r"got shape \(512, 3\) \(transposed\? pass x.T\)"),
    (lambda raw, x: (raw, M, K, x[0]), r"got shape \(512,\) \(one token: pass x\[None, :\]\)"),
    (lambda raw, x: (raw, M, K, x[None]), r"got shape \(1, 3, 512\)"),
    (lambda raw, x: (raw, K, M, x), r"q4_K: K=8 is not a positive multiple of the block size 256"),
    (lambda raw, x: (raw[:3], M, K, x), r"q4_K \(M, K\) = \(8, 512\) needs 2304 bytes .* got 864 \(that is 3 rows of K=512\)"),
    (lambda raw, x: (raw, 4, K, x), r"needs 1152 bytes .* got 2304"),
])
def test_gemm_ref_names_a_wrong_x_or_raw(args, match):
    raw, x = _q4k(), np.ones((3, K), np.float32)
    with pytest.raises(ValueError, match=f"^gemm_ref: .*{match}"):
        formats.gemm_ref("q4_K", *args(raw, x))
    assert formats.gemm_ref("q4_K", raw, M, K, x).shape == (3, M)


def test_gemm_ref_names_swapped_m_and_k():
    """m and k swapped with whole blocks both ways: raw's byte count matches, x names the swap."""
    raw, x = _q4k(256, K), np.ones((2, K), np.float32)
    with pytest.raises(ValueError, match=r"got shape \(2, 512\) \(m and k swapped\?"):
        formats.gemm_ref("q4_K", raw, K, 256, x)


def test_the_sibling_references_check_x_too():
    raw, x = _q4k(), np.ones((3, 256), np.float32)
    with pytest.raises(ValueError, match=r"gemm_q8_1_ref: x must be \(T, K\) = \(T, 512\)"):
        formats.gemm_q8_1_ref("q4_K", raw, M, K, x)
    tq = formats.quantize("tq4_1s", np.ones((4, 128), np.float32))
    for ref in (formats.gemv_tq4_1s_ref, formats.gemv_tq4_1s_fast_ref):
        with pytest.raises(ValueError, match=rf"{ref.__name__}: x must be \(T, K\) = \(T, 128\).*got shape \(128,\)"):
            ref(tq, 4, 128, np.ones(128, np.float32))
    e_raw = formats.quantize("q8_0", np.ones((2 * 3, 64), np.float32))
    ids = np.zeros((5, 2), np.int32)
    with pytest.raises(ValueError, match=r"mul_mat_id_ref: x must be \(T, K\) = \(5, 64\) .* got shape \(5, 32\)"):
        formats.mul_mat_id_ref("q8_0", e_raw, (2, 3, 64), np.ones((5, 32), np.float32), ids)
    with pytest.raises(ValueError, match=r"mul_mat_id_ref: q8_0 \(E, M, K\) = \(3, 3, 64\) needs 612 bytes"):
        formats.mul_mat_id_ref("q8_0", e_raw, (3, 3, 64), np.ones((5, 64), np.float32), ids)
    assert formats.mul_mat_id_ref("q8_0", e_raw, (2, 3, 64), np.ones((5, 64), np.float32), ids).shape == (5, 2, 3)


# --- 2. write_gguf checks every entry before it writes -------------------------------------------------------

@pytest.mark.parametrize("tensors,error,match", [
    ({"a": np.zeros((4, 4), np.float32)}, TypeError,
     r"tensor 'a': expected a QuantTensor or a \(type_id, \(M, K\) or \(E, M, K\), raw uint8\) tuple, got a float32 array"),
    ({7: (12, (M, K), _q4k())}, TypeError, r"tensor names must be str, got 7 \(int\)"),
    ({"w": (12, (256, 1024), np.zeros(10, np.uint8))}, ValueError,
     r"tensor 'w': Q4_K \(12\) of shape \(256, 1024\) needs 147456 bytes .* got 10"),
    ({"w": (12, (M, 300), np.zeros(10, np.uint8))}, ValueError, r"tensor 'w': .*K=300 .* not a multiple of 256"),
    ({"w": (-1, (M, K), _q4k())}, ValueError, r"tensor 'w': the type id must be a GGML type id"),
    ({"w": ("q4_K", (M, K), _q4k())}, ValueError, r"tensor 'w': the type id must be .* got 'q4_K' \(str\)"),
    ({"w": (12, (0, K), _q4k())}, ValueError, r"tensor 'w': the shape must be 1 to 4 positive ints"),
    ({"w": (0, (2, 4), np.zeros(8, np.float32))}, TypeError, r"tensor 'w': raw must be the tensor's bytes, uint8"),
    ({"ok": (12, (M, K), _q4k()), "w": (12, (M, K))}, TypeError, r"tensor 'w': expected a QuantTensor"),
])
def test_write_gguf_names_a_bad_tensor_and_writes_nothing(tmp_path, tensors, error, match):
    path = tmp_path / "bad.gguf"
    with pytest.raises(error, match=f"write_gguf: {match}"):
        write_gguf(path, tensors)
    assert not path.exists()
    with pytest.raises(TypeError, match="metadata keys must be str, got 1"):
        write_gguf(path, {"ok": (12, (M, K), _q4k())}, {1: "x"})
    assert not path.exists()


def test_write_gguf_sizes_are_ggmls(tmp_path):
    """Every type the writer sizes is sized as ggml sizes it (the `gguf` package's table, whose Q8_1 is still the
    40-byte block of float scales), and as ptxgen's own formats for the ones ptxgen reads; QuantTensors and F32
    bytes still write, and ids ggml does not size (TQ4_1S's, other forks') are written as given."""
    gguf = pytest.importorskip("gguf")
    for t, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if t.value in GGML_TYPES and t.name != "Q8_1":
            assert GGML_TYPES[t.value] == (t.name, block, size)
    for i, fmt in GGML_IDS.items():
        f = formats.get(fmt)
        assert GGML_TYPES[i][1:] == (f.block_size, f.block_bytes)
    path = tmp_path / "ok.gguf"
    f32 = np.arange(16, dtype=np.float32).reshape(2, 8)
    write_gguf(path, {"w": QuantTensor.from_numpy(np.ones((M, K), np.float32), "q4_K"),
                      "norm": (0, (2, 8), f32.view(np.uint8)), "fork": (77, (2, 32), np.zeros(5, np.uint8))})
    infos = {i.name: i for i in list_gguf_tensors(path)}
    assert [infos[n].type_name for n in ("w", "norm", "fork")] == ["Q4_K (12)", "F32 (0)", "unknown (77)"]


# --- 3. the reader: missing names, truncated files, type names ------------------------------------------------

def _model(tmp_path):
    names = [f"blk.{i}.{p}.weight" for i in range(3) for p in ("attn_q", "attn_k", "ffn_up")]
    tensors = {n: (12, (M, K), _q4k(seed=j)) for j, n in enumerate(names)}
    path = tmp_path / "m.gguf"
    write_gguf(path, tensors)
    return path, tensors


def test_a_missing_tensor_is_a_gguf_error_and_a_key_error_with_close_names(tmp_path):
    path, _ = _model(tmp_path)
    with pytest.raises(GGUFError) as e:
        read_gguf_tensor(path, "blk.1.attn_v.weight")
    assert isinstance(e.value, KeyError) and isinstance(e.value, GGUFTensorNotFound)
    msg = str(e.value)
    assert msg.startswith(f"{path}: no tensor 'blk.1.attn_v.weight'; the file has 9 tensors; the closest: ")
    close = msg.split("the closest: ")[1].split(", ")
    assert 1 <= len(close) <= 5 and "'blk.1.attn_q.weight'" in close
    with pytest.raises(KeyError, match=r"no tensor 'zzz'; the file has 9 tensors; the first: 'blk.0.attn_q.weight'"):
        read_gguf_tensor(path, "zzz")


def test_a_truncated_file_lists_and_names_the_tensor_asked_for(tmp_path):
    """Cut inside the data: the tensor table is whole, so listing works, the tensors before the cut read back, and
    each one cut (or past the end) is named when it is the one asked for."""
    path, tensors = _model(tmp_path)
    names, blob = list(tensors), path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(blob[:-(tensors[names[-1]][2].size + 100)])  # the last tensor gone, 100 bytes of the one before
    assert [i.name for i in list_gguf_tensors(cut)] == names
    assert read_gguf_tensor(cut, names[0])[2].tobytes() == tensors[names[0]][2].tobytes()
    with pytest.raises(GGUFError, match=rf"cut.gguf: tensor '{names[-2]}': q4_K 8x512 needs 2304 bytes .* the end of "
                                        r"the file comes \d+ bytes after it: the file is truncated"):
        read_gguf_tensor(cut, names[-2])
    with pytest.raises(GGUFError, match=rf"cut.gguf: tensor '{names[-1]}': its data .* lies past the end of the file"):
        read_gguf_tensor(cut, names[-1])
    header = tmp_path / "header.gguf"
    header.write_bytes(blob[:100])  # inside the tensor table: nothing to list, but the error says what was asked
    with pytest.raises(GGUFError, match=rf"header.gguf: reading tensor '{names[0]}': "):
        read_gguf_tensor(header, names[0])


def test_unsupported_types_are_named_as_ggml_names_them(tmp_path):
    path = tmp_path / "t.gguf"
    write_gguf(path, {"f32": (0, (2, 8), np.zeros(64, np.uint8)), "q4_0": (2, (2, 32), np.zeros(36, np.uint8)),
                      "bf16": (30, (2, 8), np.zeros(32, np.uint8)), "fork": (77, (2, 32), np.zeros(40, np.uint8))})
    for name, shown in (("f32", "F32 (0)"), ("q4_0", "Q4_0 (2)"), ("bf16", "BF16 (30)")):
        with pytest.raises(GGUFError, match=rf"tensor '{name}': GGML type id \d+ is not one ptxgen reads: that is "
                                            rf"{re.escape(shown)}; ptxgen reads Q8_0 \(8\)"):
            read_gguf_tensor(path, name)
    with pytest.raises(GGUFError, match=r"GGML type id 77 is not one ptxgen reads: ggml names no type 77 .*TQ4_1S "
                                        r"\(46 or 48\)"):
        read_gguf_tensor(path, "fork")
    assert [type_name(i) for i in (12, 46, 48, 29, 4)] == ["Q4_K (12)", "TQ4_1S (46)", "TQ4_1S (48)", "IQ1_M (29)",
                                                            "unknown (4)"]


# --- 4. a failed compile keeps one PTX file per distinct failure ----------------------------------------------

def test_a_repeated_compile_failure_overwrites_its_ptx_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ptx = ".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx\n"
    first = compiler._failure_message(ptx, "sm_90", (), "error: bad")
    again = compiler._failure_message(ptx, "sm_90", (), "error: bad")
    other = compiler._failure_message(ptx + "\n", "sm_90", (), "error: bad")
    kept = sorted(tmp_path.glob("ptxgen-failed-*.ptx"))
    assert len(kept) == 2 and not list(tmp_path.glob(".ptxgen-failed-*"))
    path = compiler.failed_ptx_path(ptx, "sm_90")
    assert path.parent == tmp_path and path.read_text() == ptx
    assert first == again and f"-v {path} -o /dev/null" in first and str(path) not in other


def test_a_real_compile_failure_twice_leaves_one_file(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvjitlink")
    from ptxgen.runtime.kernels import ptx_source

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    broken = ptx_source("quantize_q8_1", "sm_89")[0].replace("add.rn.f32", "add.rn.f99")
    for _ in range(2):
        with pytest.raises(compiler.CompileError, match=r"reproduce: ptxas -arch=sm_90 .*ptxgen-failed-sm_90-"):
            compiler.compile_ptx(broken, "sm_90", name="broken")
    (kept,) = tmp_path.glob("ptxgen-failed-*.ptx")
    assert kept.read_text() == broken

"""GGUF reading (ptxgen.gguf): files written by the `gguf` package and by ptxgen read back byte for byte; corrupt,
truncated and hostile files give one GGUFError naming the file (and the tensor), never a crash, a hang or an
allocation sized by the file's claims."""
import functools
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ptxgen import formats
from ptxgen.gguf import GGUFError, GGUFFile, format_of, list_gguf_tensors, read_gguf_tensor, write_gguf
from ptxgen.runtime import QuantTensor


@functools.cache
def _tensors():
    rng = np.random.default_rng(0)
    return {"blk.0.attn_q.weight": (12, (3, 256), formats.quantize("q4_K", rng.standard_normal((3, 256)).astype(np.float32))),
            "blk.0.ffn_down.weight": (14, (2, 512), formats.quantize("q6_K", rng.standard_normal((2, 512)).astype(np.float32))),
            "output.weight": (8, (4, 64), formats.quantize("q8_0", rng.standard_normal((4, 64)).astype(np.float32)))}


def _file(tmp_path, name="m.gguf", alignment=32):
    tensors = _tensors()  # quantized once: the fuzz test writes this file per example
    path = tmp_path / name
    write_gguf(path, tensors, {"general.architecture": "llama", "general.alignment": alignment})
    return path, tensors


def test_written_files_read_back_byte_for_byte(tmp_path):
    path, tensors = _file(tmp_path)
    infos = {i.name: i for i in list_gguf_tensors(path)}
    assert set(infos) == set(tensors)
    for name, (type_id, shape, raw) in tensors.items():
        fmt, got_shape, got = read_gguf_tensor(path, name)
        assert (fmt, got_shape) == (format_of(type_id), shape) and infos[name].fmt == fmt
        assert got.tobytes() == raw.tobytes()
    with GGUFFile(path) as f:
        assert f.metadata["general.architecture"] == "llama" and f.version == 3


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_the_written_alignment_is_the_one_read(tmp_path, alignment):
    """write_gguf pads the data and each tensor to general.alignment, which the reader aligns to."""
    path, tensors = _file(tmp_path, alignment=alignment)
    for name, (_, _, raw) in tensors.items():
        assert read_gguf_tensor(path, name)[2].tobytes() == raw.tobytes()
    for bad in (48, True, 0):
        with pytest.raises(ValueError, match="general.alignment must be a power of two"):
            write_gguf(tmp_path / "bad.gguf", tensors, {"general.alignment": bad})


def test_files_of_the_gguf_package_read_back(tmp_path):
    gguf = pytest.importorskip("gguf")
    raw = formats.quantize("q5_K", np.random.default_rng(1).standard_normal((5, 512)).astype(np.float32))
    wr = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "llama")
    wr.add_uint32("llama.block_count", 1)
    wr.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5])
    wr.add_tensor("w", raw, raw_dtype=gguf.GGMLQuantizationType.Q5_K)
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()  # noqa: E702
    fmt, shape, got = read_gguf_tensor(tmp_path / "g.gguf", "w")
    assert (fmt, shape) == ("q5_K", (5, 512)) and got.tobytes() == raw.tobytes()
    with GGUFFile(tmp_path / "g.gguf") as f:
        assert f.metadata["tokenizer.ggml.scores"] == [0.5, 1.5, 2.5]


def test_quant_tensor_from_gguf_needs_no_gpu(tmp_path):
    path, tensors = _file(tmp_path)
    w = QuantTensor.from_gguf(path, "blk.0.ffn_down.weight")
    assert w.fmt == "q6_K" and w.shape == (2, 512) and not w.on_device
    assert w.raw().tobytes() == tensors["blk.0.ffn_down.weight"][2].tobytes()


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b"GGUX" + b[4:], "not a GGUF file"),
    (lambda b: b[:4] + struct.pack("<I", 9) + b[8:], "version 9 is not supported"),
    (lambda b: b[:8] + struct.pack("<Q", 2**60) + b[16:], "tensor count .* cannot fit"),
    (lambda b: b[:16] + struct.pack("<Q", 2**62) + b[24:], "metadata count .* cannot fit"),
    (lambda b: b[:20], "too short"),
    (lambda b: b[:100], "truncated|cannot fit"),
    (lambda b: b[:-200], "needs .* bytes|past the end|the end of the file"),
])
def test_corrupt_files_name_the_file(tmp_path, mutate, match):
    path, _ = _file(tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(GGUFError, match=match) as e:
        read_gguf_tensor(bad, "output.weight")
    assert str(bad) in str(e.value)


def test_unknown_types_and_names_are_named(tmp_path):
    write_gguf(tmp_path / "u.gguf", {"w": (30, (4, 64), np.zeros(4 * 64 * 2, np.uint8))})  # BF16: not a ptxgen format
    with pytest.raises(GGUFError, match=r"u.gguf: tensor 'w': GGML type id 30 is not one ptxgen reads"):
        read_gguf_tensor(tmp_path / "u.gguf", "w")
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        read_gguf_tensor(tmp_path / "u.gguf", "nope")
    with pytest.raises(GGUFError, match="cannot open"):
        read_gguf_tensor(tmp_path / "missing.gguf", "w")


def test_a_tq4_1s_id_whose_data_has_another_size_is_refused(tmp_path):
    """TQ4_1S's type ids are the forks' (46, 48): a tensor under one whose data spans more than TQ4_1S's bytes (plus
    padding) is another fork's type, refused by name rather than read as TQ4_1S."""
    good = formats.quantize("tq4_1s", np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32))
    other = np.zeros(2 * good.size, np.uint8)  # as if 40 bytes per 32 weights
    write_gguf(tmp_path / "t.gguf", {"a": (46, (2, 64), good), "b": (46, (2, 64), other), "c": (8, (1, 32), np.zeros(34, np.uint8))})
    assert read_gguf_tensor(tmp_path / "t.gguf", "a")[2].tobytes() == good.tobytes()
    with pytest.raises(GGUFError, match="read as TQ4_1S needs 80 bytes for 2x64, but its data spans 160"):
        read_gguf_tensor(tmp_path / "t.gguf", "b")


def test_a_huge_claimed_shape_is_refused_before_any_allocation(tmp_path):
    path, _ = _file(tmp_path)
    data = bytearray(path.read_bytes())
    i = data.index(b"output.weight") + len(b"output.weight") + 4  # after the name: n_dims, then dims
    data[i:i + 16] = struct.pack("<QQ", 256, 2**40)  # 2^40 rows of q8_0
    (tmp_path / "huge.gguf").write_bytes(bytes(data))
    tracemalloc.start()
    with pytest.raises(GGUFError, match="needs .* bytes"):
        read_gguf_tensor(tmp_path / "huge.gguf", "output.weight")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_files_fail_cleanly(tmp_path, data):
    """Any bytes flipped, any cut: the reader answers with the tensor's bytes, a GGUFError / KeyError naming the
    file, and nothing else."""
    path, tensors = _file(tmp_path)
    blob = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    bad = tmp_path / "fuzz.gguf"
    bad.write_bytes(bytes(blob))
    name = data.draw(st.sampled_from(sorted(tensors)))
    tracemalloc.start()
    try:
        fmt, shape, raw = read_gguf_tensor(bad, name)
        assert raw.size == shape[0] * formats.get(fmt).row_bytes(shape[1])
    except (GGUFError, KeyError) as e:
        assert str(bad) in str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 4 << 20

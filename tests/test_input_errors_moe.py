"""mul_mat_id and MoE expert tensors for a careless caller (and every op's out=): an output that aliases an input, a NumPy `out=`, a wrong
`workspace=`, a hostile GGUF expert tensor's dimensions and a tensor QuantTensor refuses from a GGUF file each give
one clear Python error before any launch, instead of a silent wrong result or a traceback from inside; device ids
far outside [0, E) give NaN rows and count in `errors=` as documented (the emulator). No GPU: the op runs against
ptxgen.testing.fakegpu (nothing launches; the prepared launches are recorded)."""
import struct

import numpy as np
import pytest

from ptxgen import formats
from ptxgen.gguf import GGUFError, write_gguf
from ptxgen.runtime import QuantTensor, mul_mat, mul_mat_id
from ptxgen.runtime.arrays import DeviceArray

E, M, K, T, SLOTS = 8, 64, 256, 3, 2
I32 = np.iinfo(np.int32)


@pytest.fixture
def runs(monkeypatch):
    """The fake H200 (as tests/test_moe.py's _Launches): the names of the kernels each call would launch."""
    from ptxgen.runtime.driver import PreparedLaunch
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    got = []
    monkeypatch.setattr(PreparedLaunch, "run", lambda launch, s: got.append(
        (launch.fn.name, [c.value if hasattr(c, "value") else bytes(c) for c in launch.cells])))
    return got


def _experts(fmt="q4_K"):
    from ptxgen.testing import fakegpu

    return fakegpu.weights(fmt, M, K, experts=E)


def _dev(ptr, shape, dtype):
    return DeviceArray(ptr, tuple(shape), np.dtype(dtype))


X, IDS, OUT = 0x100000000, 0x200000000, 0x300000000
Y_BYTES = T * SLOTS * M * 4


def test_an_out_or_errors_overlapping_what_the_op_reads_is_refused(runs):
    """The kernels read x and ids while they write out (and moe_check_ids reads ids while it adds to errors): an
    out at x, inside x, over ids, or an errors array inside out / over ids was launched silently (a race: wrong
    rows); now a ValueError naming both arrays, nothing launched. Adjacent arrays are fine."""
    w = _experts()
    x, ids = _dev(X, (T, K), np.float32), _dev(IDS, (T, SLOTS), np.int32)
    cases = [(_dev(X, (T, SLOTS, M), np.float32), None, "out overlaps x"),
             (_dev(X + 64, (T, SLOTS, M), np.float32), None, "out overlaps x"),
             (_dev(IDS - 8, (T, SLOTS, M), np.float32), None, "out overlaps ids"),
             (_dev(OUT, (T, SLOTS, M), np.float32), _dev(OUT + 16, (1,), np.int32), "out overlaps errors"),
             (_dev(OUT, (T, SLOTS, M), np.float32), _dev(IDS + 4, (1,), np.int32), "errors overlaps ids")]
    for out, errors, match in cases:
        with pytest.raises(ValueError, match=rf"^mul_mat_id: {match} \(.* at 0x.*\): the op reads"):
            mul_mat_id(w, x, ids, out=out, errors=errors)
    assert runs == []
    out = _dev(X - Y_BYTES, (T, SLOTS, M), np.float32)  # ends where x starts
    errors = _dev(OUT, (1,), np.int32)
    assert mul_mat_id(w, x, ids, out=out, errors=errors) is out
    assert [n for n, _ in runs] == ["gemv_q4_k_f32_id", "moe_check_ids"]
    # per-slot x (T, slots, K): its whole extent counts
    xs = _dev(X, (T, SLOTS, K), np.float32)
    with pytest.raises(ValueError, match="out overlaps x"):
        mul_mat_id(w, xs, ids, out=_dev(X + T * K * 4, (T, SLOTS, M), np.float32))


def test_a_mul_mat_out_overlapping_x_is_refused(runs):
    """mul_mat's twin of the above: an out at or inside x (fp32 or fp16) is refused before any launch; adjacent
    arrays run."""
    from ptxgen.testing import fakegpu

    w = fakegpu.weights("q4_K", M, K)
    for dt, size in ((np.float32, 4), (np.float16, 2)):
        x = _dev(X, (T, K), dt)
        for at in (X, X + 16, X + T * K * size - 4):
            with pytest.raises(ValueError, match=r"^mul_mat: out overlaps x \(out at 0x.*\): the op reads x"):
                mul_mat(w, x, out=_dev(at, (T, M), np.float32))
        assert runs == []
        out = _dev(X + T * K * size, (T, M), np.float32)  # starts where x ends
        assert mul_mat(w, x, out=out) is out and runs
        runs.clear()


def test_the_activation_ops_refuse_an_out_over_their_input(runs):
    """quantize_q8_1, rotate_tq4_1s and convert_f16 read x while they write out, and dequantize reads the weights'
    bytes: an out over any of them is refused (not an in-place op); adjacent arrays run."""
    from ptxgen.runtime import dequantize, quantize_q8_1, rotate_tq4_1s
    from ptxgen.runtime.ops import convert_f16
    from ptxgen.testing import fakegpu

    x = _dev(X, (T, K), np.float32)
    cases = [(quantize_q8_1, "quantize_q8_1", _dev(X + 64, (T, K // 32 * 36), np.uint8), {}),
             (rotate_tq4_1s, "rotate_tq4_1s", _dev(X, (T, K), np.float32), {}),
             (convert_f16, "convert_f16", _dev(X + T * K * 4 - 16, (T, K), np.float16), {"flag": OUT})]
    for op, name, out, kw in cases:
        with pytest.raises(ValueError, match=rf"^{name}: out overlaps x \(out at 0x.*\): the op reads x"):
            op(x, out=out, **kw)
    w = fakegpu.weights("q4_K", M, K)
    with pytest.raises(ValueError, match=r"^dequantize: out overlaps w \("):
        dequantize(w, out=_dev(w.ptr + 16, (M, K), np.float16))
    assert runs == []
    rotate_tq4_1s(x, out=_dev(X + T * K * 4, (T, K), np.float32))  # starts where x ends
    assert runs


def test_a_numpy_out_is_refused(runs):
    """A NumPy out= was uploaded as a copy and the result written there: the caller's array came back untouched
    (mul_mat_id and mul_mat alike). Now a TypeError that says what to pass."""
    w = _experts()
    x, ids = _dev(X, (T, K), np.float32), _dev(IDS, (T, SLOTS), np.int32)
    with pytest.raises(TypeError, match=r"^mul_mat_id: out: a NumPy array .*pass a device array.*out=None"):
        mul_mat_id(w, x, ids, out=np.zeros((T, SLOTS, M), np.float32))
    from ptxgen.testing import fakegpu

    with pytest.raises(TypeError, match=r"^mul_mat: out: a NumPy array"):
        mul_mat(fakegpu.weights("q4_K", M, K), x, out=np.zeros((T, M), np.float32))
    assert runs == []


def test_a_workspace_that_is_not_one_is_refused(runs):
    """workspace= of another kind failed deep inside (AttributeError: 'int' object has no attribute 'fits')."""
    w = _experts()
    with pytest.raises(TypeError, match=r"^mul_mat_id: workspace: expected a Workspace .*got int"):
        mul_mat_id(w, _dev(X, (T, K), np.float32), _dev(IDS, (T, SLOTS), np.int32), workspace=3)
    assert runs == []


def test_errors_counts_this_calls_ids_behind_the_op(runs):
    """errors= (documented: device ids are not read back; the count is added on the device): moe_check_ids runs
    after the op on this call's ids, T·slots of them, E, and the caller's errors array."""
    w = _experts()
    errors = _dev(OUT + (1 << 20), (2,), np.uint32)
    mul_mat_id(w, _dev(X, (T, K), np.float32), _dev(IDS, (T, SLOTS), np.int32), out=_dev(OUT, (T, SLOTS, M), np.float32),
               errors=errors)
    (name, cells), = [r for r in runs if r[0] == "moe_check_ids"]
    assert cells == [IDS, T * SLOTS, E, errors.ptr] and runs[-1][0] == "moe_check_ids"


def test_device_ids_far_outside_the_experts_give_nan_rows_and_count():
    """The documented behaviour at the extremes of int32 (the op's tests use −1 and E): INT_MIN, INT_MAX, ±2^30
    give their slots NaN rows and leave the others exact (the pair GEMV in the emulator), and moe_check_ids counts
    each once."""
    from ptxgen.arch import get_arch
    from ptxgen.emu.harness import check_kernel, gemv_id_case
    from ptxgen.kernels import get_kernel

    ids = np.array([[I32.min, 1], [I32.max, 3], [2, -2**30], [0, 2**30]], np.int32)
    k = get_kernel("gemv_q8_0_f32_id").for_arch(get_arch("sm_90a"))
    out = gemv_id_case(k.ptx(), dict(k.meta, name="gemv_q8_0_f32_id"), np.random.default_rng(0), shape=(4, 21, 544),
                       ids=ids, x_per_slot=False)
    assert out.ok and np.isnan(out.got[[0, 1, 2, 3], [0, 0, 1, 1]]).all(), out.detail
    ptx = get_kernel("moe_check_ids").for_arch(get_arch("sm_90a")).ptx()
    out = check_kernel("moe_check_ids", ptx, ids=ids)
    assert out.ok and out.got[0] == 5 + 4, out.detail  # (the harness starts the count at 5)


def _gguf_with_dims(tmp_path, dims):
    """A GGUF file of one q4_K expert tensor (3, 4, 256) whose table then claims GGUF dims `dims` (innermost first)."""
    q = QuantTensor.from_numpy(np.random.default_rng(0).standard_normal((3, 4, 256)).astype(np.float32), "q4_K")
    path = tmp_path / "moe.gguf"
    write_gguf(path, {"blk.0.ffn_up_exps.weight": q})
    b = bytearray(path.read_bytes())
    at = b.index(b"blk.0.ffn_up_exps.weight") + len("blk.0.ffn_up_exps.weight")
    assert struct.unpack_from("<I", b, at)[0] == 3
    struct.pack_into("<3Q", b, at + 4, *dims)
    path.write_bytes(bytes(b))
    return path


@pytest.mark.parametrize("dims", [(256, 2**32, 2**32), (256, 2**33, 2**31), (256, 2**32 + 1, 2**32 - 1)])
def test_expert_dims_whose_product_wraps_int64_are_refused(tmp_path, dims):
    """E·M past 2^63 wrapped in NumPy's int64 (np.prod): to 0, and the reader handed out a 0-byte tensor of shape
    (2^32, 2^32, 256) that QuantTensor took; or to −1, a ValueError about −144 bytes without the file's name. Now
    the reader's one GGUFError naming the file, the tensor and the bytes it would need."""
    path = _gguf_with_dims(tmp_path, dims)
    with pytest.raises(GGUFError, match=rf"moe.gguf: tensor 'blk.0.ffn_up_exps.weight': q4_K {dims[2]}x{dims[1]}x256 "
                                        r"needs \d{20,} bytes"):
        QuantTensor.from_gguf(path, "blk.0.ffn_up_exps.weight")
    with pytest.raises(ValueError, match=r"0 bytes given, needs \d{20,}"):  # nor does the constructor wrap
        QuantTensor("q4_K", (dims[2], dims[1], 256), host=np.zeros(0, np.uint8))


def test_from_gguf_names_the_file_and_tensor_it_refuses(tmp_path):
    """A Q8_1 tensor (a type the reader reads, an activation format QuantTensor refuses) gave a bare ValueError
    that named neither the file nor the tensor; now a GGUFError (still a ValueError) naming both."""
    raw = formats.quantize("q8_1", np.ones((6, 256), np.float32))
    path = tmp_path / "q81.gguf"
    write_gguf(path, {"blk.0.ffn_up_exps.weight": (9, (3, 2, 256), raw)})
    with pytest.raises(GGUFError, match=r"q81.gguf: tensor 'blk.0.ffn_up_exps.weight': q8_1 is an activation format"):
        QuantTensor.from_gguf(path, "blk.0.ffn_up_exps.weight")

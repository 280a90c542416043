"""QuantTensor's constructors, Workspace and the plan functions for a careless caller: a T or slots that is not a
positive int, a host array where device bytes are expected, a shape whose byte count wraps, a workspace of another
kind each give one clear TypeError / ValueError naming the argument, before anything is planned, uploaded or
launched, instead of a plan for the wrong shape, a dangling device pointer or a traceback from inside. No GPU: plans
are made against ptxgen.testing.fakegpu (nothing launches; the prepared launches are recorded)."""
import numpy as np
import pytest

from ptxgen.runtime import QuantTensor, Workspace, mul_mat, ops, plans
from ptxgen.runtime.arrays import DeviceArray

M, K, T = 64, 512, 3
X, OUT = 0x100000000, 0x300000000


@pytest.fixture
def runs(monkeypatch):
    """The fake H200 (as tests/test_input_errors_moe.py's): the names of the kernels each call would launch."""
    from ptxgen.runtime.driver import PreparedLaunch
    from ptxgen.testing import fakegpu

    fakegpu.install(monkeypatch)
    got = []
    monkeypatch.setattr(PreparedLaunch, "run", lambda launch, s: got.append(launch.fn.name))
    return got


@pytest.fixture
def sizes_only(monkeypatch):
    """Workspace() and reserve() on the fake GPU: sizes only, nothing allocated (as tests/test_moe.py's)."""
    monkeypatch.setattr(plans.Workspace, "_alloc", lambda self, stream: None)
    monkeypatch.setattr(plans.driver, "synchronize", lambda: None)


def _dev(ptr, shape, dtype):
    return DeviceArray(ptr, tuple(shape), np.dtype(dtype))


def _weights(experts=0):
    from ptxgen.testing import fakegpu

    return fakegpu.weights("q4_K", M, K, experts=experts)


def _raw(shape=(4, K)):
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return QuantTensor.from_numpy(w, "q4_K").raw()


# --- the plan functions' T and slots --------------------------------------------------------------------------

def test_mul_mat_plan_takes_t_as_a_positive_int_below_2_to_the_31(runs):
    """T = True planned one token, and T = 1.0 returned T = 1's cached plan (the cache was read before T was
    checked); T = 2^40 was planned, its kernels' 32-bit T argument wrapped to 0. Now a TypeError for anything but
    an int (NumPy ints too), a ValueError past 2^31 - 1."""
    w = _weights()
    one = ops.mul_mat_plan(w, 1)
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match=rf"^mul_mat: T must be an int, got {bad!r}"):
            ops.mul_mat_plan(w, bad)
    for bad in (0, -1, 2**31, 2**40):
        with pytest.raises(ValueError, match=rf"^mul_mat: T must be a positive number of tokens, got {bad}"):
            ops.mul_mat_plan(w, bad)
    assert ops.mul_mat_plan(w, np.int64(1)) is one and ops.mul_mat_plan(w, np.int32(1)) is one
    with pytest.raises(ValueError, match="T must be a positive number of tokens, got 1099511627776"):
        mul_mat(w, _dev(X, (2**40, K), np.float32), out=_dev(OUT, (2**40, M), np.float32))
    assert runs == []


def test_mul_mat_id_plan_checks_its_arguments(runs):
    """mul_mat_id_plan checked none: T = 0, T = -1 or slots = 0 were planned, mode="fast" planned the exact
    kernels (so Workspace.reserve(..., mode="fast") said nothing), x_per_slot=2 went to the kernels as their 0 / 1
    flag, a 2-D w failed unpacking its shape and a non-QuantTensor on `._plans`. Now each is named."""
    w = _weights(experts=8)
    cases = [((w, 0, 2), {}, ValueError, "^mul_mat_id: T must be a positive number of tokens, got 0"),
             ((w, -1, 2), {}, ValueError, "^mul_mat_id: T must be a positive number of tokens, got -1"),
             ((w, 2, 0), {}, ValueError, "^mul_mat_id: slots must be positive, got 0"),
             ((w, 2**16, 2**16), {}, ValueError, r"^mul_mat_id: 65536 tokens of 65536 slots .* at most 2147483647"),
             ((w, 2.0, 2), {}, TypeError, r"^mul_mat_id: T must be an int, got 2\.0"),
             ((w, 2, True), {}, TypeError, "^mul_mat_id: slots must be an int, got True"),
             ((w, 2, 2), {"mode": "fast"}, ValueError, "^mul_mat_id: mode must be 'exact'"),
             ((w, 2, 2), {"x_per_slot": 2}, ValueError, r"^mul_mat_id: x_per_slot must be 0 .* or 1 .*, got 2"),
             ((_weights(), 2, 2), {}, ValueError, r"^mul_mat_id: w must hold experts, .*got \(64, 512\)"),
             ((np.zeros((8, M, K)), 2, 2), {}, TypeError, "^mul_mat_id: expected a QuantTensor for w, got ndarray")]
    for args, kw, error, match in cases:
        with pytest.raises(error, match=match):
            ops.mul_mat_id_plan(*args, **kw)
    assert not w._plans
    plan = ops.mul_mat_id_plan(w, 2, 2, x_per_slot=1)
    assert ops.mul_mat_id_plan(w, np.int64(2), np.int32(2), x_per_slot=True) is plan


def test_plan_x_dtypes_are_read_as_numpy_reads_them(runs):
    """x_dtype=np.float16 (the type, or x.dtype) was refused with "expected dtype float32 or float16, got <class
    'numpy.float16'>"; now any spelling NumPy reads as float16 / float32 plans that dtype, and others are refused."""
    w, we = _weights(), _weights(experts=8)
    assert ops.mul_mat_plan(w, 2, x_dtype=np.float16) is ops.mul_mat_plan(w, 2, x_dtype="float16")
    assert ops.mul_mat_id_plan(we, 2, 2, x_dtype=np.float16) is ops.mul_mat_id_plan(we, 2, 2, x_dtype="float16")
    assert ops.mul_mat_plan(w, 2, x_dtype=np.dtype(np.float32)) is ops.mul_mat_plan(w, 2)
    for op, args in ((ops.mul_mat_plan, (w, 2)), (ops.mul_mat_id_plan, (we, 2, 2))):
        for bad in (np.float64, "int8", "no such dtype"):
            with pytest.raises(TypeError, match="expected dtype float32 or float16"):
                op(*args, x_dtype=bad)


# --- workspaces -------------------------------------------------------------------------------------------------

def test_mul_mat_refuses_a_workspace_that_is_not_one(runs):
    """mul_mat's workspace= of another kind failed deep inside (AttributeError: 'int' object has no attribute
    'fits'; the Workspace class itself: "fits() missing 1 required positional argument"), as mul_mat_id's did."""
    w = _weights()
    for bad, name in ((3, "int"), (Workspace, "type")):
        with pytest.raises(TypeError, match=rf"^mul_mat: workspace: expected a Workspace .*got {name}"):
            mul_mat(w, _dev(X, (T, K), np.float32), out=_dev(OUT, (T, M), np.float32), workspace=bad)
    assert runs == []


def test_reserve_takes_an_int_or_a_nonempty_list_of_them(runs, sizes_only):
    """reserve(w, np.int64(16)) failed ("'numpy.int64' object is not iterable"), reserve(w, []) reserved nothing
    silently, reserve(w, "16") planned T = '1' and '6'; on expert weights T = 0, slots = -1 and mode="fast" were
    reserved for without a word. Now an int-like T is one T, and the others are named."""
    w, we = _weights(), _weights(experts=8)
    ws = Workspace()
    assert ws.reserve(w, np.int64(16)) is ws and ws.fits(ops.mul_mat_plan(w, 16))
    cases = [((w, []), {}, ValueError, "^Workspace.reserve: no token counts given"),
             ((w, "16"), {}, TypeError, "^Workspace.reserve: tokens must be an int or a list of ints.*got '16'"),
             ((w, None), {}, TypeError, "^Workspace.reserve: tokens must be an int or a list of ints.*got None"),
             ((w, [16, 0]), {}, ValueError, "T must be a positive number of tokens, got 0"),
             ((we, [4, 0]), {"slots": 2}, ValueError, "^mul_mat_id: T must be a positive number of tokens, got 0"),
             ((we, 4), {"slots": -1}, ValueError, "^mul_mat_id: slots must be positive, got -1"),
             ((we, 4), {"slots": 2, "mode": "fast"}, ValueError, "^mul_mat_id: mode must be 'exact'")]
    for args, kw, error, match in cases:
        with pytest.raises(error, match=match):
            ws.reserve(*args, **kw)


def test_workspace_sizes_are_byte_counts(sizes_only):
    """Workspace(w, 512) (reserve's arguments given to the constructor) failed comparing a QuantTensor with an int;
    now a TypeError that points at reserve."""
    with pytest.raises(TypeError, match=r"^Workspace: counters must be a number of bytes, got QuantTensor; .*"
                                        r"Workspace\(\)\.reserve\(w, T\)"):
        Workspace(QuantTensor.from_raw("q4_K", _raw(), (4, K)), 512)
    with pytest.raises(TypeError, match="^Workspace: scratch must be a number of bytes, got str"):
        Workspace(scratch="1M")
    assert Workspace(np.int64(1 << 17), scratch=1000).scratch_bytes == 1024


# --- QuantTensor ------------------------------------------------------------------------------------------------

class _ForeignGPU:
    """A uint8 device array (cupy-like: `.device.id`) on another GPU than ptxgen's."""

    def __init__(self, nbytes, device=3):
        self.device = type("Device", (), {"id": device})()
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (0x7F0000000000, False),
                                         "version": 3, "strides": None}


def test_from_device_refuses_host_bytes_and_another_gpus():
    """from_device(fmt, numpy_array, shape) uploaded the array into a buffer nothing kept (freed on return: the
    tensor pointed at freed memory); a cupy / torch array on cuda:3 was wrapped as if ptxgen's GPU could read it.
    Now a TypeError that points at from_raw, and the op's "is on cuda:N" ValueError; nothing touches a GPU."""
    raw = _raw((1, K))
    for host in (raw, raw.tobytes()):
        with pytest.raises(TypeError, match=r"^QuantTensor.from_device: array is a host .*QuantTensor.from_raw"):
            QuantTensor.from_device("q4_K", host, (1, K))
    with pytest.raises(ValueError, match=r"^QuantTensor.from_device: array is on cuda:3; ptxgen runs on cuda:0"):
        QuantTensor.from_device("q4_K", _ForeignGPU(raw.nbytes), (1, K))
    assert QuantTensor.from_device("q4_K", _ForeignGPU(raw.nbytes, device=0), (1, K)).on_device


def test_max_scale_must_be_a_number():
    """max_scale="2" was kept, and the first op failed comparing it with the fp16 bound ("'<=' not supported between
    instances of 'str' and 'float'"); now a TypeError when the tensor is made. Numbers (NumPy's too) are kept as
    floats."""
    with pytest.raises(TypeError, match=r"^q4_K \(1, 512\): max_scale must be a number"):
        QuantTensor.from_device("q4_K", _ForeignGPU(144 * 2, device=0), (1, K), max_scale="2")
    t = QuantTensor.from_device("q4_K", _ForeignGPU(144 * 2, device=0), (1, K), max_scale=np.float16(2))
    assert t.max_scale == 2.0 and type(t.max_scale) is float and t.fp16_weights


def test_from_raw_names_the_bytes_an_absurd_shape_needs():
    """from_raw counted rows with np.prod, which wraps int64: (2^32, 2^32, 256) became "shape (0, 256) needs 0
    bytes", (2^32 + 1, 2^32 - 1, 256) "needs -144 bytes", shapes the caller never gave. Now the shape given and the
    bytes it needs."""
    raw = _raw()
    for shape in ((2**32, 2**32, 256), (2**32 + 1, 2**32 - 1, 256), (2**63, 256)):
        with pytest.raises(ValueError, match=rf"^q4_K: shape \({shape[0]}, .*needs \d{{20,}} bytes"):
            QuantTensor.from_raw("q4_K", raw, shape)


def test_from_raw_takes_the_format_first():
    """from_raw(raw, "q4_K", shape) said "unknown format array([228, 29, ...])"; now it says the format comes first
    (as from_numpy's swapped arguments do)."""
    raw = _raw()
    for first in (raw, raw.tobytes()):
        with pytest.raises(TypeError, match=r"^from_raw\(fmt, raw, shape\): the format comes first"):
            QuantTensor.from_raw(first, "q4_K", (4, K))


def test_the_constructors_host_bytes_are_flat_uint8():
    """QuantTensor(fmt, shape, host=...) kept a 2-D uint8 array as it was: .raw() gave it back 2-D (1-D once on the
    device) and expert(e) sliced its rows as bytes (an empty expert: "0 bytes given"); bytes failed on `.nbytes`.
    Now host= is a uint8 array of the bytes, kept flat."""
    raw = _raw((3, 4, K))
    t = QuantTensor("q4_K", (3, 4, K), host=raw.reshape(12, -1))
    assert t.raw().shape == raw.shape and np.array_equal(t.raw(), raw)
    assert np.array_equal(t.expert(1).raw(), QuantTensor.from_raw("q4_K", raw, (3, 4, K)).expert(1).raw())
    for host, what in ((raw.tobytes(), "got bytes"), (raw.view(np.int8), "got dtype int8")):
        with pytest.raises(TypeError, match=rf"^q4_K \(3, 4, 512\): host= must be a NumPy uint8 array .*{what}"):
            QuantTensor("q4_K", (3, 4, K), host=host)


def test_expert_takes_an_int_index():
    """expert(1.5) returned expert 1 and expert("1") too (int() of the index); now a TypeError. NumPy ints index."""
    t = QuantTensor.from_raw("q4_K", _raw((3, 4, K)), (3, 4, K))
    for bad in (1.5, "1", True):
        with pytest.raises(TypeError, match=rf"^expert: e must be an int, got {bad!r}"):
            t.expert(bad)
    assert np.array_equal(t.expert(np.int64(2)).raw(), t.raw()[2 * t.nbytes // 3:])


def test_cat_of_one_tensor_not_in_a_list():
    """QuantTensor.cat(w) (not cat([w])) failed with "'QuantTensor' object is not iterable"; now it says to pass a
    list."""
    t = QuantTensor.from_raw("q4_K", _raw(), (4, K))
    with pytest.raises(TypeError, match=r"^QuantTensor.cat: takes a list of tensors, got one QuantTensor"):
        QuantTensor.cat(t)
    assert QuantTensor.cat([t]).shape == (4, K)

"""Ops: validated Python calls that pick kernels, check every input before launching, and launch them on the
caller's stream.

Every op takes `stream=` (driver.stream_handle: a raw handle, `__cuda_stream__`, a torch or cupy stream; default
the current stream of the input's library, else the per-thread default stream) and queues its work there without
waiting for it. Results follow the inputs: NumPy in → NumPy out (the call is synchronous); a torch tensor in → a
torch tensor out; another device array in → a DeviceArray out (exports `__cuda_array_interface__`), unless `out=`
is given.

`mul_mat` records what it launches for one (weights, T, mode, rotation, arch, knobs) once, as a launch plan
(`plans.Plan`, kept on the QuantTensor), and then issues those launches with argument buffers packed ahead of time,
against the stream's workspace (`plans.workspace_for`). Nothing it does reads device memory back to the host: an
activation past fp16 is recomputed on the device (`mul_mat_fixup_q4_k`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
from typing import NamedTuple

import numpy as np

from ptxgen import knobs
from ptxgen.formats import tq4_1s as T4
from ptxgen.specs import ROW_GROUP, ROW_GROUP_FORMATS, ActKernel, CodecKernel, GemvKernel, MmqSpec

from . import driver, kernels
from .arrays import DeviceArray, as_device_array, shape_of
from .driver import _TORCH
from .plans import Plan, PlanBuilder, Sym, SymArray, TMap, Workspace, eager_bound, workspace_for
from .tensors import QuantTensor


class _Rules:
    """The dispatch thresholds of the GPU in use (ptxgen/tuning: a JSON file per GPU, each rule with the measurement
    behind it), or the default GPU's on a machine without one (rule queries work there too):
    `RULES.mmq_min_tokens`. Read while a launch plan is made, never per call."""

    def __getattr__(self, name: str):
        from ptxgen import tuning

        try:
            sm = driver.current().sm
        except RuntimeError:  # no usable GPU: the default rules
            sm = None
        return getattr(tuning.for_sm(sm), name)


RULES = _Rules()


def _finish(o: DeviceArray | None, ret, host_in: bool, out_given: bool, stream: int):
    """NumPy in: wait for the stream and return NumPy (or the caller's `out`, whatever its kind); otherwise return
    `ret` (the caller's `out`, or the new device array) at once."""
    if host_in:
        if out_given:
            driver.stream_synchronize(stream)
            return ret
        return o.numpy()
    return ret


def _output(out, shape, dtype, what: str, x, stream: int, align: int = 4):
    """(the output as a DeviceArray, the object to return): `out` checked, or a new array of the input's kind (a
    torch tensor for a torch input, allocated by torch on the stream; else a DeviceArray in the stream's order)."""
    if out is not None:
        if isinstance(out, np.ndarray):  # (as_device_array would upload a copy: the op's result would never reach it)
            raise TypeError(f"{what}: a NumPy array (the op writes device memory, never this array); pass a device "
                            "array (DeviceArray.empty, torch, cupy), or leave out=None for a NumPy result")
        o = as_device_array(out, what, dtype, ndim=len(shape), align=align)
        if tuple(o.shape) != tuple(shape):
            raise ValueError(f"{what}: has shape {tuple(o.shape)}, expected {tuple(shape)}")
        if o is out:  # a DeviceArray: now written on `stream` (its .numpy() waits for that one)
            out.stream = stream
        return o, out
    if driver.is_torch(x):
        t = _torch_empty(shape, dtype, x, stream)
        return DeviceArray(t.data_ptr(), tuple(shape), np.dtype(dtype), t, stream=stream), t
    o = DeviceArray.empty(shape, dtype, stream)
    return o, o


def _spans_overlap(a: int, a_bytes: int, b: int, b_bytes: int) -> bool:
    """Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte."""
    return a < b + b_bytes and b < a + a_bytes


def _overlaps(a: DeviceArray, b: DeviceArray) -> bool:
    """Whether two device arrays share a byte (an output aliasing an input the kernels still read)."""
    return _spans_overlap(a.ptr, a.nbytes, b.ptr, b.nbytes)


def _refuse_overlaps(op: str, pairs) -> None:
    """A ValueError for the first (written, its name, read, its name) whose arrays share a byte: the kernels read the
    one while they write the other (a race, not an in-place op)."""
    for a, what, b, name in pairs:
        if _overlaps(a, b):
            raise ValueError(f"{op}: {what} overlaps {name} ({what} at {a.ptr:#x}, {a.nbytes} B; {name} at {b.ptr:#x}, "
                             f"{b.nbytes} B): the op reads {name} while it writes {what}; pass a separate {what} array")


_TORCH_DTYPES: dict = {}


def _torch_empty(shape, dtype, like, stream: int):
    import torch

    td = _TORCH_DTYPES.get(np.dtype(dtype))
    if td is None:
        td = _TORCH_DTYPES[np.dtype(dtype)] = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                                               np.dtype(np.uint8): torch.uint8}[np.dtype(dtype)]
    if stream == driver._torch_current_stream(like.device.index):
        return torch.empty(shape, dtype=td, device=like.device)
    with torch.cuda.stream(torch.cuda.ExternalStream(stream, device=like.device)):  # torch's allocator: that stream
        return torch.empty(shape, dtype=td, device=like.device)


MAX_COUNT = 2**31 - 1  # the kernels take T (and mul_mat_id's T·slots pairs) as 32-bit ints


def _count(v, op: str, what: str) -> int:
    """A plan's T or slots as an int, checked: an int or NumPy integer (not a bool, a float or a string), 1 to
    MAX_COUNT (a larger one wrapped in the kernels' 32-bit arguments: 2^40 tokens planned 0)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{op}: {what} must be an int, got {v!r} ({type(v).__name__})")
    if not 0 < v <= MAX_COUNT:
        raise ValueError(f"{op}: {what} must be a positive number of tokens, got {v!r}" if what == "T" else
                         f"{op}: {what} must be positive, got {v!r}")
    return int(v)


def _check_experts(w, mode: str) -> None:
    """mul_mat_id's (and its plan's) w and mode: a QuantTensor of experts (E, M, K), mode "exact"."""
    if not isinstance(w, QuantTensor):
        raise TypeError(f"mul_mat_id: expected a QuantTensor for w, got {type(w).__name__}")
    if len(w.shape) != 3:
        raise ValueError(f"mul_mat_id: w must hold experts, shape (E, M, K); got {w.shape} (mul_mat runs that)")
    if mode != "exact":
        raise ValueError(f"mul_mat_id: mode must be 'exact' (the only one built so far), got {mode!r}")


def _check_pairs(t: int, slots: int) -> None:
    """mul_mat_id's T·slots (token, slot) pairs fit the kernels' 32-bit counts."""
    if t * slots > MAX_COUNT:
        raise ValueError(f"mul_mat_id: {t} tokens of {slots} slots are {t * slots} (token, slot) pairs: at most "
                         f"{MAX_COUNT}")


def _dtype_name(x_dtype) -> str | None:
    """'float32' / 'float16' for a plan's x_dtype given as a name, np.float16 or a np.dtype; None for others."""
    if type(x_dtype) is str and x_dtype in ("float32", "float16"):  # (the ops' own calls: np.dtype costs ~2 µs)
        return x_dtype
    try:
        name = np.dtype(x_dtype).name
    except (TypeError, ValueError):
        return None
    return name if name in ("float32", "float16") else None


def _blocks_per_cta(fn, key: str, default: int = 8) -> int:
    return int(getattr(fn, "meta", {}).get(key, default))


def quantize_q8_1(x, *, out=None, arch: str | None = None, stream=None):
    """fp32 (..., K) with K a multiple of 32 → Q8_1 blocks (..., K/32·36) uint8, s = Σx (formats' "sum_x")."""
    shape = shape_of(x, "quantize_q8_1: x")
    if not shape or shape[-1] % 32:
        raise ValueError(f"quantize_q8_1: the last dimension must be a multiple of 32, got shape {shape}")
    s = driver.stream_handle(stream, x)
    xa = as_device_array(x, "quantize_q8_1: x", np.float32, stream=s)
    nblocks = int(np.prod(xa.shape, dtype=np.int64)) // 32
    o, ret = _output(out, (*xa.shape[:-1], xa.shape[-1] // 32 * 36), np.uint8, "quantize_q8_1: out", x, s, align=1)
    _refuse_overlaps("quantize_q8_1", [(o, "out", xa, "x")])
    if nblocks:
        fn = kernels.load(ActKernel("quantize_q8_1").name, arch)
        per = _blocks_per_cta(fn, "blocks_per_cta")
        fn.launch(((nblocks + per - 1) // per,), (xa, o, nblocks), stream=s)
    return _finish(o, ret, xa.host, out is not None, s)


def _rec_quantize_q8_1_mmq(pb: PlanBuilder, xa, flag, arch: str | None) -> SymArray:
    """Record quantize_q8_1_mmq: fp32 (T, K), K a multiple of 32 → the int8 MMQ's activation layout
    (ptxgen.formats.ggml.q8_1_mmq_layout): T·K int8, then (d, d·Σq) float32 per 32-block; the same q and d as
    quantize_q8_1. Sets flag[0] = 1 if a block's d overflows fp16 (amax > 65504·127, finite)."""
    nblocks = int(np.prod(xa.shape, dtype=np.int64)) // 32
    o = pb.scratch((nblocks * 40,), np.uint8)
    fn = kernels.load(ActKernel("quantize_q8_1", mmq=True).name, arch)
    per = _blocks_per_cta(fn, "blocks_per_cta")
    pb.launch(fn, ((nblocks + per - 1) // per,), (xa, o, nblocks, flag))
    return o


def dequantize(w: QuantTensor, *, out=None, arch: str | None = None, stream=None):
    """QuantTensor → fp16 (M, K) — (E, M, K) for experts — on the GPU (Q4_K, Q5_K, Q6_K, Q8_0: dequantize_<fmt>,
    one kernel over the format's codec); the result equals ptxgen.formats' float32 dequant rounded to fp16, bit for
    bit. Returns a DeviceArray (or fills `out`, whose library's stream is the default)."""
    if not isinstance(w, QuantTensor):
        raise TypeError(f"dequantize: expected a QuantTensor, got {type(w).__name__}")
    from ptxgen import codecs
    if w.fmt not in codecs.dequantizable():
        raise ValueError(f"dequantize: no GPU kernel for {w.fmt} yet (have: {', '.join(codecs.dequantizable())})")
    kernel = CodecKernel("dequantize", w.fmt).name
    m, k = w.rows, w.shape[-1]
    w.to_device()
    need = codecs.get(w.fmt).LOAD_ALIGN  # the kernel's widest load (Q6_K, Q8_0 blocks are 2-byte aligned)
    if w.ptr % need:
        raise ValueError(f"dequantize: {w.fmt} weights must start {need}-byte aligned, pointer is {w.ptr:#x}")
    s = driver.stream_handle(stream, out)
    fn = kernels.load(kernel, arch)
    group = int(fn.meta.get("blocks_per_group", 1))  # blocks a warp takes (Q8_0: 8 blocks of 32 weights)
    o, ret = _output(out, w.shape, np.float16, "dequantize: out", None, s, align=16 if group > 1 else 8)
    _refuse_overlaps("dequantize", [(o, "out", DeviceArray(w.ptr, (w.nbytes,), np.dtype(np.uint8)), "w")])
    grid, nblocks = _dequantize_grid(fn, w.fmt, m * k)
    fn.launch(grid, (w.buffer, o, nblocks), stream=s)
    return ret


def _dequantize_grid(fn, fmt: str, weights: int) -> tuple[tuple, int]:
    """dequantize_<fmt>'s launch over `weights` weights: (grid, blocks) — a CTA takes meta superblocks_per_cta
    blocks, or groups_per_cta groups of blocks_per_group (Q8_0's 8 blocks of 32)."""
    from ptxgen import formats

    group = int(fn.meta.get("blocks_per_group", 1))
    nblocks = weights // formats.get(fmt).block_size
    per = _blocks_per_cta(fn, "superblocks_per_cta" if group == 1 else "groups_per_cta")
    groups = -(-nblocks // group)
    return ((groups + per - 1) // per,), nblocks


def rotate_tq4_1s(x, *, out=None, arch: str | None = None, stream=None):
    """TQ4_1S activation rotation: forward RHT per 32-element block of fp32 (..., K) → fp32, bit-exact to
    ptxgen.formats.rht_forward."""
    shape = shape_of(x, "rotate_tq4_1s: x")
    if not shape or shape[-1] % 32:
        raise ValueError(f"rotate_tq4_1s: the last dimension must be a multiple of 32, got shape {shape}")
    s = driver.stream_handle(stream, x)
    xa = as_device_array(x, "rotate_tq4_1s: x", np.float32, stream=s)
    o, ret = _output(out, shape, np.float32, "rotate_tq4_1s: out", x, s)
    _refuse_overlaps("rotate_tq4_1s", [(o, "out", xa, "x")])
    nb = int(np.prod(shape, dtype=np.int64)) // 32
    if nb:
        fn = kernels.load(ActKernel("rotate").name, arch)
        fn.launch(((nb + 7) // 8,), (xa, o, nb), stream=s)
    return _finish(o, ret, xa.host, out is not None, s)


MOE_GROUPED_MIN_TOKENS = 2  # mul_mat_id's grouped routes from this T (one token's slots are distinct experts)


def mul_mat_id_kernels(fmt: str, t: int, slots: int, experts: int, k: int, m: int, arch: str | None = None,
                       sm: int | None = None, fp16_weights: bool = True) -> list[str]:
    """The kernels mul_mat_id launches, in order, for T = t tokens of `slots` experts each over `experts` experts of
    (M, K) = (m, k) on a GPU of compute capability `sm` (default: this process's GPU; give it and nothing needs a
    GPU: bench_moe's dry run and sanitize.py do; mul_mat_id_plan follows it) with `arch` pinned or not. A rotated
    codec's (TQ4_1S) route starts with its ROTATION kernel: x rotated once, which every kernel after reads.
    `fp16_weights` false (QuantTensor.fp16_weights): no grouped GEMM (it holds the weights in fp16)."""
    from ptxgen import codecs

    rotation = getattr(codecs.get(fmt), "ROTATION", None)
    return ([rotation] if rotation else []) + _moe_route(fmt, t, slots, experts, k, m, arch, sm, fp16_weights)


def _moe_route(fmt: str, t: int, slots: int, experts: int, k: int, m: int, arch: str | None, sm: int | None,
               fp16_weights: bool = True) -> list[str]:
    from ptxgen.kernels import mmq
    from ptxgen.kernels.moe_group import GATHER_ROWS

    p = t * slots
    if t < MOE_GROUPED_MIN_TOKENS or (p <= 65535 and p * m * k <= _per_format(RULES.moe_pair_max_weights, fmt)):
        return [CodecKernel("gemv_id", fmt).name]  # each pair reads its expert (one token: all distinct experts)
    if fp16_weights and _moe_gemm(fmt, t, slots, experts, k, m):
        if (rg := _moe_wgmma(fmt, k, arch, sm, m)) and slots <= GATHER_ROWS:  # (moe_gather: a token's slots in
            # one CTA)
            spec = _moe_wgmma_spec(p, experts, fmt, rg)
            group = ActKernel("group", gather=True, sums=spec.int_weights or mmq.min_lo_sums(spec))  # the grouping
            # and x gathered, one kernel (with the sub-block sums where the GEMM takes them)
            return [group.name, spec.name, CodecKernel("gemv_idg", fmt).name]
        return [ActKernel("group").name, MmqSpec(_moe_bn(p, experts), grouped=True, fmt=fmt).name,
                CodecKernel("gemv_idg", fmt).name]
    if t >= MOE_GROUPED_MIN_TOKENS and experts <= 65535:
        return [CodecKernel("gemv_idg", fmt).name]
    return [CodecKernel("gemv_id", fmt).name]


def _moe_bn(pairs: int, experts: int) -> int:
    return 64 if pairs >= 48 * experts else 32  # an expert's share of the pairs fills a 64-pair tile


def _moe_wgmma(fmt: str, k: int, arch: str | None, sm: int | None, m: int) -> int:
    """sm_90's grouped GEMM: the codec's register-A wgmma build (x gathered by moe_gather first), for the
    formats kernels/mmq.py GROUPED_WGMMA_FORMATS dispatches, where the raw rows are 16-byte multiples (the tensor
    map's stride) — or, with RULES.moe_row_groups, M rows of a codec with row-group builds (kernels/mmq.py
    ROW_GROUP_NOTE: Q6_K's) whole groups —, the sm_90a kernels are there and `arch` pins nothing else. Returns the
    build's row group (1: rows as they are), 0 where it does not apply."""
    from ptxgen.kernels.mmq import GROUPED_WGMMA_FORMATS

    rg = _ra_row_group(fmt, m, k)
    if rg > 1 and not RULES.moe_row_groups:
        rg = 0
    if arch not in (None, "sm_90a") or fmt not in GROUPED_WGMMA_FORMATS or not rg:
        return 0
    if sm is None:
        sm = driver.current().sm
    return rg if sm == 90 and "sm_90a" in kernels.available(_moe_wgmma_spec(1, 1, fmt, rg).name) else 0


def _moe_wgmma_spec(pairs: int, experts: int, fmt: str, row_group: int = 1) -> MmqSpec:
    """The register-A wgmma MoE GEMM's token tile by the pairs per expert (RULES.moe_wgmma_tile_pairs: "n<bn>" or
    "n<bn>_m<bm>" (a bm-row M tile) → the pairs per expert from which that tile runs; the largest tile reached, else
    n32): one tile an expert where it fits, its weights decoded once per tile. Q4_K's tiles between the formats'
    (n48; n96, not shipped: kernels/mmq.py GROUPED_WGMMA_Q4K_TILES) and its 256-row n48 / n80 (GROUPED_WIDE_TILES,
    shipped as "n48_m256" and "n80_m256") only where the rule names them; a format without the tile reached takes
    the largest reached tile it has, or where it has none, its next tile up. `row_group`: the builds reading rows
    in groups (_moe_wgmma)."""
    per = pairs / experts
    if per <= _per_format(RULES.moe_int_weights_max_pairs, fmt, 0):  # the integer-weight build (n16)
        return MmqSpec(16, "wgmma", a_regs=True, grouped=True, fmt=fmt, int_weights=True)

    def spec(tile):
        bn, _, bm = tile[1:].partition("_m")
        return MmqSpec(int(bn), "wgmma", a_regs=True, grouped=True, fmt=fmt, bm=int(bm or 128), row_group=row_group)

    def has(tile):
        return "sm_90a" in kernels.available(spec(tile).name)
    rule = RULES.moe_wgmma_tile_pairs
    reached = [n for n, v in rule.items() if per >= v and has(n)]
    if reached:  # the largest tile reached that the format has (Q4_K's n80_m256 at 64 pairs; Q6_K's n64 there)
        return spec(max(reached, key=lambda n: spec(n).bn))
    tiles = sorted({"n32"} | set(rule), key=lambda n: spec(n).bn)
    want = max((n for n, v in rule.items() if per >= v), key=lambda n: spec(n).bn, default="n32")
    built = [n for n in tiles[tiles.index(want):] if has(n)]
    return spec(built[0] if built else tiles[-1])  # (none reached that it has: n32, or its next tile up (n48's))


_MOE_FORMATS: list = []  # codecs.moe(), read once (a per-call scan of the codecs cost ~2 µs)


def _moe_format(fmt: str) -> None:
    if not _MOE_FORMATS:
        from ptxgen import codecs

        _MOE_FORMATS.append(codecs.moe())  # the codecs with lanes (the MoE GEMVs' FORMATS)
    if fmt not in _MOE_FORMATS[0]:
        raise ValueError(f"mul_mat_id: no kernel for {fmt} yet (have: {', '.join(_MOE_FORMATS[0])})")


def _moe_gemm(fmt: str, t: int, slots: int, experts: int, k: int, m: int = 0) -> bool:
    """Whether mul_mat_id takes the grouped GEMM: its format, enough pairs, and the sizes its 32-bit indices hold
    (experts ≤ moe_group.MAX_EXPERTS, token tiles < 2^16 per expert, pair · max(M, K) < 2^32)."""
    from ptxgen.kernels.mmq import GROUPED_FORMATS
    from ptxgen.kernels.moe_group import MAX_EXPERTS, TILE_SHIFT

    p = t * slots
    return (fmt in GROUPED_FORMATS and p >= _per_format(RULES.moe_gemm_min_pairs, fmt) and experts <= MAX_EXPERTS and k % 256 == 0
            and p // 32 < 1 << TILE_SHIFT and p * max(m, k) < 1 << 32)


def mul_mat_id(w: QuantTensor, x, ids, *, out=None, mode: str = "exact", arch: str | None = None, stream=None,
               workspace: Workspace | None = None, errors=None):
    """Mixture-of-experts matmul, ggml's MUL_MAT_ID: `w` a QuantTensor of E experts, shape (E, M, K) (as GGUF stores
    `ffn_{gate,up,down}_exps`); `ids` (T, slots) int32, the experts each token is routed to; `x` fp32 or fp16 (T,
    K), one row per token shared by its slots, or (T, slots, K), one row per slot (the down projection; fp16: the
    same kernels' _x16 twins where they read x, each value widened as it is loaded — the grouped mma.sync GEMM's
    routes widen x once first, convert_f32; TQ4_1S's rotation reads it as it is —: the bits of the same values as
    fp32). Returns fp32
    (T, slots, M): y[t, j] = x[t(, j)] @ w[ids[t, j]].T.

    Ids on the host are checked before anything runs (ValueError naming the first out-of-range one); ids already on
    the GPU are not read back (no synchronization): a slot whose id is outside [0, E) comes back as NaN, its row
    only, and with `errors` (a device int32 / uint32 array, ≥ 1 element) the call also adds the number of such ids
    to errors[0] on its stream (one more small kernel, moe_check_ids): zero it once, read it whenever the caller
    synchronizes anyway — after a step, a graph replay — and a nonzero count is the error. Streams, outputs (a
    device array sharing no byte with x, ids or errors), workspaces and NumPy-in / NumPy-out as mul_mat; a NumPy x
    or ids is uploaded first, and that upload waits for the stream (pass device arrays for an asynchronous call;
    NumPy operands are refused while the stream captures a CUDA graph). The stream is x's library's, or ids' where
    x is a NumPy array.

    Formats Q4_K, Q5_K, Q6_K, Q8_0, TQ4_1S (x rotated once first, rotate_tq4_1s; an fp16 x by rotate_tq4_1s_f16),
    mode "exact". `mul_mat_id_plan(w, T, slots).kernels` names the launches
    (thresholds: ptxgen/tuning): one token, or while pairs·M·K ≤ RULES.moe_pair_max_weights, gemv_<fmt>_f32_id over
    (M rows, pairs), each pair reading its expert (fp32, relative error ~1e-6). Else from
    RULES.moe_gemm_min_pairs[fmt] pairs: moe_group (the pairs grouped by expert on the device, a work list of
    (expert, token tile)), then the grouped tensor-core GEMM (fp16 activations, fp32 sums, as mul_mat's prefill:
    relative error ~4e-4), then gemv_<fmt>_f32_idg gated on the GEMM's overflow flag (it runs, exactly, only when an
    activation passed fp16's range). Below that gemv_<fmt>_f32_idg over (M rows, E experts), fp32: each expert's
    CTAs scan the ids for its pairs and read its weights once per 8 of them."""
    tt = _TORCH[0] if _TORCH else driver.torch_types()
    if (tt is not None and errors is None and type(w) is QuantTensor and isinstance(x, tt[0])
            and isinstance(ids, tt[0])):
        done = _mul_mat_id_torch(w, x, ids, out, mode, arch, stream, workspace, tt)  # the hot path, or None
        if done is not None:
            return done
    _check_experts(w, mode)
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"mul_mat_id: workspace: expected a Workspace (Workspace().reserve(w, T, slots=k)), got "
                        f"{type(workspace).__name__}")
    _moe_format(w.fmt)
    e, m, k = w.shape
    ishape, xshape = shape_of(ids, "mul_mat_id: ids"), shape_of(x, "mul_mat_id: x")
    if len(ishape) != 2 or 0 in ishape:
        raise ValueError(f"mul_mat_id: ids must have shape (T, slots) with T, slots ≥ 1, got {ishape}")
    t, slots = ishape
    if xshape not in ((t, k), (t, slots, k)):
        raise ValueError(f"mul_mat_id: x must have shape ({t}, {k}) or ({t}, {slots}, {k}) for ids {ishape} and w "
                         f"{w.shape}, got {xshape}")
    if isinstance(ids, np.ndarray):
        if ids.dtype != np.int32:
            raise TypeError(f"mul_mat_id: ids: expected dtype int32, got {ids.dtype}")
        bad = np.flatnonzero((ids < 0) | (ids >= e))
        if bad.size:
            i = np.unravel_index(bad[0], ishape)
            raise ValueError(f"mul_mat_id: ids[{i[0]}, {i[1]}] = {ids[i]} is not an expert of w (0 ≤ id < {e}); "
                             f"{bad.size} out of range")
    if isinstance(errors, np.ndarray):
        raise TypeError("mul_mat_id: errors must be a device array (the count is added on the GPU), got a NumPy array")
    host_x, host_ids = isinstance(x, np.ndarray), isinstance(ids, np.ndarray)
    s = driver.stream_handle(stream, ids if host_x and not host_ids else x)  # the device operand's library
    for a, what in ((x, "x"), (ids, "ids"), (out, "out")):
        driver.check_device(a, f"mul_mat_id: {what}")
    cid = driver.capture_id(s)
    hold = cid is not None  # buffers dropped while the op records into a capture are freed after it
    if hold:
        driver.hold_frees(1)
    try:
        if cid is not None and (w._device is None or host_x or host_ids):
            what = "w is not on the GPU yet" if w._device is None else "x or ids is a NumPy array (an upload waits)"
            raise RuntimeError(f"mul_mat_id: {what} and stream {s:#x} is capturing a CUDA graph: pass device arrays "
                               "(and call w.to_device(), or run the op once) before capturing")
        if errors is not None:
            driver.check_device(errors, "mul_mat_id: errors")
            ea = as_device_array(errors, "mul_mat_id: errors")
            if ea.dtype not in (np.int32, np.uint32) or ea.nbytes < 4:
                raise ValueError(f"mul_mat_id: errors must be an int32 or uint32 array of at least one element, got "
                                 f"{ea.dtype} of shape {tuple(ea.shape)}")
        xa = as_device_array(x, "mul_mat_id: x", None, align=16, stream=s)  # checked before w is uploaded
        if xa.dtype not in (np.float32, np.float16):
            raise TypeError(f"mul_mat_id: x: expected dtype float32 or float16, got {xa.dtype}")
        xdt = str(xa.dtype)
        ia = as_device_array(ids, "mul_mat_id: ids", np.int32, ndim=2, stream=s)
        o, ret = _output(out, (t, slots, m), np.float32, "mul_mat_id: out", x, s)
        pairs = [(o, "out", xa, "x"), (o, "out", ia, "ids")]  # what the kernels write, what they read meanwhile
        if errors is not None:  # (moe_check_ids reads ids and adds to errors[0], behind the op)
            pairs += [(o, "out", ea, "errors"), (ea, "errors", xa, "x"), (ea, "errors", ia, "ids")]
        _refuse_overlaps("mul_mat_id", pairs)
        x_per_slot = int(len(xshape) == 3)
        _check_pairs(t, slots)  # (the rest of mul_mat_id_plan's checks are made above, on the arrays)
        if cid is None:
            plan = _mul_mat_id_plan(w, t, slots, x_per_slot, mode, arch, False, xdt == "float16")
        else:  # the first captured call of this shape: its plan may load kernels the eager calls did not need
            with driver.relaxed_capture():
                plan = _mul_mat_id_plan(w, t, slots, x_per_slot, mode, arch, True, xdt == "float16")
        if cid is None and workspace is None:
            b = eager_bound(plan, s)
        else:
            b = plan.bound(workspace_for(plan, s, workspace, cid))
        b.run(xa.ptr, o.ptr, s, ia.ptr)
        if errors is not None:  # the count behind the op, on its stream (captured with it into a graph)
            with driver.relaxed_capture() if cid is not None else contextlib.nullcontext():
                check = kernels.load("moe_check_ids", arch)
            check.launch((-(-(t * slots) // 256),), (ia.ptr, t * slots, e, ea.ptr), stream=s)
        return _finish(o, ret, xa.host, out is not None, s)
    finally:
        if hold:
            driver.hold_frees(-1)


def _mul_mat_id_torch(w: QuantTensor, x, ids, out, mode: str, arch, stream, workspace, tt):
    """mul_mat_id's eager call on CUDA torch tensors whose plan is cached (the common case in a decode loop): x fp32
    or fp16 (T, K) or (T, slots, K), ids int32 (T, slots), out fp32 (T, slots, M) or None, all contiguous on ptxgen's GPU,
    the stream not capturing. Reads each tensor's attributes once and issues the plan's prepared launches; returns
    None where any of that does not hold — the general path then runs (and names what is wrong)."""
    import torch

    if len(w.shape) != 3 or w._device is None or workspace is not None:
        return None
    e, m, k = w.shape
    xs, ishape = x.shape, ids.shape
    if len(ishape) != 2 or ids.dtype is not torch.int32 or not ids.is_cuda or not ids.is_contiguous():
        return None
    t, slots = ishape
    x_per_slot = len(xs) == 3
    half = x.dtype is torch.float16
    if (not ((half or x.dtype is tt[1]) and x.is_cuda and x.is_contiguous()) or t == 0 or slots == 0
            or tuple(xs) != ((t, slots, k) if x_per_slot else (t, k))):
        return None
    x_ptr, dev, i_ptr = x.data_ptr(), x.get_device(), ids.data_ptr()
    if x_ptr & 15 or dev != driver.ORDINAL or ids.get_device() != dev:
        return None
    if out is not None:
        if not (isinstance(out, tt[0]) and out.dtype is tt[1] and out.is_cuda and out.is_contiguous()
                and tuple(out.shape) == (t, slots, m) and out.get_device() == dev):
            return None
        y_ptr, y_bytes = out.data_ptr(), t * slots * m * 4
        if (_spans_overlap(y_ptr, y_bytes, x_ptr, (t * slots if x_per_slot else t) * k * (2 if half else 4))
                or _spans_overlap(y_ptr, y_bytes, i_ptr, t * slots * 4)):
            return None  # out overlaps x or ids (the general path refuses it)
    s = stream if type(stream) is int and stream >= 0 else tt[2](dev) if stream is None else driver.stream_handle(stream)
    if not getattr(driver._TLS, "bound", False):
        driver.current()
    if driver.capture_status(s) != 0:  # capturing: the general path (its plan may load kernels)
        return None
    entry = w._plans.get((t, "mul_mat_id", slots, int(x_per_slot), mode, arch, False)
                         + (("float16",) if half else ()))  # mul_mat_id_plan's cache
    if entry is None or entry[0] != knobs._GENERATION[0]:
        return None
    if out is None:
        if stream is not None:
            return None
        out = x.new_empty((t, slots, m), dtype=tt[1])  # (float32 y for an fp16 x)
    eager_bound(entry[1], s).run(x_ptr, out.data_ptr(), s, i_ptr)
    return out


def mul_mat_id_plan(w: QuantTensor, t: int, slots: int, *, x_per_slot: int = 0, mode: str = "exact",
                    arch: str | None = None, graph: bool = False, x_dtype="float32") -> Plan:
    """The launch plan of mul_mat_id(w, x, ids) for T = t tokens of `slots` experts each (x (T, K), or with
    `x_per_slot` (T, slots, K)); cached on `w` as mul_mat_plan's. `.kernels` names its launches. `x_dtype`:
    float32, or float16 (the float32 plan's kernels with their _x16 twins where they read x, or x widened once by
    convert_f32 first where one has none: the same bits; TQ4_1S rotates it as it is, rotate_tq4_1s_f16, into the
    same fp32 its float32 plan reads)."""
    _check_experts(w, mode)
    t, slots = _count(t, "mul_mat_id", "T"), _count(slots, "mul_mat_id", "slots")
    _check_pairs(t, slots)
    if x_per_slot not in (0, 1):  # (False, True too) the kernels take it as a 0 / 1 flag
        raise ValueError(f"mul_mat_id: x_per_slot must be 0 (x (T, K)) or 1 (x (T, slots, K)), got {x_per_slot!r}")
    xdt = _dtype_name(x_dtype)
    if xdt is None:
        raise TypeError(f"mul_mat_id: x: expected dtype float32 or float16, got {x_dtype}")
    return _mul_mat_id_plan(w, t, slots, int(x_per_slot), mode, arch, bool(graph), xdt == "float16")


def _mul_mat_id_plan(w: QuantTensor, t: int, slots: int, x_per_slot: int, mode: str, arch, graph: bool,
                     x16: bool) -> Plan:
    """mul_mat_id_plan past its argument checks (mul_mat_id has made them on the arrays it was given)."""
    from ptxgen import codecs, formats

    key = (t, "mul_mat_id", slots, x_per_slot, mode, arch, graph) + (("float16",) if x16 else ())
    # (T first: _remember evicts by it)
    gen = knobs.generation()
    entry = w._plans.get(key)
    if entry is not None and entry[0] == gen:
        return entry[1]
    _moe_format(w.fmt)
    e, m, k = w.shape
    w.to_device()
    err = codecs.get(w.fmt).weights_error(mode, k, w.ptr)
    if err:
        raise ValueError(f"mul_mat_id: {err}")
    pb = PlanBuilder((t, slots, k) if x_per_slot else (t, k), np.float16 if x16 else np.float32, (t, slots, m),
                     np.float32, graph=bool(graph), ids_shape=(t, slots))
    expert_bytes = m * formats.get(w.fmt).row_bytes(k)
    p = t * slots
    route = mul_mat_id_kernels(w.fmt, t, slots, e, k, m, arch, fp16_weights=w.fp16_weights)
    xr = _rotate_x(pb, w.fmt, t * (slots if x_per_slot else 1), k, arch)  # TQ4_1S: every kernel below reads it
    if xr is not pb.x:  # (a rotated codec's rotation reads an fp16 x as it is: rotate_tq4_1s_f16)
        route = route[1:]
    if xr.dtype == np.float16:  # the kernels that read x take their _x16 twins where all of them have one (the pair /
        # grouped GEMVs on every arch, moe_gather(_sums)); else x widened once (the grouped mma.sync GEMM's routes:
        # sm_89, sm_120a, and sm_90 where the wgmma GEMM is not taken)
        twins = [n if n == ActKernel("group").name or "_wgmma_" in n else n + "_x16" for n in route]
        if all(kernels.build_for(n, "sm_90a" if n.startswith("moe_gather") else arch) is not None for n in twins):
            route = twins
        else:
            xr = pb.x = _rec_widen(pb, pb.x, arch, once=True)
    idg_args = (w.buffer, xr, pb.y, m, k, p, e, expert_bytes, pb.ids, slots, int(x_per_slot))
    fn = kernels.load(route[-1], arch)  # the GEMV: alone, or the exact recompute behind the grouped GEMM
    rows = -(-m // int(fn.meta["rows_per_cta"]))
    if len(route) > 1:
        _record_moe_gemm(pb, w, xr, t, slots, int(x_per_slot), expert_bytes, route[:-1], arch)
        # exact, only where the GEMM's activations overflowed (its gate: the workspace's flag, lowered by its last
        # CTA out, counted in `done`); few CTAs (each loops over experts): a closed gate costs their exits only
        from ptxgen.kernels.gemv_codec import GATED_EXPERT_CTAS

        if GATED_EXPERT_CTAS:  # (0: a timing diagnostic only — the gate's cost, wrong where x overflows fp16)
            pb.launch(fn, (rows, min(e, GATED_EXPERT_CTAS)), idg_args + (pb.flag, pb.done))
    elif route[0].endswith(("_idg", "_idg_x16")):
        pb.launch(fn, (rows, e), idg_args + (0, 0))
    else:
        if p > 65535:  # grid.y
            raise ValueError(f"mul_mat_id: {p} (token, slot) pairs of one token: at most 65535")
        pb.launch(fn, (rows, p), (w.buffer, xr, pb.y, m, k, 1, e, expert_bytes, pb.ids, slots, int(x_per_slot)))
    plan = pb.finish(f"mul_mat_id {w.fmt} {e}x{m}x{k} T={t} slots={slots}")
    _remember(w, key, (gen, plan))
    return plan


def _record_moe_gemm(pb, w, x, t: int, slots: int, x_per_slot: int, expert_bytes: int, route: list, arch) -> None:
    """The grouped GEMM over its work list (persistent CTAs, at most one per item) behind the grouping: on sm_90
    moe_gather (the grouping, and x in fp16, grouped order, the wgmma build's K order, in one kernel) and the
    register-A wgmma build reading both by tensor map; elsewhere moe_group and the mma.sync build on fp32 x. The GEMM
    or the conversion raises the workspace's zero-kept flag where an activation overflowed fp16 (the gated GEMV
    behind them reads it and lowers it)."""
    from ptxgen.kernels.mmq import BM
    from ptxgen.kernels import moe_group

    e, m, k = w.shape
    p = t * slots
    wg = route[0] != ActKernel("group").name  # (route: the grouping kernel, the GEMM)
    gemm = kernels.load(route[-1], "sm_90a" if wg else arch)
    bn = int(gemm.meta["bn"])
    order, offsets = pb.scratch((p,), np.uint32), pb.scratch((e + 1,), np.uint32)
    work = pb.scratch((1 + p // bn + e,), np.uint32)
    grouping = (pb.ids, p, e, bn, order, offsets, work, pb.y, m)
    items = -(-m // int(gemm.meta.get("bm", BM))) * (p // bn + e)
    sms = driver.current().sm_count
    ctas = max(1, min(items, gemm.resident_per_sm() * sms))
    if not wg:
        pb.launch(kernels.load(route[0], arch), (1,), grouping)
        pb.launch(gemm, (ctas,), (w.buffer, x, pb.y, pb.flag, m, k, slots, x_per_slot, expert_bytes, order, offsets,
                                  work, pb.queue))
        return
    x16 = pb.scratch((p, k), np.float16)
    iw = "int_weights" in gemm.meta or "min_lo_sums" in gemm.meta  # x's sub-block sums too (Σx hi / lo): the
    # integer-weight build's, or the −m_lo MMA's (mmq.RA_MIN_LO_MMA)
    xs = (pb.scratch((p, k // 16), np.float16),) if iw else ()
    # a CTA an SM at most (1024 threads each), each ~a thousand (pair, group of 8 values) stores a round, at most
    # GATHER_ROWS pairs, rounded to whole rows of x (a token's slots where they share x: moe_gather converts a row
    # once for all its pairs)
    k8, unit, most = k // 8, 1 if x_per_slot else slots, moe_group.GATHER_ROWS
    assert unit <= most, (slots, most)  # (_moe_route takes another route past it)
    units, gathers = p // unit, max(1, min(sms, -(-p * k8 // 1024)))
    rows = unit * min(-(-units // gathers), most // unit)
    pb.launch(kernels.load(route[0], "sm_90a"), (-(-p // rows),),
              grouping + (x, x16, pb.flag, k8, slots, x_per_slot, rows) + xs)
    tw = _raw_rows_map(w, e * m, gemm)  # every expert's raw rows
    tx = _tensor_map(x16.ptr, "f16", p, k, bn, 64, "128B", int(gemm.meta.get("x_box_chunks", 0)))
    ts = ((_tensor_map(xs[0].ptr, "f16", p, k // 16, bn, 8, "none", int(gemm.meta.get("s_box_chunks", 0))),) if iw
          else ())
    pb.launch(gemm, (ctas,), (tw, tx, *ts, pb.y, m, k, order, offsets, work, pb.queue), pdl=True)


def _remember(w: QuantTensor, key, entry) -> None:
    """Cache `entry` on `w` under `key` (T first); past PLANS_PER_WEIGHT the T > 8 entries are dropped (prefill
    lengths vary per request; the decode ones a generation loop reuses stay)."""
    if len(w._plans) >= PLANS_PER_WEIGHT:
        for old in [k for k in w._plans if k[0] > GEMV_TOKENS[-1]]:
            del w._plans[old]
    w._plans[key] = entry


GEMV_TOKENS = (1, 2, 4, 8)
PLANS_PER_WEIGHT = 256  # plans a QuantTensor keeps (one per T, mode, ...); past it the T > 8 ones are dropped


FUSED_MAX_TOKENS = 4  # gemv_tq4_1s_t8 has no fused-rotation variant (it would spill on sm_89)


def _gemv_kernel(w: QuantTensor, t: int, fused: bool, tma: bool = False) -> str:
    """The lane GEMV of `w`'s format for up to the next of GEMV_TOKENS tokens: gemv_<fmt>[_tma]_t<n>[_fused]."""
    tk = next(k for k in GEMV_TOKENS if k >= t)
    return GemvKernel("gemv", w.fmt, tk, tma=tma, fused=fused).name


MMQ_TILES = (32, 64, 128)
WGMMA_TILES = (32, 64, 128, 256)
WGMMA_RA_TILES = (64, 128, 192, 256)  # the register-A wgmma MMQ (n256: loaded through the driver's whole-program JIT)


PREPARED_TILE = 256
# the format every GEMM path has a build of (MmqSpec's default: Q4_K): mmq_path probes those builds, and the
# prepared GEMM, which reads fp16 fragments whatever the codec, has that build only
PATH_FMT = MmqSpec(PREPARED_TILE).fmt


def mmq_prepared(t: int) -> bool:
    """Whether the register-A path runs the prepared build for T tokens (PTXGEN_MMQ_PRE: auto = from
    RULES.mmq_pre_min_tokens, on = wherever it runs the n256 tile, off = never) and its kernels are emitted."""
    v = knobs.mmq_pre()
    want = v == "on" and _rega_tile(t) == PREPARED_TILE or v == "auto" and t >= RULES.mmq_pre_min_tokens
    return want and "sm_90a" in kernels.available(MmqSpec(PREPARED_TILE, "wgmma", a_regs=True, prepared=True).name)


def _rega_tile(t: int) -> int:
    """The register-A MMQ's token tile for T tokens (the rule above)."""
    return 64 if t <= RULES.wgmma_ra_n64_max_tokens else 128 if t <= RULES.wgmma_ra_n128_max_tokens else 256


Q8_TILES = (16, 32, 64)


def q8_path(t: int, fp16_path: str) -> str | None:
    """The Q8_1 MMQ variant mode="fast" runs for T tokens, or None for the fp16 GEMM: the fused n16 kernel
    (quantizes inside, one launch) for T <= 16, quantize_q8_1_mmq + the n32 GEMM above (the fused n32 holds
    one CTA per SM only)."""
    if t > RULES.q8_max_tokens[fp16_path]:
        return None
    return "q8" if t <= 16 else "q8_pre"


def mmq_path(arch: str | None = None, t: int | None = None) -> str:
    """"wgmma" on an sm_90 device when the sm_90a kernels are there (and `arch` does not pin another target) —
    "wgmma_ra" (A from registers: n64 up to RULES.wgmma_ra_n64_max_tokens, n128 up to wgmma_ra_n128_max_tokens,
    n256 above) instead for `t` ≥ RULES.wgmma_ra_min_tokens (knob PTXGEN_MMQ_REGA), "wgmma_pre" (its prepared
    build) where mmq_prepared says so — else "mma.sync"."""
    from .driver import current

    if arch not in (None, "sm_90a"):
        return "mma.sync"
    if current().sm == 90 and "sm_90a" in kernels.available(MmqSpec(WGMMA_TILES[-1], "wgmma").name):
        rega = knobs.mmq_rega()
        if (t is not None and rega != "off" and (t >= RULES.wgmma_ra_min_tokens or rega == "on")
                and "sm_90a" in kernels.available(MmqSpec(_rega_tile(t), "wgmma", a_regs=True).name)):
            return "wgmma_pre" if mmq_prepared(t) else "wgmma_ra"
        return "wgmma"
    if arch == "sm_90a":
        raise kernels.KernelNotFound("the wgmma MMQ (arch='sm_90a') runs on sm_90 devices only")
    return "mma.sync"


def mma_sync_x16(m: int, k: int, t: int, arch: str | None = None) -> bool:
    """Whether the mma.sync MMQ runs on fp16 x converted first (PTXGEN_MMQ_X16: auto = from RULES.mmq_x16_min_work
    multiply-adds, on = always, off = never: x converted inside the GEMM)."""
    v = knobs.mmq_x16()
    if v == "off" or (v == "auto" and m * k * t < RULES.mmq_x16_min_work):
        return False
    return kernels.build_for(MmqSpec.for_path("mma.sync_x16", 128).name, arch) is not None


class MmqPlan(NamedTuple):
    """How an MMQ launch covers its tiles: token tiles, 128 x bn tiles, the whole ones (the mma.sync builds run
    those first, then the rest split; the others split every tile alike: whole = 0), K splits and K-steps per
    split, work items, CTAs (or clusters) launched, whether the split tiles use the spread fixup, the build's
    cluster size and the launch grid (CTAs: cluster x ctas)."""
    tiles_n: int
    tiles: int
    whole: int
    splits: int
    per: int
    items: int
    ctas: int
    spread: bool
    cluster: int = 1

    @property
    def grid(self) -> tuple[int]:
        return (self.cluster * self.ctas,)


def mmq_plan(fn, m: int, k: int, t: int, bn: int, sync: bool, sms: int) -> MmqPlan:
    """The plan of an MMQ build `fn` (loaded) with token tile bn on a GPU of `sms` SMs: one round of items over
    the resident CTAs (the occupancy calculator's count on this GPU: an sm_89 has less shared memory per SM than
    the H200; a second, partial round doubles the time). `sync` (the fp16 mma.sync builds): whole tiles, then the
    tail's tiles split so that the last round is balanced (splitk_plan_tail, PTXGEN_MMQ_TAIL_SPLIT), and the
    spread fixup where mmq_spread_fixup allows it; otherwise splitk_plan_one_round over the items (clusters: an
    item is cl M-tiles, the slots resident clusters)."""
    tiles_n = (t + bn - 1) // bn
    tiles = tiles_n * ((m + 127) // 128)
    cl = fn.meta.get("cluster", (1, 1, 1))[0]
    slots = fn.resident_per_sm() * sms if cl == 1 else fn.resident_clusters(cl)
    steps = k // 64
    if sync:
        whole, splits, per = splitk_plan_tail(tiles, steps, slots) if knobs.mmq_tail_split() != "off" else (
            _one_round_as_tail(tiles, steps, slots))
        items = whole + (tiles - whole) * splits
        ctas = min(items, slots)
        return MmqPlan(tiles_n, tiles, whole, splits, per, items, ctas, mmq_spread_fixup(tiles - whole, splits, ctas),
                       cl)
    groups = tiles_n * -(-((m + 127) // 128) // cl)
    splits, per = splitk_plan_one_round(groups, steps, slots)
    items = groups * splits
    return MmqPlan(tiles_n, tiles, 0, splits, per, items, min(items, slots), False, cl)


class StreamPlan(NamedTuple):
    """The stream-K register-A GEMM's launch (kernels/mmq.py STREAM_NOTE): tiles, token tiles, L (K-steps a CTA) and
    CTAs (ceil(tiles·K/64 / L))."""
    tiles: int
    tiles_n: int
    per: int
    ctas: int


def stream_plan(fn, m: int, k: int, t: int, bn: int, sms: int, uniform: MmqPlan) -> StreamPlan | None:
    """The stream-K plan of the register-A GEMM `fn` (its uniform plan `uniform`), where RULES.mmq_stream_k_min_gain
    (0: never) allows it: every resident CTA takes L = ceil(U / slots) of the tiles' U K-steps laid end to end, against
    the uniform plan's rounds of whole items. In K-steps, with split_item_cost a segment and split_fixup_cost a split:
    uniform = ceil(items / slots)·(per + item) + fixup if split; stream = L + (ceil(L / K-steps) + 1)·item + fixup.
    Stream-K where it is at least the rule's fraction faster (14336x4096 at T = 512: 224 n256 tiles on 132 CTAs,
    uniform 132, stream 117)."""
    gain = RULES.mmq_stream_k_min_gain
    if not gain:
        return None
    slots = fn.resident_per_sm() * sms
    ksteps = k // 64
    units = uniform.tiles * ksteps
    per = -(-units // slots)
    item, fix = RULES.split_item_cost, RULES.split_fixup_cost
    before = -(-uniform.items // slots) * (uniform.per + item) + (fix if uniform.splits > 1 else 0)
    after = per + (-(-per // ksteps) + 1) * item + (fix if per % ksteps else 0)  # (chunks of whole tiles: no split)
    if after > (1 - gain) * before:
        return None
    return StreamPlan(uniform.tiles, uniform.tiles_n, per, -(-units // per))


def _rega_fill_tile(fmt: str, m: int, k: int, t: int, bn: int, sms: int) -> int:
    """The register-A MMQ's token tile on shapes of few 128 x bn tiles: the T rule's `bn` (_rega_tile), halved (to
    n64 at least) while its plan splits K more than RULES.wgmma_ra_max_splits ways, or into fewer than
    RULES.wgmma_ra_min_split_steps K-steps a split — a smaller tile covers the GPU with fewer, longer splits."""
    while bn > 64:
        plan = mmq_plan(kernels.load(MmqSpec(bn, "wgmma", a_regs=True, fmt=fmt).name, "sm_90a"), m, k, t, bn, False, sms)
        if plan.splits == 1 or (plan.splits <= RULES.wgmma_ra_max_splits and plan.per >= RULES.wgmma_ra_min_split_steps):
            return bn
        bn //= 2
    return bn


def _cluster_split(base: MmqSpec, plan: MmqPlan, bn: int) -> bool:
    """Whether the register-A GEMM of `plan` runs its cluster split-K build (kernels/mmq.py CSPLIT_NOTE): a split plan
    of at most RULES.mmq_cluster_split_max_splits splits (0: never) that divide the tile's bn/8 fragments, where the
    build exists and one cluster a tile is resident at once (the partials stay in shared memory to the end)."""
    cap = RULES.mmq_cluster_split_max_splits
    if not 1 < plan.splits <= cap or (bn // 8) % plan.splits:
        return False
    name = dataclasses.replace(base, csplit=True).name
    return kernels.build_for(name, "sm_90a") == "sm_90a" and _cluster_split_fits(kernels.load(name, "sm_90a"), plan)


def _cluster_split_fits(fn, plan: MmqPlan) -> bool:
    """Whether the cluster split build `fn` can launch `plan`: one round of items, at most 8 splits (a portable
    cluster), and a resident cluster for each tile (its partials stay in shared memory to the end)."""
    return (plan.splits <= 8 and plan.items == plan.tiles * plan.splits
            and fn.resident_clusters(plan.splits) >= plan.tiles)


def mmq_convert_in_gemm(t: int, splits: int) -> bool:
    """Whether the register-A MMQ converts fp32 x itself (PTXGEN_MMQ_CX: auto = from RULES.mmq_cx_min_tokens tokens with
    at most RULES.mmq_cx_max_splits K splits, on = always, off = never: convert_f16_perm first). Its converters walk x's
    K chunks in order, so a split that starts mid-K waits for the chunks before its own."""
    v = knobs.mmq_cx()
    return v == "on" or (v == "auto" and t >= RULES.mmq_cx_min_tokens and splits <= RULES.mmq_cx_max_splits)


MMQ_PATHS = ("mma.sync", "mma.sync_x16", "wgmma", "wgmma_ra", "wgmma_ra_cx", "wgmma_ra_x16", "wgmma_ra_mc", "wgmma_ra_sk",
             "wgmma_ra_cs",
             "wgmma_pre", "wgmma_pre_cx", "wgmma_pre_x16", "wgmma_f16a", "wgmma_f16a_cx", "wgmma_f16a_x16", "q8",
             "q8_pre")


def _f16a(fmt: str) -> bool:
    """Whether the prepared route runs the f16a GEMM for `fmt` (rule mmq_f16a, per format: the weights dequantized to
    fp16 rows by dequantize_<fmt>, then a GEMM with both wgmma operands in shared memory; kernels/mmq.py F16A_NOTE)
    instead of the register-A one on prepared fragments: where the rule says so, the format has a GPU dequantize
    and the build exists."""
    from ptxgen import codecs

    return (bool(_per_format(RULES.mmq_f16a, fmt, False)) and fmt in codecs.dequantizable()
            and "sm_90a" in kernels.available(MmqSpec(PREPARED_TILE, "wgmma", prepared=True).name))


def _rec_mmq(pb: PlanBuilder, w: QuantTensor, xa, o, t: int, flag, arch: str | None = None, bn: int | None = None,
             path: str | None = None):
    """Record the MMQ of w's format (Q4_K on every path; another codec on its register-A, prepared or fp16 mma.sync
    builds), with convert_f16 / quantize_q8_1_mmq first where its path reads their output; split-K
    partials are summed inside the kernel. The overflow flag is raised, never read here (see mul_mat_fixup_q4_k).
    `bn` overrides the token tile, `path` the kernel: "mma.sync" (fp16, x converted inside the GEMM),
    "mma.sync_x16" (convert_f16 launch, then the fp16 GEMM on fp16 x), "wgmma" (fp16, sm_90a), "wgmma_ra"
    (fp16, sm_90a, A from registers and x in its K order; token tile n64 to RULES.wgmma_ra_n64_max_tokens, n128 to
    RULES.wgmma_ra_n128_max_tokens, n256 above, unless `bn` says otherwise; it converts x itself,
    mmq_q4_k_wgmma_ra_n*_cx, where mmq_convert_in_gemm says so), "wgmma_ra_cx" / "wgmma_ra_x16" (the register-A
    build converting x inside the launch / after convert_f16_perm, whatever the rule says), "wgmma_pre"
    (dequantize_q4_k_frags writes the register-A fragments as fp16 first, then the register-A GEMM loads them
    instead of dequantizing: mmq_q4_k_wgmma_pre_n256, converting x itself where mmq_convert_in_gemm says so) with
    "wgmma_pre_cx" / "wgmma_pre_x16" to pin that choice, "wgmma_ra_mc" (the register-A build in clusters of 2 CTAs
    that multicast each activation tile to both; not dispatched by mul_mat yet), "q8" (int8 mma.sync, x quantized
    to Q8_1 inside the GEMM) or "q8_pre" (quantize_q8_1_mmq launch, then the int8 GEMM); benchmarks sweep them.
    An fp16 x (mul_mat's, a float16 activation) goes to the wgmma builds as it is (by a tensor map over the caller's
    x where the build reads x in its natural K order, meta x_order: _gemm_x16; else permute_f16 into the register-A
    K order; never the converting builds), and so does it to the fp16 mma.sync build
    (as given where it copies x by cp.async, sm_89's; copy_f16 where by TMA, sm_120a's): nothing can leave fp16,
    returns None, no fixup to record behind; the other paths (the int8 ones) read it widened to fp32 (convert_f32).
    Returns the fp32 x the fixup behind the GEMM reads."""
    m, k = w.shape
    if path is None:
        path = mmq_path(arch, t)
        if path == "mma.sync" and (mma_sync_x16(m, k, t, arch) or xa.dtype == np.float16 and _x16_shipped(w, t, arch)):
            path = "mma.sync_x16"  # (an fp16 x: the build that reads it as it is, whatever the size — the bits of the
            # converting build on the same values)
    if path not in MMQ_PATHS:
        raise ValueError(f"mmq_launch: path must be one of {', '.join(MMQ_PATHS)}, got {path!r}")
    if path == "wgmma_pre" and _f16a(w.fmt):  # (on either x dtype: an fp16 x gets the bits of its fp32 widening)
        path = "wgmma_f16a"
    # the wgmma GEMMs read an fp16 x as it is where they take x's natural K order (_gemm_x16: a tensor map over the
    # call's x, encoded per call), else permuted into scratch (permute_f16)
    half_in = xa.dtype == np.float16 and (path.startswith(("wgmma_ra", "wgmma_pre", "wgmma_f16a"))
                                          and not path.endswith("_cx")
                                          or path == "wgmma")
    # (the fp16 mma.sync build reads an fp16 x as it is where it copies x by cp.async, sm_89's, and copied into
    # scratch (copy_f16) by TMA, sm_120a's: decided with its build below)
    if xa.dtype == np.float16 and not half_in and path != "mma.sync_x16":
        xa = _rec_widen(pb, xa, arch)
    forced_bn = bn is not None
    if path.startswith(("wgmma_pre", "wgmma_f16a")):
        bn = bn or PREPARED_TILE
        if bn != PREPARED_TILE:
            raise ValueError(f"mmq_launch: the prepared build has token tile {PREPARED_TILE} only, not {bn}")
    elif path.startswith("wgmma_ra"):
        bn = bn or _rega_tile(t)
    else:
        tiles_opt = {"wgmma": WGMMA_TILES, "mma.sync": MMQ_TILES, "mma.sync_x16": MMQ_TILES}.get(path, Q8_TILES)
        bn = bn or next((n for n in tiles_opt if t <= n), tiles_opt[-1])
    sync = path in ("mma.sync", "mma.sync_x16")
    sms = driver.current().sm_count
    plan, planned = None, None
    # the builds decode the weights' own codec, except the prepared one (fp16 fragments written by the codec's
    # dequantize_<fmt>_frags: one build, named for Q4_K, serves every codec); a path without a build for the codec
    # is refused (_mmq_build)
    fmt = PATH_FMT if path.startswith(("wgmma_pre", "wgmma_f16a")) else w.fmt
    if path == "wgmma_ra" and not forced_bn:
        bn = _rega_fill_tile(fmt, m, k, t, bn, sms)
    rg = _ra_row_group(fmt, m, k) if path.startswith("wgmma_ra") else 1  # (kernels/mmq.py ROW_GROUP_NOTE)
    if not rg:  # (a forced path: _mmq_ra_ok routes no such call here)
        raise ValueError(f"mmq_launch: {w.fmt} rows of K = {k} are not 16-byte multiples and M = {m} is not whole "
                         f"groups of {ROW_GROUP} rows: no register-A GEMM reads them")
    if path in ("wgmma_ra", "wgmma_pre", "wgmma_f16a"):  # the rule needs the plan's K splits; n192 has no
        # converting build
        base = MmqSpec(bn, "wgmma", a_regs=path != "wgmma_f16a", prepared=path != "wgmma_ra", fmt=fmt, row_group=rg)
        planned = kernels.load(_mmq_build(base.name, "sm_90a", w.fmt, path), "sm_90a")
        plan = mmq_plan(planned, m, k, t, bn, False, sms)
        cx_name = dataclasses.replace(base, convert=True).name  # its converters' units: convert_steps K-steps,
        # never past K
        cx_rule = ("sm_90a" in kernels.available(cx_name) and mmq_convert_in_gemm(t, plan.splits)
                   and k % (64 * int(kernels.load(cx_name, "sm_90a").meta["convert_steps"])) == 0)
        # (an fp16 x, or an fp16 copy of x already written — TQ4_1S's rotate_tq4_1s_f16, PlanBuilder.f16_made —:
        # the _x16 build where fp32 would convert inside, as its bits)
        cx = cx_rule and not half_in and id(xa) not in pb.f16_made
        sk = dataclasses.replace(base, stream=True).name
        if path == "wgmma_ra" and not cx_rule and kernels.build_for(sk, "sm_90a") == "sm_90a" and \
                stream_plan(planned, m, k, t, bn, sms, plan) is not None:
            path = "wgmma_ra_sk"  # stream-K: the tiles fill the CTAs' rounds unevenly
        elif path == "wgmma_ra" and not cx and _cluster_split(base, plan, bn):
            path = "wgmma_ra_cs"  # the split tiles summed through distributed shared memory
        else:
            path = f"{path}_cx" if cx else f"{path}_x16"
    spec = dataclasses.replace(MmqSpec.for_path(path, bn), row_group=rg)
    wg = path.startswith("wgmma")
    name = _mmq_build(dataclasses.replace(spec, fmt=fmt).name, "sm_90a" if wg else arch, w.fmt, path)
    fn = kernels.load(name, "sm_90a" if wg else arch)
    if spec.convert and k % (64 * int(fn.meta["convert_steps"])):  # (a forced path: the rule above checks it)
        raise ValueError(f"mmq_launch: {name} converts x in units of {64 * int(fn.meta['convert_steps'])} columns; "
                         f"K = {k} is not a multiple")
    if plan is None or (fn is not planned and fn.resident_per_sm() != planned.resident_per_sm()):
        plan = mmq_plan(fn, m, k, t, bn, sync, sms)  # the converting build: same plan unless its shared memory
        # changes how many CTAs an SM holds
    tiles, whole, splits = plan.tiles, plan.whole, plan.splits
    if spec.stream:  # chunks of L K-steps (StreamPlan), two partial planes a CTA
        sp = stream_plan(fn, m, k, t, bn, sms, plan) or StreamPlan(tiles, plan.tiles_n, -(-tiles * (k // 64) // (
            fn.resident_per_sm() * sms)), 0)  # (a forced path: stream-K whatever the rule says)
        grid = (-(-tiles * (k // 64) // sp.per),)
        part = pb.scratch((2 * grid[0] * 128 * bn,), np.float32)
        cnt = pb.counters(4 * tiles)
        x16 = _gemm_x16(pb, fn, xa, flag, path)
        tx = _tensor_map(x16.ptr, "f16", t, k, bn, 64, "128B")
        pb.launch(fn, grid, (_raw_rows_map(w, m, fn), tx, o, m, k, t, sp.per, pb.queue, sp.tiles_n, 0, part, cnt),
                  pdl=bool(fn.meta.get("pdl")))
        return None if half_in else xa
    tma = sync and fn.meta.get("copy") == "tma"  # the fp16 mma.sync build's TMA ring (sm_120a): weights by tensor map
    if path == "mma.sync_x16" and xa.dtype == np.float16:
        half_in = True  # (by TMA: copied into scratch below)
    # split-K: partials in scratch, summed in z order by the last CTA of each tile (no reduction launch): in
    # fragment order (the wgmma builds, and the fp16 mma.sync ones for their split tail) or in y's layout (Q8_1)
    if splits == 1:
        part = o
    elif sync:  # fragment order, only the split tiles
        part = pb.scratch((splits * (tiles - whole) * 128 * bn,), np.float32)
    else:
        part = pb.scratch((splits * tiles * 128 * bn,) if wg else (splits, t, m), np.float32)
    cnt = pb.counters(4 * tiles)
    cl, grid = plan.cluster, plan.grid
    tail = (m, k, t, plan.per, pb.queue, plan.tiles_n, splits, part, cnt) + ((whole, int(plan.spread)) if sync else ())
    if path.startswith("wgmma_pre"):  # A fragments first (ptxgen.layouts.q4k_rega_fragments), 16 KB per block
        tiles_m, ksteps = -(-m // 128), k // 64
        frags = pb.scratch((tiles_m * ksteps * 64, 256), np.uint8)
        pb.launch(kernels.load(CodecKernel("frags", w.fmt).name, "sm_90a"), (ksteps, tiles_m), (w.buffer, frags, m, k))
        tw = _tensor_map(frags.ptr, "u8", tiles_m * ksteps * 64, 256, 64, 256, "none")
    elif path.startswith("wgmma_f16a"):  # the weights as fp16 rows (dequantize_<fmt>), 128-row x 64-column boxes
        deq = kernels.load(CodecKernel("dequantize", w.fmt).name, "sm_90a")
        w16 = pb.scratch((m, k), np.float16)
        dgrid, nblocks = _dequantize_grid(deq, w.fmt, m * k)  # (as dequantize launches it; the GEMM's grid is
        # the plan's)
        pb.launch(deq, dgrid, (w.buffer, w16, nblocks))
        tw = _tensor_map(w16.ptr, "f16", m, k, 128, 64, "128B")
    else:  # the raw rows (Q4_K's 16-byte columns, or another codec's box)
        tw = _raw_rows_map(w, m, fn) if wg or tma else None
    if path in ("wgmma_ra_cx", "wgmma_pre_cx", "wgmma_f16a_cx"):  # x converted by the GEMM's idle producer warps
        # (mmq.CX_NOTE)
        x16 = pb.scratch((t, k), np.float16)
        nready = plan.tiles_n * -(-(k // 64) // int(fn.meta["convert_steps"]))
        ready = pb.ready(4 * nready)
        tx = _tensor_map(x16.ptr, "f16", t, k, bn, 64, "128B")
        pb.launch(fn, grid, (tw, tx, o, *tail, xa, x16, ready, flag), pdl=bool(fn.meta.get("pdl")))  # pre: behind the frags
    elif wg:
        x16 = _gemm_x16(pb, fn, xa, flag, path)
        tx = _tensor_map(x16.ptr, "f16", t, k, bn // cl, 64, "128B")  # clusters: each rank loads bn / cl rows
        cluster = (cl, 1, 1) if cl > 1 else None
        if spec.csplit:  # one cluster a tile, its CTAs the tile's splits (kernels/mmq.py CSPLIT_NOTE)
            if not _cluster_split_fits(fn, plan):
                raise ValueError(f"mmq_launch: {name} needs one cluster of its {splits} splits a tile resident at "
                                 f"once (at most 8 splits): {tiles} tiles, {fn.resident_clusters(splits)} clusters fit")
            grid, cluster = (tiles * splits,), (splits, 1, 1)
        pb.launch(fn, grid, (tw, tx, o, *tail), pdl=bool(fn.meta.get("pdl")),  # set-up overlaps convert_f16's tail
                  cluster=cluster)
    else:  # mma.sync fp16 and q8 read fp32 x; q8_pre reads quantize_q8_1_mmq's layout, mma.sync_x16 fp16 x
        xin = (_rec_quantize_q8_1_mmq(pb, xa, flag, arch) if path == "q8_pre" else
               xa if half_in and (not tma or _call_x(xa)) else
               _rec_convert_f16(pb, xa, flag, arch) if path == "mma.sync_x16" else xa)
        if tma and path == "mma.sync_x16":  # sm_120a: fp16 x by TMA too, box 64 x bn, 128B-swizzled (the call's
            # fp16 x itself: a map encoded per call, plans.Bound)
            xin = _tensor_map(xin.ptr, "f16", t, k, bn, 64, "128B")
        pb.launch(fn, grid, (tw if tma else w.buffer, xin, o, flag, *tail))
    return None if half_in else xa


def _x16_shipped(w: QuantTensor, t: int, arch) -> bool:
    """Whether the fp16 mma.sync GEMM's build on fp16 x (mma.sync_x16) for w's format and t's tile ships for `arch`
    (one built on demand from the DSL, NOT_SHIPPED, is not taken by default)."""
    from ptxgen.kernels import NOT_SHIPPED

    bn = next((n for n in MMQ_TILES if t <= n), MMQ_TILES[-1])
    name = dataclasses.replace(MmqSpec.for_path("mma.sync_x16", bn), fmt=w.fmt).name
    return name not in NOT_SHIPPED and kernels.build_for(name, arch) is not None


def _gemm_x16(pb: PlanBuilder, fn, xa, flag, path: str):
    """The fp16 x a TMA-fed wgmma GEMM reads: the call's own fp16 x where the build takes x in its natural K order
    (meta x_order; the plain wgmma build, the register-A ones of mmq.RA_NATURAL_FORMATS) — its tensor map is encoded
    per call over the caller's buffer (plans.Bound), no launch —, else x converted (fp32) or permuted / copied
    (fp16) into scratch by one launch."""
    order = "natural" if path == "wgmma" else fn.meta.get("x_order", "rega")
    if xa.dtype == np.float16 and order == "natural" and _call_x(xa):
        return xa
    return _rec_convert_f16(pb, xa, flag, "sm_90a", order)


def _call_x(xa) -> bool:
    """Whether `xa` is (a row offset into) the call's own x, whose address each call patches (a tensor map over it
    is encoded per call: plans.Bound.x_maps)."""
    return isinstance(xa.ptr, Sym) and xa.ptr.base == "x"


def _rec_fixup(pb: PlanBuilder, w: QuantTensor, xa, o, t: int, arch: str | None) -> None:
    """Record mul_mat_fixup_<fmt> behind a GEMM on fp16 / Q8_1 activations: it reads the workspace's flag on the
    device and recomputes the tokens that left the format (at once a no-op when the flag is clear)."""
    m, k = w.shape
    fn = kernels.load(CodecKernel("fixup", w.fmt).name, arch)
    grid = max(1, min(t, RULES.fixup_ctas_per_sm * driver.current().sm_count))
    pb.launch(fn, (grid,), (pb.flag, pb.done, w.buffer, xa, o, m, k, t), pdl=bool(fn.meta.get("pdl")))


def _mmq_build(name: str, arch, fmt: str, path: str) -> str:
    """`name`, if a GEMM build of that name exists for `arch` (None: the device's); else a ValueError naming the
    weights' codec and the path (the wgmma-from-shared-memory and int8 Q8_1 builds decode Q4_K only)."""
    if kernels.build_for(name, arch) is None:
        raise ValueError(f"mmq_launch: {fmt} has no {path!r} GEMM build ({name} is not built for "
                         f"{arch or 'this GPU'}); its weights run the builds their codec has (ptxgen.codecs ROUTES)")
    return name


def mmq_launch(w: QuantTensor, xa, o, t: int, flag, arch: str | None = None, bn: int | None = None,
               path: str | None = None, stream=None) -> None:
    """Launch the Q4_K MMQ alone (`_rec_mmq`: the path and tile rules, or `path` / `bn` forced) on `stream` (default:
    the per-thread stream), raising `flag` (a device buffer of 4 bytes, never read here) if an activation leaves its
    format; no fixup behind it. For benchmarks and tests that sweep the lowerings; `mul_mat` is the op. A codec whose
    GEMMs read a rotated activation (TQ4_1S) is refused: x here goes to the GEMM as given."""
    from ptxgen import codecs

    rotation = getattr(codecs.get(w.fmt), "ROTATION", None)
    if rotation:
        raise ValueError(f"mmq_launch: {w.fmt} weights need the activation rotated first ({rotation}); mul_mat does that")
    s = driver.stream_handle(stream)
    xa = as_device_array(xa, "mmq_launch: x", np.float32, ndim=2, align=16, stream=s)
    o = as_device_array(o, "mmq_launch: out", np.float32, ndim=2)
    m, k = w.shape
    pb = PlanBuilder((t, k), np.float32, (t, m), np.float32)
    _rec_mmq(pb, w, pb.x, pb.y, t, flag.ptr if hasattr(flag, "ptr") else int(flag), arch, bn, path)
    run_plan(pb.finish(f"mmq_launch {path or 'auto'}"), xa.ptr, o.ptr, s)


def run_plan(plan: Plan, x_ptr: int, y_ptr: int, stream=None, workspace: Workspace | None = None) -> Workspace:
    """Issue a plan's launches on `stream` (driver.stream_handle) against its workspace (plans.workspace_for);
    returns the workspace."""
    s = driver.stream_handle(stream)
    ws = workspace_for(plan, s, workspace)
    plan.bound(ws).run(x_ptr, y_ptr, s)
    return ws


def recorded_plan(w: QuantTensor, t: int, record, note: str = "") -> Plan:
    """A plan made by `record(pb)` (a PlanBuilder whose x is (T, K) fp32 and y (T, M) fp32) — for benchmarks and
    probes that time one lowering; mul_mat_plan is what mul_mat runs."""
    m, k = w.shape
    pb = PlanBuilder((t, k), np.float32, (t, m), np.float32)
    record(pb)
    return pb.finish(note)


def workspace_state(stream=None) -> np.ndarray:
    """The zero-kept state words of the eager workspace of `stream` (after its work): flag, done, queue (2 words),
    then the counters — tests check that every kernel left them at zero."""
    from .plans import STATE_HEAD, _EAGER, _stream_key

    s = driver.stream_handle(stream)
    ws = _EAGER.get(_stream_key(s))
    if ws is None:
        return np.zeros(0, np.uint32)
    return ws.state.download(np.uint32, ((STATE_HEAD + ws.counter_bytes + ws.ready_bytes) // 4,), stream=s)


_TMAPS: dict = {}


def _raw_rows_tma_ok(fmt: str, k: int) -> bool:
    """Whether rows of K weights of `fmt` can be a tensor map's rows (_raw_rows_map): their bytes a multiple of 16
    (Q6_K's 210-byte blocks: K a multiple of 2048)."""
    from ptxgen.formats import get as fmt_of

    return fmt_of(fmt).row_bytes(k) % 16 == 0


def _ra_row_group(fmt: str, m: int, k: int) -> int:
    """The register-A GEMM's row group for m x k weights of `fmt` (kernels/mmq.py ROW_GROUP_NOTE): 1 where a row is a
    tensor map's row (_raw_rows_tma_ok), ROW_GROUP where the codec has those builds and M is whole groups of rows,
    0 where neither holds (no register-A GEMM)."""
    if _raw_rows_tma_ok(fmt, k):
        return 1
    return ROW_GROUP if fmt in ROW_GROUP_FORMATS and m % ROW_GROUP == 0 else 0


def _raw_rows_map(w: QuantTensor, rows: int, fn):
    """The tensor map of `rows` raw weight rows of `w` (an expert tensor's E·M) for a TMA-fed GEMM `fn`: boxes of its
    meta's tma_box (columns, rows): 16 bytes (Q4_K's columns) x 128 rows unless the build says otherwise, the columns
    u32 words where its tma_dtype says so."""
    from ptxgen.formats import get as fmt_of

    cols, box_rows = (int(v) for v in fn.meta.get("tma_box", (16, 128)))
    dtype = fn.meta.get("tma_dtype", "u8")  # (a box wider than 256 bytes counts u32 words)
    row_bytes, es = fmt_of(w.fmt).row_bytes(w.shape[-1]), 4 if dtype == "u32" else 1
    g = int(fn.meta.get("row_group", 1))  # groups of g rows, each a multiple of 16 bytes (kernels/mmq.py ROW_GROUP_NOTE)
    if row_bytes % es:
        raise ValueError(f"{fn.name}: {w.fmt} rows of {row_bytes} bytes are not whole {dtype} words")
    if rows % g:
        raise ValueError(f"{fn.name}: reads rows in groups of {g}; {rows} rows are not whole groups")
    return _tensor_map(w.ptr, dtype, rows // g, g * row_bytes // es, box_rows, cols, "none")


def _tensor_map(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, chunks=0):
    """cuTensorMapEncodeTiled, memoised (the same buffer and tiling reuse one encoded map); over a symbolic buffer
    (scratch, while recording a plan) a TMap, encoded when the plan is bound. `chunks`: tma.tensor_map_2d's."""
    if isinstance(ptr, Sym):
        return TMap(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, chunks)
    from .tma import tensor_map_2d

    key = (ptr, dtype, rows, cols, box_rows, box_cols, swizzle, None, chunks)
    tm = _TMAPS.get(key)
    if tm is None:
        if len(_TMAPS) > 256:
            _TMAPS.clear()
        tm = _TMAPS[key] = tensor_map_2d(ptr, dtype, rows, cols, box_rows, box_cols, swizzle, chunks=chunks)
    return tm


def _rec_convert_f16(pb: PlanBuilder, xa, flag, arch: str | None, k_order: str = "natural", out=None) -> SymArray:
    """Record fp32 (..., K) → fp16 (round to nearest even) into `out` (default: scratch); sets flag[0] = 1 if any
    value became inf or NaN in fp16. `k_order="rega"`: each 64-column chunk in the register-A wgmma MMQ's order
    (ptxgen.layouts.q4k_rega_k_order; convert_f16_perm, K a multiple of 64)."""
    n = int(np.prod(xa.shape, dtype=np.int64))
    if n % 8:
        raise ValueError(f"convert_f16: the element count must be a multiple of 8, got {n}")
    if k_order == "rega" and xa.shape[-1] % 64:
        raise ValueError(f"convert_f16: k_order='rega' needs K a multiple of 64, got {xa.shape[-1]}")
    made = pb.f16_made.pop(id(xa), None)  # written with xa by the kernel that made it (rotate_tq4_1s_f16), its
    # flag raised into the same pb.flag
    if made is not None and made[0] is xa and made[1] == k_order and out is None:
        return made[2]
    if xa.dtype == np.float16:  # fp16 x already: permuted (permute_f16) or copied (copy_f16) into scratch, where
        # the GEMM's tensor map points
        if out is not None:
            raise ValueError("convert_f16: an fp16 x is only permuted or copied, into scratch")
        o = pb.scratch(xa.shape, np.float16)
        kind = "copy_f16" if k_order == "natural" else "permute_f16"
        pb.launch(kernels.load(ActKernel(kind).name, arch), ((n // 8 + 255) // 256,), (xa, o, n // 8))
        return o
    o = pb.scratch(xa.shape, np.float16) if out is None else out
    fn = kernels.load(ActKernel("convert_f16", rega=k_order != "natural").name, arch)
    pb.launch(fn, ((n // 8 + 255) // 256,), (xa, o, flag, n // 8))
    return o


def _fp32_x(pb: PlanBuilder, arch: str | None) -> SymArray:
    """The call's x as fp32 for the kernels that read fp32: an fp16 x widened once (convert_f32, into scratch kept
    for the whole call), which the rest of the call then reads; an fp32 x as it is."""
    if pb.x.dtype == np.float16:
        pb.x = _rec_widen(pb, pb.x, arch, once=True)
    return pb.x


def _x_reader(pb: PlanBuilder, spec, arch: str | None, k: int, t0: int, x16_ok: bool = True):
    """(kernel, the address of x's token t0) for the kernel of `spec` (a GemvKernel or CodecKernel, whose x16 twin
    reads fp16 x): an fp16 x as given where that twin is built here (and `x16_ok`), else the spec's kernel on x
    widened once (_fp32_x)."""
    twin = dataclasses.replace(spec, x16=True).name
    if x16_ok and pb.x.dtype == np.float16 and kernels.build_for(twin, arch) is not None:
        return kernels.load(twin, arch), pb.x.ptr + 2 * k * t0
    return kernels.load(spec.name, arch), _fp32_x(pb, arch).ptr + 4 * k * t0


def _rec_widen(pb: PlanBuilder, xa, arch: str | None, *, once: bool = False) -> SymArray:
    """fp16 x → fp32 into scratch (convert_f32, exact), for the kernels that read fp32 x; fp32 x as it is."""
    if xa.dtype != np.float16:
        return xa
    n = int(np.prod(xa.shape, dtype=np.int64))
    o = pb.scratch(xa.shape, np.float32, once=once)
    pb.launch(kernels.load(ActKernel("convert_f32").name, arch), ((n // 8 + 255) // 256,), (xa, o, n // 8))
    return o


def convert_f16(x, flag, *, out=None, arch: str | None = None, k_order: str = "natural", stream=None):
    """fp32 (..., K) → fp16 on the device (round to nearest even); sets flag[0] = 1 if any value became inf or NaN in
    fp16 (`flag`: a device buffer of at least 4 bytes). `k_order="rega"`: the register-A MMQ's K order."""
    if k_order not in ("natural", "rega"):
        raise ValueError(f"convert_f16: k_order must be 'natural' or 'rega', got {k_order!r}")
    s = driver.stream_handle(stream, x)
    xa = as_device_array(x, "convert_f16: x", np.float32, stream=s)
    pb = PlanBuilder(xa.shape, np.float32, xa.shape, np.float16)
    _rec_convert_f16(pb, pb.x, flag.ptr if hasattr(flag, "ptr") else int(flag), arch, k_order, out=pb.y)
    o, ret = _output(out, xa.shape, np.float16, "convert_f16: out", x, s)
    _refuse_overlaps("convert_f16", [(o, "out", xa, "x")])
    run_plan(pb.finish("convert_f16"), xa.ptr, o.ptr, s)
    return ret


def mmq_spread_fixup(split_tiles: int, splits: int, grid: int) -> bool:
    """Whether the fp16 mma.sync MMQ's split tiles sum their partials spread over their CTAs (each split sums its
    own rows: one round trip of 1/splits of the tile each) rather than in the tile's last CTA (all of it): with at
    most SPREAD_MAX_SPLITS splits, and only when every split item can hold a CTA at once — there every split
    waits for all the others, which must not wait for a CTA that is itself waiting."""
    from ptxgen.kernels.mmq import SPREAD_MAX_SPLITS

    return 1 < splits <= min(SPREAD_MAX_SPLITS, RULES.mmq_spread_max_splits) and split_tiles * splits <= grid


def _list_schedule(lengths: list[int], slots: int) -> int:
    """Makespan of items claimed in order by `slots` workers, each taking the next item when it is free."""
    if len(lengths) <= slots:
        return max(lengths, default=0)
    free = [0] * slots
    for n in lengths:
        heapq.heapreplace(free, free[0] + n)
    return max(free)


def splitk_plan_tail(tiles: int, steps: int, slots: int) -> tuple[int, int, int]:
    """(whole, splits, K-steps per split) for the fp16 mma.sync MMQ's persistent queue: the first `whole` tiles
    run over all of K (whole rounds of the `slots` resident CTAs), the remaining tiles — the last, partial round,
    or every tile when there are fewer than slots — are split into `splits` K ranges (the last one shorter), so
    that the CTAs idle in a partial round take split items instead. The split is the one with the least modelled
    makespan (items in queue order on `slots` workers, costs RULES.split_item_cost / split_fixup_cost); none
    unless it saves a K-step."""
    return _splitk_plan_tail(tiles, steps, slots, RULES.split_item_cost, RULES.split_fixup_cost)


@functools.lru_cache(maxsize=512)
def _splitk_plan_tail(tiles: int, steps: int, slots: int, item_cost: int, fixup_cost: int) -> tuple[int, int, int]:
    tail = tiles % slots if tiles > slots else tiles
    whole = tiles - tail
    if tail == 0:
        return tiles, 1, steps
    best, plan = steps + item_cost, (tiles, 1, steps)  # the tail's time unsplit: one more whole round
    c = item_cost + fixup_cost
    for per in range(max(2, -(-steps // 16)), steps):
        splits = -(-steps // per)
        last = steps - (splits - 1) * per
        span = _list_schedule([per + c] * (tail * (splits - 1)) + [last + c] * tail, slots)
        if span + 1 <= best:
            best, plan = span, (whole, splits, per)
    return plan


def _one_round_as_tail(tiles: int, steps: int, slots: int) -> tuple[int, int, int]:
    """splitk_plan_one_round in splitk_plan_tail's terms (PTXGEN_MMQ_TAIL_SPLIT=0): every tile split alike when
    they fit one round, none otherwise."""
    splits, per = splitk_plan_one_round(tiles, steps, slots)
    return (tiles, 1, steps) if splits == 1 else (0, splits, per)


def splitk_plan_one_round(tiles: int, steps: int, slots: int) -> tuple[int, int]:
    """(splits, K-steps per split) for a persistent kernel with `slots` resident CTAs: as many splits as fit
    in one round (tiles x splits <= slots), each with at least 8 K-steps; no split when the tiles alone
    fill the slots."""
    splits = max(1, min(slots // tiles, steps // 8))
    per = -(-steps // splits)
    return -(-steps // per), per


def mul_mat(w: QuantTensor, x, *, out=None, rotation: str = "auto", mode: str = "exact",
            arch: str | None = None, stream=None, workspace: Workspace | None = None):
    """y = x @ W.T for x (T, K) fp32 or fp16 → (T, M) fp32, like torch.nn.functional.linear(x, W), queued on
    `stream`. An fp16 x (a torch model's activations) goes to the prefill GEMMs as it is (no conversion pass, no
    overflow fixup: it reads half the bytes) and is widened to fp32 once for the kernels that read fp32; either way
    the result has the bits of the call on the same values in fp32.

    `stream`: see the module's docstring (default: torch's current stream for a torch x, cupy's for a cupy x,
    else the per-thread default stream); the call returns without waiting for the GPU unless x is a NumPy array.
    `out`: a (T, M) fp32 device array to write (torch, cupy, DeviceArray). `workspace`: a plans.Workspace to use
    instead of the stream's own (for instance one reserved before capturing a CUDA graph).

    The kernels: `mul_mat_plan(w, T).kernels` lists them; docs/design.md "Dispatch" tabulates the rule (generated
    from ptxgen/tuning). In short: T ≤ 8 the decode GEMVs (exact Q4_K at 1-4 tokens in one launch when called
    eagerly); Q4_K T = 9-64 the tensor-core skinny GEMMs (fp16 activations); larger T the prefill GEMM (wgmma +
    TMA on sm_90, mma.sync elsewhere or with arch="sm_89"); Q5_K to 32 tokens the few-token tensor-core builds
    as Q4_K's, Q6_K and Q8_0 to 16 (fp16 activations from 9); Q5_K, Q6_K and Q8_0 from 33 / 17 / 17 tokens (9 where
    the few-token builds have no build for the target) and TQ4_1S from 17 (x rotated once; 9 on sm_89) the
    GEMM decoding their blocks in its K loop (register-A wgmma on sm_90, mma.sync elsewhere), above
    RULES.codec_ra_mmq_max_tokens the prepared GEMM on fp16 fragments, below their decode GEMVs.
    Behind every GEMM a fixup recomputes in fp32, on the device, any token past fp16's range. Accuracy: `mode="exact"` keeps fp32 activations in the GEMVs (relative error ~1e-6) and
    fp16 in the GEMMs (~3.4e-4); `mode="fast"` quantizes x to Q8_1 and runs int8 dp4a kernels as llama.cpp does
    where they measured faster than the exact ones (RULES.fast_lanes_max_tokens per format, at most 8 tokens;
    Q4_K's int8 MMA GEMM from 9 tokens to RULES.q8_max_tokens) — exact integer dots; relative error ≤ 1e-5
    against the product with the Q8_1-rounded x; TQ4_1S NMSE ~5e-5 —, and the exact kernels elsewhere (and where
    the weights do not suit the int8 kernels' loads). TQ4_1S's decode rotates x (`rotation="separate"`: one prep kernel;
    `"fused"`: inside the lane GEMV for T ≤ 4, within ~1e-6 of separate, the same terms summed in another order;
    `"auto"`, the default: fused where RULES.fused_rotation_max_weights says it is faster, small weights, else
    separate; eager and captured, fp32 and fp16 x alike). Non-finite activations give non-finite outputs in their
    token's row."""
    if type(w) is not QuantTensor and not isinstance(w, QuantTensor):
        raise TypeError(f"mul_mat: expected a QuantTensor for w, got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"mul_mat: w holds {w.shape[0]} experts {w.shape}: route tokens to them with mul_mat_id")
    if workspace is not None and not isinstance(workspace, Workspace):
        raise TypeError(f"mul_mat: workspace: expected a Workspace (Workspace().reserve(w, T)), got "
                        f"{type(workspace).__name__}")
    m, k = w.shape
    host = torch_x = x16 = False
    tt = _TORCH[0] if _TORCH else driver.torch_types()
    if tt is not None and isinstance(x, tt[0]):  # the hot path: a CUDA float32 torch tensor
        torch_x = True
        if not (x.dtype is tt[1] and x.is_cuda and x.dim() == 2 and x.is_contiguous() and x.shape[1] == k):
            x16 = _torch_input(x, k)[2]  # raises the precise error; or an fp16 x
        t, x_ptr, dev = x.shape[0], x.data_ptr(), x.get_device()
        if x_ptr & 15 or dev != driver.ORDINAL:
            _torch_input(x, k)
        s = (stream if type(stream) is int and stream >= 0 else tt[2](dev) if stream is None
             else driver.stream_handle(stream))  # (a negative int: stream_handle's error)
    elif type(x) is DeviceArray:
        if len(x.shape) != 2 or x.shape[1] != k:
            raise ValueError(f"mul_mat: x must have shape (T, {k}) for W of shape {w.shape}, got {tuple(x.shape)}")
        if x.dtype not in (np.float32, np.float16):
            raise TypeError(f"mul_mat: x: expected dtype float32 or float16, got {x.dtype}")
        if x.ptr % 16:
            raise ValueError(f"mul_mat: x: device pointer {x.ptr:#x} is not 16-byte aligned")
        t, x_ptr, x16 = x.shape[0], x.ptr, x.dtype == np.float16
        s = driver.stream_handle(stream, x)
    else:
        shape = shape_of(x, "mul_mat: x")
        if len(shape) != 2 or shape[1] != k:
            raise ValueError(f"mul_mat: x must have shape (T, {k}) for W of shape {w.shape}, got {shape}")
        t, x_ptr, host = shape[0], None, isinstance(x, np.ndarray)
        s = driver.stream_handle(stream, x)
        if host:  # (copied to the device below, once its plan is known)
            xd = x.dtype
        else:  # a CUDA-array-interface / DLPack array: its dtype from the interface
            xa = as_device_array(x, "mul_mat: x", None, ndim=2, align=16, stream=s)
            xd, x_ptr = xa.dtype, xa.ptr
        if str(xd) not in ("float32", "float16"):
            raise TypeError(f"mul_mat: x: expected dtype float32 or float16, got {xd}")
        x16 = str(xd) == "float16"
    if t == 0:
        raise ValueError("mul_mat: x has no tokens (T = 0)")
    if not getattr(driver._TLS, "bound", False):
        driver.current()  # the context current in this thread
    cid = driver.capture_id(s)
    hold = cid is not None  # buffers dropped while the op records into a capture are freed after it
    if hold:
        driver.hold_frees(1)
    try:
        if cid is not None and (w._device is None or host):
            what = f"{w!r} is not on the GPU yet" if w._device is None else "x is a NumPy array (an upload waits)"
            raise RuntimeError(f"mul_mat: {what} and stream {s:#x} is capturing a CUDA graph: pass a device x (and "
                               "call w.to_device(), or run the op once) before capturing")
        key = (t, mode, rotation, arch, cid is not None)
        entry = w._plans.get(key + ("float16",) if x16 else key)  # mul_mat_plan's cache, looked up inline
        xdt = "float16" if x16 else "float32"
        if entry is not None and entry[0] == knobs._GENERATION[0]:
            plan = entry[1]
        elif cid is None:
            plan = mul_mat_plan(w, t, mode=mode, rotation=rotation, arch=arch, x_dtype=xdt)
        else:  # the first captured call of this T: its plan may load kernels the eager calls did not need
            with driver.relaxed_capture():
                plan = mul_mat_plan(w, t, mode=mode, rotation=rotation, arch=arch, graph=True, x_dtype=xdt)
        if x_ptr is None:
            xa = as_device_array(x, "mul_mat: x", np.float16 if x16 else np.float32, ndim=2, align=16, stream=s)
            x_ptr = xa.ptr
        if out is None:
            if torch_x and stream is None:  # on torch's current stream: torch's allocator, as x.new_empty does
                o = ret = x.new_empty((t, m), dtype=tt[1]) if x16 else x.new_empty((t, m))  # (float32 y for an fp16 x)
                y_ptr = ret.data_ptr()
            else:
                o, ret = _output(None, (t, m), np.float32, "mul_mat: out", x, s)
                y_ptr = o.ptr
        elif tt is not None and isinstance(out, tt[0]):
            if not (out.dtype is tt[1] and out.is_cuda and out.is_contiguous() and out.dim() == 2 and out.shape[0] == t
                    and out.shape[1] == m):
                _torch_output(out, t, m)  # raises the precise error
            y_ptr, ret, o = out.data_ptr(), out, None
        else:
            o, ret = _output(out, (t, m), np.float32, "mul_mat: out", x, s)
            y_ptr = o.ptr
        if out is not None:
            x_end, y_end = x_ptr + t * k * (2 if x16 else 4), y_ptr + t * m * 4
            if y_ptr < x_end and x_ptr < y_end:
                raise ValueError(f"mul_mat: out overlaps x (out at {y_ptr:#x}, {t * m * 4} B; x at {x_ptr:#x}, "
                                 f"{x_end - x_ptr} B): the op reads x while it writes out; pass a separate out array")
        if cid is None and workspace is None:
            b = eager_bound(plan, s)
        else:
            b = plan.bound(workspace_for(plan, s, workspace, cid))
        b.run(x_ptr, y_ptr, s)
        return _finish(o, ret, host, out is not None, s)
    finally:
        if hold:
            driver.hold_frees(-1)


def _torch_input(x, k: int, half: bool = True) -> tuple[int, int, bool]:
    """(T, pointer, whether fp16) of a torch x, checked: CUDA, float32 (or float16 with `half`), (T, K), contiguous,
    16-byte aligned, on ptxgen's GPU."""
    import torch

    if x.dtype is not torch.float32 and not (half and x.dtype is torch.float16):
        raise TypeError(f"mul_mat: x: expected dtype float32{' or float16' if half else ''}, got {x.dtype}")
    if not x.is_cuda:
        raise TypeError("mul_mat: x is a CPU torch tensor: pass x.cuda() (or x.numpy() for a synchronous call)")
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"mul_mat: x must have shape (T, {k}), got {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError("mul_mat: x: a non-contiguous tensor; pass x.contiguous()")
    ptr = x.data_ptr()
    if ptr % 16:
        raise ValueError(f"mul_mat: x: device pointer {ptr:#x} is not 16-byte aligned (a view at an odd offset?)")
    driver.check_device(x, "mul_mat: x")
    return x.shape[0], ptr, x.dtype is torch.float16


def _torch_output(out, t: int, m: int) -> int:
    import torch

    if out.dtype is not torch.float32 or not out.is_cuda:
        raise TypeError(f"mul_mat: out: expected a CUDA float32 tensor, got {out.dtype} on {out.device}")
    if tuple(out.shape) != (t, m):
        raise ValueError(f"mul_mat: out has shape {tuple(out.shape)}, expected {(t, m)}")
    if not out.is_contiguous():
        raise ValueError("mul_mat: out: a non-contiguous tensor")
    return out.data_ptr()


def mul_mat_plan(w: QuantTensor, t: int, *, mode: str = "exact", rotation: str = "auto",
                 arch: str | None = None, graph: bool = False, x_dtype="float32") -> Plan:
    """The launch plan mul_mat(w, x) runs for T = t tokens (cached on `w` per (T, mode, rotation, arch, graph) and
    the knobs' generation): `.kernels` names its launches, `.scratch_bytes` / `.counter_bytes` its workspace needs.
    `graph`: the plan of a call captured into a CUDA graph, where launches cost the host nothing at replay — it may
    prefer more, faster kernels (exact Q4_K at 1-4 tokens: the activation prep as a kernel of its own, overlapped
    by PDL, instead of inside the GEMV; the same bits). Loads the kernels it names; checks the arguments (a
    ValueError names a bad one). `x_dtype`: float32 or float16, the activation's (an fp16 x goes to the GEMMs that
    read fp16 as it is — no conversion of its values, no overflow fixup behind them — and is widened to fp32 once for
    the kernels that read fp32)."""
    if not isinstance(w, QuantTensor):
        raise TypeError(f"mul_mat: expected a QuantTensor for w, got {type(w).__name__}")
    xdt = np.dtype(x_dtype) if str(x_dtype) in ("float32", "float16") else _dtype_name(x_dtype)
    if xdt is None:
        raise TypeError(f"mul_mat: x: expected dtype float32 or float16, got {x_dtype}")
    xdt = np.dtype(xdt)
    if type(t) is not int or not 0 < t <= MAX_COUNT:  # (before the cache: True or 1.0 found T = 1's plan)
        t = _count(t, "mul_mat", "T")
    key = (t, mode, rotation, arch, bool(graph)) + (() if xdt == np.float32 else ("float16",))
    gen = knobs.generation()
    entry = w._plans.get(key)
    if entry is not None and entry[0] == gen:
        return entry[1]
    from ptxgen import codecs

    if w.fmt not in codecs.CODECS:
        raise ValueError(f"mul_mat: no kernel for {w.fmt} yet (have: {', '.join(codecs.CODECS)})")
    codec = codecs.get(w.fmt)
    if rotation not in ROTATIONS:
        raise ValueError(f"mul_mat: rotation must be one of {', '.join(map(repr, ROTATIONS))}, got {rotation!r}")
    if mode not in ("exact", "fast"):
        raise ValueError(f"mul_mat: mode must be 'exact' or 'fast', got {mode!r}")
    if mode not in codec.ROUTES:
        raise ValueError(f"mul_mat: mode={mode!r} has no kernel for {w.fmt} yet: use mode="
                         f"{next(iter(codec.ROUTES))!r}")
    if len(w.shape) != 2:
        raise ValueError(f"mul_mat_plan: w holds {w.shape[0]} experts {w.shape}: mul_mat_id runs those")
    w.to_device()  # once (mul_mat refuses to get here while its stream is capturing)
    m, k = w.shape
    err = codec.weights_error(mode, k, w.ptr)
    if err:
        raise ValueError(f"mul_mat: {err}")
    pb = PlanBuilder((t, k), xdt, (t, m), np.float32, graph=bool(graph))
    _record_mul_mat(pb, w, int(t), mode, rotation, arch)
    plan = pb.finish(f"mul_mat {w.fmt} {m}x{k} T={t} mode={mode}" + ("" if xdt == np.float32 else " x float16"))
    _remember(w, key, (gen, plan))
    return plan


def choose(fmt: str, mode: str, arch: str | None, t: int, m: int, k: int, *, graph: bool = False) -> Plan:
    """The launch plan mul_mat makes on this GPU for a `fmt` weight of shape (m, k) and t tokens (`mode`, `arch`,
    `graph` as mul_mat / mul_mat_plan take them), without weights: a stand-in at a made-up address that is never
    read (`.kernels` names the launches; binding or running the plan is not meant). The dispatch rule in one call,
    for tools and docs (ptxgen.testing.dispatch tabulates it)."""
    from ptxgen import formats

    from .driver import DeviceBuffer

    stand_in = QuantTensor(fmt, (m, k), device=DeviceBuffer.wrap(1 << 44, m * formats.get(fmt).row_bytes(k)))
    return mul_mat_plan(stand_in, t, mode=mode, arch=arch, graph=graph)


class _Call(NamedTuple):
    """One mul_mat being planned: what the routes below look at and record into."""
    pb: PlanBuilder
    w: QuantTensor
    t: int
    mode: str
    rotation: str
    arch: str | None
    m: int
    k: int


def _per_format(rule, fmt: str, default: int | None = None) -> int:
    """A rule's value for `fmt`: the rule's own where it is one number (an override sets one for every format);
    `default` for a format the rule does not list (none: every format must be listed)."""
    if not isinstance(rule, dict):
        return rule
    return rule[fmt] if default is None else rule.get(fmt, default)


ROTATIONS = ("auto", "separate", "fused")  # mul_mat's rotation= (a rotated codec's, TQ4_1S's; others ignore it)


def _rotation(w: QuantTensor, t: int, rotation: str) -> str:
    """mul_mat's rotation= resolved: "auto" is "fused" (one launch: the rotation inside the lane GEMV) up to
    FUSED_MAX_TOKENS tokens where the weights are fewer than RULES.fused_rotation_max_weights and the separate route
    would run the lane GEMVs too (not the tensor-core GEMV, its knob or _mma_min, nor the few-token builds), else
    "separate". An fp16 x is widened for it (convert_f32: two launches, as its _x16 prep + GEMV), so that it gives
    its fp32 widening's bits. The same in eager and captured plans: the route, so the bits, do not depend on them."""
    from ptxgen import codecs

    codec = codecs.get(w.fmt)
    if rotation != "auto" or not hasattr(codec, "ROTATION"):
        return rotation
    m, k, fmt = *w.shape, w.fmt
    lanes = (getattr(knobs, codec.DECODE["mma_knob"])() != "on" and t < _mma_min(fmt, m, k)
             and not _per_format(RULES.codec_few_min_tokens, fmt, 1) <= t <= _per_format(RULES.codec_few_max_tokens,
                                                                                         fmt, 0))
    fused = t <= FUSED_MAX_TOKENS and lanes and m * k < _per_format(RULES.fused_rotation_max_weights, fmt, 0)
    return "fused" if fused else "separate"


def _record_mul_mat(pb: PlanBuilder, w: QuantTensor, t: int, mode: str, rotation: str, arch: str | None) -> None:
    """mul_mat's dispatch (docs/design.md "Dispatch"; the thresholds: RULES), recorded into `pb`: the first of the
    weight codec's routes for `mode` (ptxgen/codecs: `ROUTES`) whose condition holds records the call."""
    from ptxgen import codecs

    c = _Call(pb, w, t, mode, _rotation(w, t, rotation), arch, *w.shape)
    fp16 = w.fp16_weights
    for name in codecs.get(w.fmt).ROUTES[mode]:
        when, record = _ROUTES[name]
        if (fp16 or name not in FP16_WEIGHT_ROUTES) and when(c):
            if pb.x.dtype == np.float16 and name not in X16_ROUTES | X16_SELF_ROUTES:  # an fp16 x: widened once
                # for the kernels that read fp32 (the GEMM routes take it as it is where their GEMM reads fp16:
                # _rec_mmq; the decode routes widen it where their kernels need it: _fp32_x)
                pb.x = _rec_widen(pb, pb.x, arch, once=True)
            record(c)
            return
    raise AssertionError(f"mul_mat: no route of {w.fmt} took T={t}")  # every codec's last route always holds


def _slices(c: _Call, one, size: int = 8) -> None:
    """Calls `one(n, t0)` for each slice of at most `size` tokens (a fresh slice of scratch each, plans.PlanBuilder)."""
    for t0 in range(0, c.t, size):
        c.pb.begin_slice()
        one(min(size, c.t - t0), t0)


def _codec_gemv(c: _Call) -> None:
    """The codec-generic exact GEMV (kernels/gemv_codec.py) in slices of up to 8 tokens, or of up to 16 where the
    format ships its 16-token build (9-16 tokens in one launch: Q5_K); an fp16 x on the builds' _x16 twins (x as
    given), where a twin is not built on x widened once (_fp32_x)."""
    from ptxgen.kernels import NOT_SHIPPED

    tokens = GEMV_TOKENS + ((16,) if CodecKernel("gemv", c.w.fmt, 16).name not in NOT_SHIPPED else ())
    def one(n, t0):
        fn, xp = _x_reader(c.pb, CodecKernel("gemv", c.w.fmt, next(v for v in tokens if v >= n)), c.arch, c.k, t0)
        kp = codec_gemv_k_parts(fn.meta, c.m, c.k) if fn.meta.get("kparts_param") else 0
        c.pb.launch(fn, (-(-c.m * max(kp, 1) // int(fn.meta["rows_per_cta"])),),
                    (c.w.buffer, xp, c.pb.y.ptr + 4 * t0 * c.m, c.m, c.k, n) + ((kp,) if kp else ()))
    _slices(c, one, tokens[-1])


CODEC_GEMV_MAX_K_PARTS = 4  # (8 built and emulator-checked, not timed)


def codec_gemv_k_parts(meta: dict, m: int, k: int) -> int:
    """kparts of a one-token codec GEMV (meta kparts_param; kernels/gemv_codec.py) over m rows of K = k: the most, up
    to CODEC_GEMV_MAX_K_PARTS and the row's groups, whose grid stays within the format's RULES.codec_gemv_t1_max_ctas
    CTAs (a format the rule does not list: 1). More parts give a small op's rows more warps, each over fewer
    dependent steps; past about a wave of CTAs they only add the CTA's barrier and sum."""
    cap = _per_format(RULES.codec_gemv_t1_max_ctas, meta["fmt"], 0)
    rows, groups = int(meta["rows_per_cta"]), -(-k // int(meta["group_k"]))
    kp = 1
    while kp * 2 <= min(CODEC_GEMV_MAX_K_PARTS, groups) and -(-m * kp * 2 // rows) <= cap:
        kp *= 2
    return kp


def _codec_mma_tma(c: _Call) -> bool:
    """Whether the call runs the codec tensor-core GEMV's TMA build (one box a step): T ≤ 8 and a row a multiple of
    16 bytes (the tensor map's stride; Q6_K: K/256 a multiple of 8)."""
    from ptxgen import formats

    return c.t <= 8 and formats.get(c.w.fmt).row_bytes(c.k) % 16 == 0


def _codec_mma_kernel(c: _Call) -> str:
    """The codec tensor-core GEMV for this call: gemv_<fmt>_mma_tma where _codec_mma_tma, else the bulk-copy build
    gemv_<fmt>_mma (_n16: 9-16 tokens)."""
    return GemvKernel("mma", c.w.fmt, 8 * -(-c.t // 8), tma=_codec_mma_tma(c)).name


def _codec_mma_ok(c: _Call) -> bool:
    """A codec's tensor-core decode GEMV (kernels/gemv_mma_codec.py) for RULES.codec_mma_min_tokens ≤ T ≤
    RULES.codec_mma_max_tokens (and T = 1 where M ≥ RULES.codec_mma_t1_min_rows) where it is built (sm_90a), the
    weights 16-byte aligned, K a multiple of 256. The TMA build (_codec_mma_tma) needs nothing more; the bulk-copy
    build a row a multiple of 4 bytes (every row's step at the same 2-byte phase), M rows a multiple of 16 bytes
    (its bulk copies of 16-byte multiples read no byte past the buffer; Q6_K: K/256 even and M·K/256 a multiple of
    8), and the weights under 4 GiB (its byte offsets are 32-bit)."""
    from ptxgen import formats
    from ptxgen.kernels import gemv_mma_codec

    if c.w.fmt not in gemv_mma_codec.FORMATS or c.k % 256:
        return False
    row = formats.get(c.w.fmt).row_bytes(c.k)
    bulk_ok = row % 4 == 0 and (c.m * row) % 16 == 0 and c.m * row < 1 << 32
    one = c.t == 1 and c.m >= _per_format(RULES.codec_mma_t1_min_rows, c.w.fmt)  # T = 1 where M is large
    return ((_per_format(RULES.codec_mma_min_tokens, c.w.fmt) <= c.t or one)
            and c.t <= _per_format(RULES.codec_mma_max_tokens, c.w.fmt) and c.w.ptr % 16 == 0
            and (_codec_mma_tma(c) or bulk_ok) and kernels.build_for(_codec_mma_kernel(c), c.arch) == "sm_90a")


def _codec_mma(c: _Call) -> None:
    """prep_mma_f16 per group of 8 tokens (_prep_mma_groups; its min fragments unused), then _codec_mma_kernel:
    gemv_<fmt>_mma_tma or gemv_<fmt>_mma (T ≤ 8), or gemv_<fmt>_mma_n16."""
    tiles, factors, _ = _prep_mma_groups(c.pb, c.w.fmt, 0, c.t, c.k, c.arch)
    fn = kernels.load(_codec_mma_kernel(c), c.arch)
    _mma_gemv_launch(c.pb, fn, c.w, (tiles, factors), c.pb.y.ptr, c.m, c.k, c.t, fn.resident_per_sm(), None)


def _codec_few_kernel(fmt: str, t: int) -> str:
    """The few-token build of another codec for t tokens (kernels/gemv_t1.py): gemv_<fmt>_mma_t{1,2,4,8} up to 8
    (the smallest that holds t: Q8_0's t8 is not built where its ring does not fit, sm_89 / sm_120a), then
    gemv_<fmt>_mma_t16h to 16 and mmq_<fmt>_rega_n32 above (Q5_K's; the rule stops Q6_K and Q8_0 at 16)."""
    if t > T4.Q4K_HI_TOKENS:
        return GemvKernel("skinny", fmt, T4.Q4K_SKINNY_COLUMNS).name
    if t > 8:
        return GemvKernel("few", fmt, T4.Q4K_HI_TOKENS, hi_only=True).name
    return GemvKernel("few", fmt, next(v for v in T4.Q4K_RECORD_TOKENS if v >= t)).name


def _codec_few_ok(c: _Call) -> bool:
    """Another codec on the few-token tensor-core builds (kernels/gemv_t1.py FEW_FORMATS, CODEC_FORMATS): T up to
    RULES.codec_few_max_tokens[fmt] (≤ 32; the mma_block codecs' builds, Q6_K's and Q8_0's, take 16) from
    RULES.codec_few_min_tokens[fmt] (default 1; T = 1 from
    RULES.codec_few_t1_min_weights[fmt] weights where the codec GEMV would run it instead), the build for T there on
    the target, K a multiple of 256, the weights 16-byte aligned (the cp.async ring's 16-byte copies); TQ4_1S's
    (its records of the rotated x from prep_rot16_t*) not where rotation="fused" asks for one launch. A step of a
    row not a multiple of 16 bytes (Q6_K's 210) is copied from the 16 bytes below its start: its rows a multiple of
    4 bytes (every row's step at the same 2-byte phase: K a multiple of 512) and M rows a multiple of 16 bytes (the
    last copy ends at the buffer's end)."""
    from ptxgen import codecs, formats

    lim = _per_format(RULES.codec_few_max_tokens, c.w.fmt, 0)
    if c.t < _per_format(RULES.codec_few_min_tokens, c.w.fmt, 1):
        return False  # fewer tokens than the builds win from (the format's other decode kernels run them)
    if getattr(codecs.get(c.w.fmt), "ROTATION", None) and c.rotation == "fused" and c.t <= FUSED_MAX_TOKENS:
        return False  # rotation="fused" asks for the rotation inside the GEMV (the decode route's): no prep kernel
    if c.t == 1 and c.m * c.k < _per_format(RULES.codec_few_t1_min_weights, c.w.fmt, 0) and not _codec_mma_ok(c):
        return False  # a small one-token call: the format's single-launch codec GEMV (the route left) is faster
    row = formats.get(c.w.fmt).row_bytes(c.k) if c.k % 256 == 0 else 0
    return (c.t <= min(lim, T4.Q4K_SKINNY_COLUMNS) and row and c.w.ptr % 16 == 0
            and (row % 16 == 0 or (row % 4 == 0 and (c.m * row) % 16 == 0))
            and kernels.build_for(_codec_few_kernel(c.w.fmt, c.t), c.arch) is not None)


def _codec_few(c: _Call) -> None:
    """gemv_<fmt>_mma_t{1,2,4,8} (exact) up to 8 tokens, gemv_<fmt>_mma_t16h (fp16 activations) to 16, on
    prep_q4k_t*'s records (prep_sub16_t*'s for Q6_K and Q8_0; _few_token_gemv); the skinny GEMM mmq_<fmt>_rega_n32
    above (_skinny_gemm)."""
    if c.t > T4.Q4K_HI_TOKENS:
        _skinny_gemm(c.pb, c.w, c.pb.y.ptr, c.m, c.k, c.t, c.arch)
    else:
        _few_token_gemv(c.pb, c.w, 0, c.pb.y.ptr, c.m, c.k, c.t, c.arch, hi_only=c.t > 8)


def _t16h(c: _Call) -> None:
    if skinny16_ok(c.w.fmt, c.m, c.arch):  # t16h's grid would take two rounds
        _skinny_gemm(c.pb, c.w, c.pb.y.ptr, c.m, c.k, c.t, c.arch, c=T4.Q4K_HI_TOKENS)
    else:  # fp16 activations, as the GEMMs
        _few_token_gemv(c.pb, c.w, 0, c.pb.y.ptr, c.m, c.k, c.t, c.arch, hi_only=True)


def _mmq(c: _Call) -> None:
    """The MMQ of the call's path (a rotated codec's x rotated once first: TQ4_1S on the mma.sync targets), then the
    fixup, which recomputes exactly on the device a token past fp16 / Q8_1."""
    from ptxgen import codecs

    int8 = c.mode == "fast" and hasattr(codecs.get(c.w.fmt), "Q8Decoder")  # the int8 x Q8_1 MMQ: Q4_K's
    q8 = q8_path(c.t, mmq_path(c.arch)) if int8 else None
    # a rotated codec on the fp16 mma.sync GEMM reading convert_f16's copy: the rotation writes it (_rotate_x)
    f16 = "natural" if q8 is None and mmq_path(c.arch) == "mma.sync" and mma_sync_x16(c.m, c.k, c.t, c.arch) else None
    xa = _rec_mmq(c.pb, c.w, _rotated_x(c, f16), c.pb.y, c.t, c.pb.flag, c.arch, path=q8)
    if xa is not None:  # (an fp16 x on the wgmma builds: nothing to fix)
        _rec_fixup(c.pb, c.w, xa, c.pb.y, c.t, c.arch)


def _q8_built(c: _Call) -> bool:
    """Whether the int8 MMQ q8_path picks for the call has a build for its arch (mma.sync's: sm_89 / sm_120a, which
    an sm_90 device runs where no arch is pinned; arch="sm_90a" pinned has none: the exact routes run instead)."""
    path = q8_path(c.t, mmq_path(c.arch))
    bn = next((n for n in Q8_TILES if c.t <= n), Q8_TILES[-1])
    return kernels.build_for(MmqSpec.for_path(path, bn).name, c.arch) is not None


def _fast_lanes_ok(c: _Call) -> bool:
    """mode="fast" up to RULES.fast_lanes_max_tokens (per format, at most 8; 0: never): the int8 x Q8_1 lane GEMV,
    where the format has one built here and the weights suit its loads (the codec's GgmlLane: K a multiple of
    K_MULTIPLE, the pointer ALIGN-aligned). Wider calls, and weights it cannot take, run the format's exact routes
    after it: the lanes re-read their tokens' activations for every row, so past the rule the exact tensor-core
    GEMVs are faster, and they are more accurate than llama.cpp's int8 path."""
    from ptxgen import codecs

    lane = getattr(codecs.get(c.w.fmt), "GgmlLane", None)
    if lane is not None and (c.k % lane.K_MULTIPLE or c.w.ptr % lane.ALIGN):
        return False
    return (c.t <= min(GEMV_TOKENS[-1], _per_format(RULES.fast_lanes_max_tokens, c.w.fmt, GEMV_TOKENS[-1]))
            and kernels.build_for(GemvKernel("gemv", c.w.fmt, 1, fast=True).name, c.arch) is not None)


def _fast_lanes(c: _Call) -> None:
    """mode "fast": x quantized to Q8_1 in the lane layout once, then the int8 GEMV per slice of 8 tokens."""
    q, row = _prep_lanes(c.pb, c.t, c.k, GemvKernel("prep_lanes", c.w.fmt, fast=True), c.arch)

    def one(n, t0):
        fn = kernels.load(GemvKernel("gemv", c.w.fmt, next(v for v in GEMV_TOKENS if v >= n), fast=True).name, c.arch)
        _gemv_launch(c.pb, fn, c.w, q.ptr + t0 * row, c.pb.y.ptr + 4 * t0 * c.m, c.m, c.k, n)
    _slices(c, one)


def _few_ok(fmt: str, n: int, m: int, arch, knob: str) -> bool:
    """Whether a slice of n tokens and m rows runs the format's few-token builds (the decode route's; Q4_K's): n ≤
    RULES.q4k_few_max_tokens, and where that is the 8-token build (5-8 tokens), its row CTAs fit one round of its
    resident CTAs (_one_round) or the codec's few-token knob (DECODE["few_knob"]: PTXGEN_Q4K_T1) is on."""
    if n > RULES.q4k_few_max_tokens:
        return False
    return n <= 4 or getattr(knobs, knob)() == "on" or _one_round(GemvKernel("few", fmt, 8).name, m, arch)


def _one_round(name: str, m: int, arch) -> bool:
    """Whether the row CTAs of the few-token build `name` over m rows (its meta rows_per_cta) fit one round of its
    resident CTAs (meta ctas_per_sm) on this GPU: past one round the split-K GEMVs lose to the kernels whose CTAs
    cover more rows (gemv_q4_k_mma, the skinny GEMM)."""
    from .driver import current

    meta = kernels.entry(name, kernels.build_for(name, arch))["meta"]
    return -(-m // int(meta["rows_per_cta"])) <= int(meta["ctas_per_sm"]) * current().sm_count


def _decode(c: _Call) -> None:
    """The exact decode per slice of up to 8 tokens, as the codec's DECODE describes it (Q4_K, TQ4_1S): one token
    on the GEMV on tables of x's products where RULES.xtab_max_tokens names the format (TQ4_1S; off: slower in a
    graph),
    the activation-in-registers GEMV (opt-in, one token), the few-token tensor-core builds, the tensor-core GEMV (its
    knob; on auto from _mma_min tokens), else the fp32 lane GEMV — TMA-fed where it may be, a rotated codec's
    rotation fused into it for T ≤ FUSED_MAX_TOKENS with rotation="fused" (wider calls rotate once up front)."""
    from ptxgen import codecs

    codec = codecs.get(c.w.fmt)
    d, fmt, pb, w, m, k = codec.DECODE, c.w.fmt, c.pb, c.w, c.m, c.k
    fused = hasattr(codec, "ROTATION") and c.rotation == "fused" and c.t <= FUSED_MAX_TOKENS
    tma = d.get("lane_tma", False) and not fused and _tma_ok(w, c.arch, GemvKernel("gemv", fmt, tma=True).name)
    mma_ok = tma if d.get("mma_needs_tma") else _mma_build(c.arch, GemvKernel("mma", fmt).name) is not None
    tc = getattr(knobs, d["mma_knob"])() if mma_ok else "off"
    few = ("few_knob" in d and tc != "on" and kernels.build_for(GemvKernel("few", fmt, 1).name, c.arch) is not None
           and (getattr(knobs, d["few_knob"])() == "on" or (getattr(knobs, d["few_knob"])() == "auto"
                                                           and m * k >= getattr(RULES, d["few_min_weights"]))))
    xr = "xr" in d and _xr_ok(k)
    min_tokens = _mma_min(fmt, m, k)
    lanes = []  # the activation in the lane layout, prepared once if a lane kernel needs it

    xtab = GemvKernel("gemv", fmt, 1, xtab=True).name
    xtab = xtab if _per_format(RULES.xtab_max_tokens, fmt, 0) >= 1 and _tma_ok(w, c.arch, xtab) else None

    def one(n, t0):
        y_ptr = pb.y.ptr + 4 * t0 * m
        if xtab and n == 1:  # one token on tables of x's products (reads x unrotated, fp32: one launch)
            return _gemv_launch(pb, kernels.load(xtab, c.arch), w, _fp32_x(pb, c.arch).ptr + 4 * k * t0, y_ptr, m, k, 1)
        xr_one = xr and n == 1 and tc != "on"
        if not xr_one and few and _few_ok(fmt, n, m, c.arch, d["few_knob"]):  # few tokens on tensor cores, (hi, lo)
            return _few_token_gemv(pb, w, t0, y_ptr, m, k, n, c.arch)  # B columns (an fp16 x: its _x16 prep)
        if xr_one:  # one token, the activation in registers, no prep (opt-in)
            return _xr_gemv(pb, w, d["xr"], _fp32_x(pb, c.arch).ptr + 4 * k * t0, y_ptr, m, k, c.arch)
        if tc == "on" or (tc == "auto" and n >= min_tokens):  # tensor-core GEMVs (an fp16 x: the preps' _x16 twins)
            return _mma_gemv(pb, w, t0, y_ptr, m, k, n, c.arch)
        fn = kernels.load(_gemv_kernel(w, n, fused, tma and n <= RULES.tma_gemv_max_tokens), c.arch)
        if fn.meta.get("layout") == "lanes":  # TQ4_1S rotated once / Q4_K (T <= 2) as fp32, in the lane layout
            if not lanes:  # (prepared once, from an fp16 x by the prep's _x16 twin)
                lanes.append(_prep_lanes(pb, c.t, k, GemvKernel("prep_lanes", fmt), c.arch))
            a, row = lanes[0]
        else:  # the kernel reads x itself, fp32
            a, row = _fp32_x(pb, c.arch), 4 * k
        _gemv_launch(pb, fn, w, a.ptr + row * t0, y_ptr, m, k, n)
    _slices(c, one)


def _rotated_x(c: _Call, f16: str | None = None):
    """The activation the codec's GEMMs read: x, or for a rotated codec (TQ4_1S) x rotated once into scratch (the
    GEMM and the fixup then read that; _rotate_x); `f16`: the K order ("natural", "rega") of the fp16 copy the GEMM
    after it converts that to, made by the same launch."""
    return _rotate_x(c.pb, c.w.fmt, c.t, c.k, c.arch, f16)


def _rotate_x(pb: PlanBuilder, fmt: str, rows: int, k: int, arch, f16: str | None = None):
    """pb.x, or for a rotated codec (TQ4_1S) its `rows` x K rows rotated once into fp32 scratch, which the kernels
    recorded after it read (mul_mat and mul_mat_id alike): by the codec's ROTATION kernel, or where x is fp16 or
    `f16` names the K order of the fp16 copy an fp16 GEMM reads next (convert_f16's or convert_f16_perm's, with its
    overflow flag), by rotate_tq4_1s_f16 — x of either dtype, both outputs, one launch; _rec_convert_f16 then
    takes that copy (PlanBuilder.f16_made) instead of converting."""
    from ptxgen import codecs
    from ptxgen.kernels.gemv import ROT_NO_F16, ROT_REGA, ROT_X16

    rotation = getattr(codecs.get(fmt), "ROTATION", None)
    if not rotation:
        return pb.x
    fused = ActKernel("rotate", f16=True).name
    half = pb.x.dtype == np.float16
    if f16 is not None and (f16 not in ("natural", "rega") or f16 == "rega" and k % 64):
        raise ValueError(f"rotate: no fp16 copy in K order {f16!r} for K = {k}")
    if (half or f16) and (kernels.build_for(fused, arch) is None or not knobs.rotate_f16()):
        if half:  # (no fused build for this arch: the plain rotation reads fp32)
            pb.x = _rec_widen(pb, pb.x, arch, once=True)
            half = False
        f16 = None
    xa = pb.scratch((rows, k), np.float32)
    nb = rows * k // 32
    if not (half or f16):
        pb.launch(kernels.load(rotation, arch), ((nb + 7) // 8,), (pb.x, xa, nb))
        return xa
    x16 = pb.scratch((rows, k), np.float16) if f16 else None
    mode = (ROT_X16 if half else 0) | (ROT_REGA if f16 == "rega" else 0) | (0 if f16 else ROT_NO_F16)
    pb.launch(kernels.load(fused, arch), ((nb + 7) // 8,), (pb.x, xa, x16 if f16 else xa, pb.flag, nb, mode))
    if f16:
        pb.f16_made[id(xa)] = (xa, f16, x16)
    return xa


def _mmq_ra(c: _Call) -> None:
    """The codec's register-A GEMM (its blocks decoded in the K loop: no fragment pass) after convert_f16_perm (a
    rotated codec's x rotated and converted by one launch, rotate_tq4_1s_f16: _rotate_x), then the codec's fixup."""
    xa = _rec_mmq(c.pb, c.w, _rotated_x(c, "rega"), c.pb.y, c.t, c.pb.flag, c.arch, path="wgmma_ra")
    if xa is not None:
        _rec_fixup(c.pb, c.w, xa, c.pb.y, c.t, c.arch)


def _mmq_ra_ok(c: _Call) -> bool:
    """A codec's register-A GEMM applies: T within its rules (codec_ra_mmq_min_tokens to _max_tokens), whole 64-column
    steps, the TMA boxes' 16-byte row strides and base, sm_90 with its build there."""
    return (_per_format(RULES.codec_ra_mmq_min_tokens, c.w.fmt) <= c.t <= _per_format(RULES.codec_ra_mmq_max_tokens, c.w.fmt)
            and c.m >= RULES.mmq_min_rows
            and c.k % 256 == 0 and c.w.ptr % 16 == 0 and mmq_path(c.arch) != "mma.sync"
            and (rg := _ra_row_group(c.w.fmt, c.m, c.k))  # (rows in groups where one is not 16-byte whole)
            and "sm_90a" in kernels.available(MmqSpec(_rega_tile(c.t), "wgmma", a_regs=True, fmt=c.w.fmt,
                                                      row_group=rg).name))


def _mmq_pre(c: _Call) -> None:
    """The codec's fp16 fragments, the prepared register-A GEMM, the codec's fixup; a rotated codec's (TQ4_1S)
    activation rotated once first, into fp32 scratch the fixup reads and the fp16 copy the GEMM reads
    (rotate_tq4_1s_f16: _rotate_x)."""
    xa = _rec_mmq(c.pb, c.w, _rotated_x(c, "rega"), c.pb.y, c.t, c.pb.flag, c.arch, path="wgmma_pre")
    if xa is not None:
        _rec_fixup(c.pb, c.w, xa, c.pb.y, c.t, c.arch)


# the routes that take an fp16 x themselves (their GEMM through _rec_mmq; a rotated codec's x widened first)
X16_ROUTES = frozenset({"mmq", "mmq_q8", "mmq_f16", "mmq_ra", "mmq_pre"})
# the routes that take an fp16 x into their kernels' _x16 twins (_x_reader: the decode preps, the one-launch builds,
# the codec GEMVs) and widen it (_fp32_x) only for the kernels that have none
X16_SELF_ROUTES = frozenset({"decode", "codec_few", "t16h", "skinny", "codec_gemv", "small_gemv", "codec_mma",
                             "mma_n16", "fast_lanes"})
# mul_mat's routes by name (the codecs list theirs, in order, per mode): (condition, recorder)
_ROUTES = {
    "codec_gemv": (lambda c: True, _codec_gemv),
    "codec_mma": (_codec_mma_ok, _codec_mma),
    # another codec on the few-token tensor-core builds (kernels/gemv_t1.py FEW_FORMATS, CODEC_FORMATS)
    "codec_few": (_codec_few_ok, _codec_few),
    "t16h": (lambda c: RULES.mmq_min_tokens <= c.t <= T4.Q4K_HI_TOKENS and _t16h_ok(c.w.fmt, c.arch), _t16h),
    # exact, and faster than the MMQ at T=16
    "mma_n16": (lambda c: (RULES.mmq_min_tokens <= c.t <= 16 and knobs.q4k_mma() != "off"
                           and _mma_build(c.arch, GemvKernel("mma", c.w.fmt, 16).name) is not None),
                lambda c: _mma_gemv(c.pb, c.w, 0, c.pb.y.ptr, c.m, c.k, c.t, c.arch)),
    "skinny": (lambda c: c.m >= RULES.mmq_min_rows and skinny_ok(c.w.fmt, c.t, c.m, c.k, c.arch),  # fp16 x, as MMQs
               lambda c: _skinny_gemm(c.pb, c.w, c.pb.y.ptr, c.m, c.k, c.t, c.arch)),
    "mmq": (lambda c: c.t >= RULES.mmq_min_tokens and c.m >= RULES.mmq_min_rows, _mmq),
    # mode="fast": the int8 x Q8_1 MMQ (Q4_K's) where q8_path runs it; above, the exact routes
    "mmq_q8": (lambda c: (c.mode == "fast" and c.t >= RULES.mmq_min_tokens and c.m >= RULES.mmq_min_rows
                          and q8_path(c.t, mmq_path(c.arch)) is not None and _q8_built(c)), _mmq),
    # another codec where the GEMM is mma.sync's (sm_89, sm_120a, or arch pinned there), from
    # RULES.codec_f16_mmq_min_tokens: the fp16 mma.sync MMQ decoding its weights with the codec's run8
    # (kernels/mmq.py F16_CODECS), then its fixup
    "mmq_f16": (lambda c: (c.t >= _per_format(RULES.codec_f16_mmq_min_tokens, c.w.fmt) and c.t >= RULES.mmq_min_tokens
                           and c.m >= RULES.mmq_min_rows and c.k % 256 == 0
                           and mmq_path(c.arch) == "mma.sync" and not _tc_slices_first(c)
                           and kernels.build_for(MmqSpec(MMQ_TILES[0], fmt=c.w.fmt).name, c.arch) is not None),
                _mmq),
    # a codec with its own register-A decode (kernels/mmq.py RA_CODECS): its GEMM straight from the raw blocks
    "mmq_ra": (_mmq_ra_ok, _mmq_ra),
    # any codec with a fragment writer: its fp16 fragments, then the prepared wgmma GEMM (sm_90), then the fixup
    "mmq_pre": (lambda c: (c.t >= _per_format(RULES.codec_mmq_min_tokens, c.w.fmt) and c.m >= RULES.mmq_min_rows
                           and c.k % 64 == 0
                           and mmq_path(c.arch) != "mma.sync"
                           and "sm_90a" in kernels.available(CodecKernel("frags", c.w.fmt).name)),
                _mmq_pre),
    "fast_lanes": (_fast_lanes_ok, _fast_lanes),
    # one token on small weights: the codec GEMV, one launch without an activation prep (Q4_K's)
    "small_gemv": (lambda c: (c.t == 1 and c.m * c.k < _per_format(RULES.codec_gemv_t1_max_weights, c.w.fmt, 0)
                              and not _decode_pinned(c.w.fmt)
                              and kernels.build_for(CodecKernel("gemv", c.w.fmt, 1).name, c.arch) is not None),
                   _codec_gemv),
    "decode": (lambda c: True, _decode),  # the codec's DECODE (Q4_K, TQ4_1S)
}


# the routes whose GEMMs hold each weight in fp16 (the others keep the integer q, exact in fp16 or int8, with the
# scales in fp32 — the int8 MMQ of mmq_q8 too): skipped for tensors whose blocks can express a weight past fp16's
# range (QuantTensor.fp16_weights), which run those others
FP16_WEIGHT_ROUTES = frozenset({"mmq", "mmq_f16", "mmq_ra", "mmq_pre"})


def _tc_slices_first(c: _Call) -> bool:
    """Whether the codec's exact decode runs tensor-core GEMV slices on this target (its GemvKernel("mma") built
    there: TQ4_1S on sm_120a) and T is within RULES.codec_tc_slices_max_tokens[fmt]: those slices then run ahead of
    the fp16 mma.sync GEMM."""
    lim = _per_format(RULES.codec_tc_slices_max_tokens, c.w.fmt, 0)
    return c.t <= lim and kernels.build_for(GemvKernel("mma", c.w.fmt).name, c.arch) is not None


def _t16h_ok(fmt: str, arch) -> bool:
    """Exact-mode calls of 9-16 tokens of a format with few-token builds (Q4_K's routes) run gemv_<fmt>_mma_t16h
    wherever it is built (PTXGEN_Q4K_T16H; on auto PTXGEN_Q4K_MMA=1 keeps them on the exact gemv_q4_k_mma_n16).
    H200, T=16, µs, t16h / n16 (exact) / the wgmma MMQ (bench_mmq, 2026-11-30): 4096x4096 13.8 / 19.3 / 21.0,
    14336x4096 22.4 / 34.2 / 40.1, 4096x14336 24.0 / 33.6 / 38.8, 18944x3584 33.8 / 37.9, 3584x18944 28.3 / 37.8;
    9-16 tokens on 256x2048 to 4608x3584 9.1-14.5 / 12.4-20.0 (bench/results/probe_q4k_few*_session13.log)."""
    v = knobs.q4k_t16h()
    if v == "off" or (v == "auto" and knobs.q4k_mma() == "on"):
        return False
    return kernels.build_for(GemvKernel("few", fmt, T4.Q4K_HI_TOKENS, hi_only=True).name, arch) is not None


def skinny16_ok(fmt: str, m: int, arch=None) -> bool:
    """Whether a 9-16-token call that would run gemv_q4_k_mma_t16h (_t16h_ok) runs mmq_q4_k_rega_n16 instead (the
    same prep_q4k_t16h records, shared by the CTA's warps: 3 CTAs per SM to t16h's 1): where it is built (sm_90a)
    and t16h's row CTAs exceed one round of its resident CTAs (its build's meta ctas_per_sm, one on sm_90a: M >
    132 x 128 rows on the H200), unless PTXGEN_MMQ_SKINNY=0. H200, µs, t16h / n16 at T = 16 and 9: 18944x3584
    33.8 / 28.5 and 33.4 / 27.8; where t16h's grid fits (4096², 14336x4096, 4096x14336, 3584x18944) n16 is 10-30%
    slower (bench/results/probe_skinny16*_session18.log)."""
    if knobs.mmq_skinny() == "off" or kernels.build_for(GemvKernel("skinny", fmt, T4.Q4K_HI_TOKENS).name,
                                                        arch) is None:
        return False
    return not _one_round(GemvKernel("few", fmt, T4.Q4K_HI_TOKENS, hi_only=True).name, m, arch)


def _decode_pinned(fmt: str) -> bool:
    """Whether a knob pins one of the codec's decode kernels (Q4_K: PTXGEN_Q4K_XR, _T1 or _MMA on): the route
    small_gemv then leaves the call to _decode, so that a pinned kernel runs at every size, as its knob says."""
    from ptxgen import codecs

    d = getattr(codecs.get(fmt), "DECODE", None) or {}
    pinned = [getattr(knobs, d[key])() for key in ("mma_knob", "few_knob") if key in d]
    return "on" in pinned or ("xr" in d and knobs.q4k_xr() == "on")


def _xr_ok(k: int) -> bool:
    """gemv_q4_k_xr (the only DECODE["xr"] kernel, Q4_K's) serves exact slices of one token when PTXGEN_Q4K_XR=1
    and K ≤ its 24576 (one CTA covers K). Opt-in: on the H200 it measured 10-40% slower than the default kernels
    (bench/NOTES.md)."""
    if knobs.q4k_xr() != "on":
        return False
    from ptxgen.kernels.gemv_xr import XR_MAX_K  # only when asked for: the runtime needs no kernel builders

    return k <= XR_MAX_K


def _xr_gemv(pb: PlanBuilder, w: QuantTensor, name: str, x_ptr, y_ptr, m: int, k: int, arch) -> None:
    """One token through `name` (the codec's DECODE["xr"]: gemv_q4_k_xr): 32·ceil(K/2048) threads per CTA, rows
    per CTA so that the grid makes one round of the resident CTAs (at most 64; at least 1)."""
    fn = kernels.load(name, arch)
    threads = 32 * -(-(k // 64) // 32)
    smem = fn.meta["stages"] * 48 * threads  # the ring for the threads launched
    slots = fn.resident_per_sm(threads, smem) * driver.current().sm_count
    rows = min(fn.meta["max_rows_per_cta"], max(1, -(-m // slots)))
    pb.launch(fn, (-(-m // rows),), (w.buffer, x_ptr, y_ptr, m, k, rows), block=(threads, 1, 1), smem=smem)


def _few_token_gemv(pb: PlanBuilder, w: QuantTensor, t0: int, y_ptr, m: int, k: int, n: int, arch,
                    hi_only: bool = False) -> None:
    """n ≤ 8 tokens through prep_q4k_t{nt} (x → one record per super-block: scaled fp16 hi/lo B pairs, min pairs,
    factors; nt = 1, 2, 4 or 8, the smallest ≥ n) and gemv_q4_k_mma_t{nt} behind it (programmatic dependent
    launch where the build has it), split-K by gemv_splits; hi_only: n ≤ 16 tokens, fp16 activations (hi parts
    only), prep_q4k_t16h + gemv_q4_k_mma_t16h. From RULES.few_shared_min_tokens (per format; 0: never) the
    4- and 8-token builds whose records a CTA's warps share (gemv_<fmt>_mma_t{4,8}s), split-K over gridDim.y; up to
    RULES.few_i8_max_tokens (per format; 0: never) the int8 builds prep_q{4,6}k_i8_t{nt} + gemv_<fmt>_i8_t{nt} (eager:
    gemv_<fmt>_i8_t{nt}_fused where built, as the fp16 ones). The slice's x is pb.x's tokens from t0: an fp16 x goes
    to the prep's or the one-launch build's _x16 twin where there is one (the records of the same values: no
    convert_f32 launch before it), else is widened once for the kernels that read fp32 (_fp32_x)."""
    nt = T4.Q4K_HI_TOKENS if hi_only else next(v for v in T4.Q4K_RECORD_TOKENS if v >= n)
    # the int8 builds (rule few_i8_max_tokens; gemv_t1._I8Step): their own records, else as the fp16 ones
    i8 = (not hi_only and n <= _per_format(RULES.few_i8_max_tokens, w.fmt, 0)
          and kernels.build_for(GemvKernel("few", w.fmt, nt, i8=True).name, arch) is not None)
    from ptxgen import codecs

    q6 = hasattr(codecs.get(w.fmt), "I8Block")  # (its int8 builds' own records, as gemv_t1.build decides)
    rb = ((T4.q6k_i8_record_bytes(nt) if q6 else T4.q4k_i8_record_bytes(nt)) if i8 else
          T4.q4k_record_bytes(nt, hi_only))
    rec = pb.scratch((k // 256 * rb,), np.uint8)
    # one launch where the host issues every call (eager): 4-6 µs of host time less per call; captured into a graph
    # the two kernels overlapped by PDL measured ~1 µs faster on the GPU (bench/NOTES.md, 2026-12-01)
    fk = knobs.q4k_fused()
    fused_spec = GemvKernel("few", w.fmt, nt, hi_only=hi_only, fused=True, i8=i8)
    fused = kernels.build_for(fused_spec.name, arch) if fk == "on" or (fk == "auto" and not pb.graph) else None
    if fused is not None:  # one launch: the kernel builds the records itself (3 sync words after the counters);
        fn, x_ptr = _x_reader(pb, fused_spec, arch, k, t0)  # an fp16 x: its _x16 twin, from x as given
        grid, part, cnt, kp, launch = _gemv_split_plan(pb, fn, m, k, n, fn.resident_per_sm())
        pb.counters(4 * grid[0] * int(fn.meta["warps"]) + 12)
        pb.launch(fn, grid, (w.buffer, rec, y_ptr, m, k, n, part, cnt, x_ptr) + kp, **launch)
        return
    prep_spec = GemvKernel("prep_few", w.fmt, nt, hi_only=hi_only, i8=i8)
    flagged = kernels.entry(prep_spec.name, kernels.build_for(prep_spec.name, arch))["meta"].get("ready_flag")
    prep, x_ptr = _x_reader(pb, prep_spec, arch, k, t0, x16_ok=not flagged)  # (T1_FLAG's preps count their CTAs:
    # no _x16 builds; the manifest's meta, not a load, so that a plan loads each kernel once)
    shared = GemvKernel("few", w.fmt, nt, shared=True).name  # the records shared by a CTA's warps (SHARED_NOTE)
    if (not hi_only and not i8 and 0 < _per_format(RULES.few_shared_min_tokens, w.fmt, 0) <= n
            and kernels.build_for(shared, arch) is not None and not prep.meta.get("ready_flag")):  # (T1_FLAG's prep:
        # its count is the per-warp builds')
        fn = kernels.load(shared, arch)
        ctas = -(-m // int(fn.meta["rows_per_cta"]))
        splits = gemv_splits(ctas, k, fn.resident_per_sm(), driver.current().sm_count, 8, int(fn.meta["max_splits"]))
        cnt = pb.counters(4 * ctas * int(fn.meta["warps"]))
        part = pb.scratch((splits, n, m), np.float32) if splits > 1 else cnt
        pb.launch(prep, ((nt * k // 32 + 7) // 8,), (x_ptr, rec, n, k))
        pb.launch(fn, (ctas, splits, 1), (w.buffer, rec, y_ptr, m, k, n, part, cnt), pdl=bool(fn.meta.get("pdl")))
        return
    fn = kernels.load(GemvKernel("few", w.fmt, nt, hi_only=hi_only, i8=i8).name, arch)  # (another codec: its decoder)
    grid, part, cnt, kp, launch = _gemv_split_plan(pb, fn, m, k, n, fn.resident_per_sm())
    # builds that hand the records over by a count (gemv_t1.T1_FLAG, a probe's): both or neither
    flag = bool(fn.meta.get("ready_flag"))
    if flag != bool(prep.meta.get("ready_flag")):
        raise RuntimeError(f"{prep.name} and {fn.name}: one counts the records ready (ready_flag) and the other not")
    ready = (pb.ready(8),) if flag else ()
    pb.launch(prep, ((nt * k // 32 + 7) // 8,), (x_ptr, rec, n, k) + ready)
    pb.launch(fn, grid, (w.buffer, rec, y_ptr, m, k, n, part, cnt) + kp + ready, pdl=bool(fn.meta.get("pdl")),
              **launch)




def skinny_ok(fmt: str, t: int, m: int, k: int, arch=None) -> bool:
    """Whether mul_mat runs exact-mode `fmt` (Q4_K's routes) with t tokens on the skinny GEMM mmq_<fmt>_rega_n32
    (PTXGEN_MMQ_SKINNY: auto = 17 ≤ t ≤ RULES.skinny_max_tokens of the MMQ path it replaces — the wgmma one from
    RULES.skinny_wgmma_min_weights weights —, on = 17-128 tokens, off = never)."""
    v = knobs.mmq_skinny()
    if v == "off" or t <= T4.Q4K_HI_TOKENS or t > 128:
        return False
    if v == "auto":
        path = mmq_path(arch, t).split("_")[0]
        if t > RULES.skinny_max_tokens[path] or (path == "wgmma" and m * k < RULES.skinny_wgmma_min_weights):
            return False
    return kernels.build_for(GemvKernel("skinny", fmt, T4.Q4K_SKINNY_COLUMNS).name, arch) is not None


def _skinny_gemm(pb: PlanBuilder, w: QuantTensor, y_ptr, m: int, k: int, t: int, arch,
                 c: int = T4.Q4K_SKINNY_COLUMNS) -> None:
    """t tokens through mmq_<fmt>_rega_n{c} (c = 32, or 16: T ≤ 16): prep_q4k_t{c}h once per group of c tokens
    (records back to back), then one launch over (row CTAs, K splits, token groups); splits fill one wave of the
    resident CTAs. An fp16 x goes to the prep's _x16 build where there is one (else widened once: _fp32_x)."""
    groups = -(-t // c)
    nsb = k // 256
    rb = T4.q4k_record_bytes(c, True)
    rec = pb.scratch((groups * nsb * rb,), np.uint8)
    for gz in range(groups):
        prep, x_ptr = _x_reader(pb, GemvKernel("prep_few", w.fmt, c, hi_only=True), arch, k, c * gz)
        pb.launch(prep, ((c * k // 32 + 7) // 8,), (x_ptr, rec.ptr + nsb * rb * gz, min(c, t - c * gz), k))
    fn = kernels.load(GemvKernel("skinny", w.fmt, c).name, arch)  # (another K-quant: its decoder)
    rows = int(fn.meta["rows_per_cta"])
    ctas = -(-m // rows)
    splits = gemv_splits(ctas * groups, k, fn.resident_per_sm(), driver.current().sm_count, 8, int(fn.meta["max_splits"]))
    cnt = pb.counters(4 * ctas * int(fn.meta["warps"]) * groups)
    part = pb.scratch((splits, t, m), np.float32) if splits > 1 else cnt
    pb.launch(fn, (ctas, splits, groups), (w.buffer, rec, y_ptr, m, k, t, part, cnt), pdl=bool(fn.meta.get("pdl")))


def mma_min_tokens(fmt: str, m: int, k: int) -> int:
    """The fewest tokens in a slice for which mul_mat runs the tensor-core exact GEMV (knob on auto); the formats
    whose exact decode route is the codec's DECODE (Q4_K, TQ4_1S)."""
    from ptxgen import codecs

    have = [f for f, c in codecs.CODECS.items() if hasattr(c, "DECODE")]
    if fmt not in have:
        raise ValueError(f"mma_min_tokens: no tensor-core exact GEMV for {fmt} (have: {', '.join(have)})")
    return _mma_min(fmt, m, k)


def _mma_min(fmt: str, m: int, k: int) -> int:
    """The codec's DECODE["mma_min"] = (rule A, n, rule B): n tokens from RULES.A weights, else RULES.B."""
    from ptxgen import codecs

    big, n, small = codecs.get(fmt).DECODE["mma_min"]
    return n if m * k >= getattr(RULES, big) else getattr(RULES, small)


def _mma_gemv(pb: PlanBuilder, w: QuantTensor, t0: int, y_ptr, m: int, k: int, n: int, arch) -> None:
    """n tokens of the call's x from token t0 through the codec's tensor-core GEMV (the decode route's; Q4_K,
    TQ4_1S). A rotated codec (TQ4_1S, n ≤ 8): prep_<fmt>_mma (rotation, scaled fp16 hi/lo tiles), then
    gemv_<fmt>_mma or, below RULES.mma_gemv_m32_min_weights, gemv_<fmt>_mma_m16. Else (Q4_K, n ≤ 16): prep_mma_f16
    per group of 8 tokens (scaled fp16 hi/lo tiles, one scale per super-block, and the min-term fragments), then
    gemv_<fmt>_mma (n ≤ 8) or gemv_<fmt>_mma_n16. An fp16 x: the preps' _x16 twins (_x_reader)."""
    from ptxgen import codecs

    if hasattr(codecs.get(w.fmt), "ROTATION"):
        tiles, factors, items = _mma_tiles(pb, 1, k)
        prep, x_ptr = _x_reader(pb, GemvKernel("prep_mma", w.fmt), arch, k, t0)
        pb.launch(prep, ((items + 7) // 8,), (x_ptr, tiles, factors, n, k))
        fn = kernels.load(GemvKernel("mma", w.fmt, small=m * k < RULES.mma_gemv_m32_min_weights).name, arch)
        _mma_gemv_launch(pb, fn, w, (tiles, factors), y_ptr, m, k, n, fn.resident_per_sm(), None)
        return
    groups = -(-n // 8)  # 9-16 tokens run gemv_<fmt>_mma_n16, two groups of 8 prepared one after the other
    tiles, factors, minfrag = _prep_mma_groups(pb, w.fmt, t0, n, k, arch)
    fn = kernels.load(GemvKernel("mma", w.fmt, 8 * groups).name, arch)
    per_sm, smem = fn.resident_per_sm(), None
    if groups == 1:  # the residency (4 or 3 CTAs per SM) whose grid fills more of the GPU's CTA slots
        per_sm = _fullest_residency(fn, m, k, (per_sm, per_sm - 1), n)
        smem = fn.smem_for_residency(per_sm) if per_sm < fn.resident_per_sm() else None
    _mma_gemv_launch(pb, fn, w, (tiles, factors, minfrag), y_ptr, m, k, n, per_sm, smem)


def _prep_mma_groups(pb: PlanBuilder, fmt: str, t0: int, n: int, k: int, arch):
    """prep_mma_f16 (GemvKernel("prep_mma", fmt) of an unrotated codec; on an fp16 x its _x16 twin) per group of 8
    of the call's n tokens from token t0, the groups' buffers back to back: (tiles (32·K bytes a group), factors (K
    bytes), min-term fragments (K bytes))."""
    groups = -(-n // 8)
    tiles, factors, items = _mma_tiles(pb, groups, k)
    minfrag = pb.scratch((groups, k // 256, 256), np.uint8)  # the min-term fragments, K bytes per group
    for i in range(groups):
        prep, x_ptr = _x_reader(pb, GemvKernel("prep_mma", fmt), arch, k, t0 + 8 * i)
        pb.launch(prep, ((items + 7) // 8,), (x_ptr, tiles.ptr + 32 * k * i, factors.ptr + k * i,
                                              minfrag.ptr + k * i, min(8, n - 8 * i), k))
    return tiles, factors, minfrag


def _mma_tiles(pb: PlanBuilder, groups: int, k: int):
    """Scratch for the tensor-core GEMVs' activation: fp16 hi/lo B tiles and factors per group of 8 tokens."""
    tiles = pb.scratch((groups, k // 16, T4.MMA_TILE), np.uint8)
    factors = pb.scratch((groups, k // 32, T4.MMA_TOKENS), np.float32)
    return tiles, factors, T4.MMA_TOKENS * (k // 32)


def _mma_gemv_launch(pb, fn, w, acts, y_ptr, m, k, n, per_sm, smem) -> None:
    grid, part, cnt, kp, _ = _gemv_split_plan(pb, fn, m, k, n, per_sm)
    pb.launch(fn, grid, (_weight_arg(fn, w), *acts, y_ptr, m, k, n, part, cnt) + kp, smem=smem,
              pdl=bool(fn.meta.get("pdl")))


def _fullest_residency(fn, m: int, k: int, choices, tokens: int | None = None) -> int:
    """Of `choices` (resident CTAs per SM), the one whose split plan (row CTAs x gemv_splits) fills the largest
    share of the slots over the rounds it takes; the first unless another fills more than 1% more. H200, Q4_K tensor-core GEMV at T=8 (µs, 4 / 3 CTAs per SM):
    14336x4096 (224 row CTAs: 448 of 528 slots / 224 of 396) 23.8 / 27.0; 18944x3584 (296 of 528 / 296 of 396)
    29.9 / 25.3; 4096x14336 and 3584x3584 (97% / 97-99%) 23.3 / 23.7 and 12.8 / 12.1."""
    from .driver import current

    def fill(per_sm):
        ctas, splits, _ = _split_grid(fn, m, k, per_sm, tokens=tokens)
        return _round_fill(ctas * splits, per_sm * current().sm_count)
    best = choices[0]
    for c in choices[1:]:
        if c >= 1 and fill(c) > fill(best) + 0.01:
            best = c
    return best


def _split_grid(fn, m: int, k: int, per_sm: int, warps: int | None = None, tokens: int | None = None
                ) -> tuple[int, int, int]:
    """A split-K GEMV's grid at `per_sm` resident CTAs per SM: (CTAs over the rows, K splits (gemv_splits), warps a
    row tile — gemv_k_parts for a build with the kparts parameter (meta k_parts), else 1). `warps`: the CTA's, where
    the launch picks them (_block_plan); `tokens`: the call's T (else the build's tokens), for the rule
    multi_round_k_parts."""
    from .driver import current

    sms, meta = current().sm_count, fn.meta
    lane_cols, max_splits, min_steps = (int(meta.get("lane_cols", 32)), int(meta.get("max_splits", 8)),
                                        int(meta.get("min_split_steps", 1)))
    if "k_parts" in meta:
        warps = warps or int(meta["warps"])
        most = warps
        if "k_parts_rule" in meta:  # a rule caps kparts by the build's tokens (few_max_k_parts)
            most = min(most, _by_tokens(getattr(RULES, meta["k_parts_rule"]), int(meta["tokens"])))
        return gemv_k_parts(warps, int(meta["rows_per_warp"]), m, k, per_sm, sms, lane_cols, max_splits, min_steps,
                            most, _by_tokens(RULES.multi_round_k_parts, tokens or int(meta.get("tokens", 1))))
    rows = int(meta["rows_per_cta"])
    ctas = (m + rows - 1) // rows
    return ctas, gemv_splits(ctas, k, per_sm, sms, lane_cols, max_splits, min_steps), 1


def _by_tokens(rule, tokens: int) -> int:
    """A rule's value for T = tokens: an int, or a dict by T whose entry of the largest key ≤ T applies."""
    if not isinstance(rule, dict):
        return int(rule)
    return int(rule[str(max((int(t) for t in rule if int(t) <= tokens), default=min(map(int, rule))))])


def gemv_k_parts(warps: int, rows_per_warp: int, m: int, k: int, per_sm: int, sms: int, lane_cols: int,
                 max_splits: int, min_steps: int = 1, most: int | None = None, round_most: int = 1
                 ) -> tuple[int, int, int]:
    """(row CTAs, grid K splits, kparts) of a GEMV whose CTA's warps split into row tiles of kparts warps, each on
    a part of the tile's K range summed in the CTA (gemv_t1.T1_PLAN, gemv_mma_codec): of kparts = 1, 2, 4, .. up to
    the CTA's warps and the K steps, dividing the warps (a CTA of 6: 1 or 2), whose grid fits one round (kparts 1
    always qualifies), the one that gives the most warps work (tiles x kparts x gemv_splits); on a tie, the most
    kparts — fewer grid splits, whose tail (the
    partials' stores, a fence, the counter, the last warp's reloads) costs 1-2 µs an op where the CTA's own sum
    costs one barrier (bench/NOTES.md, 2026-12-03). `most`: kparts at most this (the few-token builds' rule
    few_max_k_parts: each part reads its own activation records, which outweigh the weights from 4 tokens).
    A grid over more than one round even at kparts 1 takes _multi_round_kparts' plan, kparts ≤ `round_most` too
    (the rule multi_round_k_parts)."""
    tiles, slots, steps = -(-m // rows_per_warp), sms * per_sm, -(-(k // lane_cols) // 32)
    if -(-tiles // warps) > slots:  # more than one round at kparts 1
        return _multi_round_kparts(tiles, warps, slots, steps, min(most or warps, round_most))
    best, kp = None, 1
    while kp <= min(warps, most or warps) and (kp == 1 or kp <= steps) and warps % kp == 0:  # (6 warps: 1, 2)
        ctas = -(-tiles * kp // warps)
        if kp > 1 and ctas > slots:
            break
        splits = gemv_splits(ctas, k, per_sm, sms, lane_cols * kp, max_splits, min_steps)
        busy = _busy_warps(tiles, kp, splits, slots, warps)
        if best is None or busy >= best[0]:
            best = (busy, ctas, splits, kp)
        kp *= 2
    return best[1:]


def _multi_round_kparts(tiles: int, warps: int, slots: int, steps: int, most: int) -> tuple[int, int, int]:
    """(row CTAs, 1 split, kparts) of a grid over more than one round of `slots`: of kparts = 1, 2, 4, .. up to
    `most` (the rule multi_round_k_parts) and the K steps, the one whose rounds are the fullest (CTAs / (rounds ·
    slots)), each more than 1% fuller than the best before it; the last round of 2004 CTAs on 396 slots runs 12."""
    def fill(kp):
        return _round_fill(-(-tiles * kp // warps), slots)
    best, kp = 1, 2
    while kp <= min(warps, most) and kp <= steps and warps % kp == 0:
        if fill(kp) > fill(best) + 0.01:
            best = kp
        kp *= 2
    return -(-tiles * best // warps), 1, best


def _round_fill(ctas: int, slots: int) -> float:
    """The share of `slots` resident CTA slots busy over the rounds `ctas` CTAs take (2+ rounds past one)."""
    return ctas / (-(-ctas // slots) * slots)


def _busy_warps(tiles: int, kparts: int, splits: int, slots: int, warps: int) -> int:
    """Warps with work in a GEMV grid of `tiles` row tiles x kparts x splits, at most the resident warps (`slots`
    CTAs of `warps`)."""
    return min(tiles * kparts * splits, slots * warps)


def _block_smem(fn, nw: int) -> int:
    """The dynamic shared memory of a launch of `nw` warps a CTA (meta block_warps): nw rings, 128 bytes of
    alignment, and what sits before the rings (meta smem_besides_rings: TQ4_1S's wide codebook table)."""
    return nw * int(fn.meta["ring_bytes_per_warp"]) + int(fn.meta.get("smem_besides_rings", 128))


def _block_plan(fn, m: int, k: int, tokens: int) -> tuple[int, int, int, int]:
    """(row CTAs, K splits, kparts, warps a CTA) of a build that takes its CTA size at launch (meta block_warps: the
    few-token builds of 8 warps also run as 4, with shared memory for as many rings): each size's _split_grid plan
    at the residency the occupancy calculator gives it; the one that gives the most warps work, then the fewest
    grid splits, then the fewest warps on the busiest SM (148 CTAs of 8 warps on 132 SMs put 16 warps on 16 of
    them, 296 of 4 at most 12), then the smaller CTAs."""
    from .driver import current

    sms, meta = current().sm_count, fn.meta
    best = None
    for nw in meta["block_warps"]:
        per = fn.resident_per_sm(32 * nw, _block_smem(fn, nw))
        ctas, splits, kp = _split_grid(fn, m, k, per, nw, tokens)
        busy = _busy_warps(-(-m // int(meta["rows_per_warp"])), kp, splits, sms * per, nw)
        key = (busy, -splits, -(-(-ctas * splits // sms) * nw), -nw)
        if best is None or key > best[0]:
            best = (key, (ctas, splits, kp, nw))
    return best[1]


def _gemv_split_plan(pb: PlanBuilder, fn, m: int, k: int, n: int, per_sm: int):
    """A split-K GEMV's launch: (grid (row CTAs, K splits), partials, counters, the arguments after them: (kparts,)
    for a build with that parameter, else (); the launch's block and shared memory where _block_plan picks them)."""
    launch = {}
    if "block_warps" in fn.meta:
        ctas, splits, kp, nw = _block_plan(fn, m, k, n)
        if nw != int(fn.meta["warps"]):
            launch = dict(block=(32 * nw, 1, 1), smem=_block_smem(fn, nw))
    else:
        ctas, splits, kp = _split_grid(fn, m, k, per_sm, tokens=n)
    cnt = pb.counters(4 * ctas * int(fn.meta["warps"]))
    part = pb.scratch((splits, n, m), np.float32) if splits > 1 else cnt
    return (ctas, splits), part, cnt, ((kp,) if "k_parts" in fn.meta else ()), launch


def _weight_arg(fn, w: QuantTensor):
    """A GEMV's weight parameter: the tensor map for a TMA-fed build (meta copy "tma"), else the buffer."""
    return _weight_tensor_map(fn, w) if fn.meta.get("copy") == "tma" else w.buffer


def _weight_tensor_map(fn, w: QuantTensor) -> bytes:
    """The weights as the TMA GEMVs' tensor map: u32 elements, rows of row_bytes/4 words (TQ4_1S: K·20/128,
    Q4_K: K·144/1024), the kernel's box (meta tma_box: words x rows), no swizzle; zero fill past the row end
    and past M."""
    from ptxgen import formats

    m, k = w.shape
    cols, rows = fn.meta["tma_box"]
    return _tensor_map(w.ptr, "u32", m, formats.get(w.fmt).row_bytes(k) // 4, int(rows), int(cols), "none")


def _tma_ok(w: QuantTensor, arch: str | None, kernel: str) -> bool:
    """The device runs a TMA-fed build of `kernel` (kernels.build_for gives sm_90a or sm_120a: `arch` not pinning
    another target), with 16-byte aligned weights and a row stride that is a multiple of 16 bytes (the tensor
    map's rules)."""
    from ptxgen import formats

    m, k = w.shape
    return (kernels.build_for(kernel, arch) in ("sm_90a", "sm_120a")
            and formats.get(w.fmt).row_bytes(k) % 16 == 0 and w.ptr % 16 == 0)


def _mma_build(arch: str | None, kernel: str) -> str | None:
    """The target whose build of the decode route's tensor-core GEMV `kernel` (an unrotated codec's: Q4_K)
    mul_mat would run here (kernels.build_for: sm_90a's TMA-fed build on sm_90, the cp.async one for sm_89 /
    sm_120a), or None where there is none. mul_mat has checked the weights' 16-byte alignment, and a Q4_K row
    (144·K/256 bytes) is always a multiple of 16 bytes: both copies' rules hold. (A rotated codec's — TQ4_1S —
    runs where its TMA-fed lane GEMVs may: _tma_ok of gemv_<fmt>_tma_t1, for TQ4_1S K a multiple of 128.)"""
    return kernels.build_for(kernel, arch)


def gemv_splits(ctas: int, k: int, ctas_per_sm: int, sms: int, lane_cols: int = 32, max_splits: int = 8,
                min_steps: int = 1) -> int:
    """K splits for a lane-per-block GEMV: as many as keep the grid within one wave of resident CTAs
    (small M, long K: 3584 x 18944 has 448 row CTAs for 1056 slots), at most `max_splits` (the kernel's meta;
    8 for the lane kernels), each split ≥ one step (a step is 32 lanes x `lane_cols` columns: 32 for TQ4_1S
    and Q8_0 blocks, 64 for Q4_K sub-block pairs), and no more than ceil(steps / min_steps) (the kernel's meta
    min_split_steps, where short splits measured slower)."""
    steps = -(-(k // lane_cols) // 32)
    return max(1, min(max_splits, steps, -(-steps // min_steps), (sms * ctas_per_sm) // max(ctas, 1)))


def _gemv_launch(pb: PlanBuilder, fn, w, a_ptr, y_ptr, m: int, k: int, n: int) -> None:
    if "split_k" not in fn.meta:
        rows = int(fn.meta["rows_per_cta"])
        pb.launch(fn, ((m + rows - 1) // rows,), (w.buffer, a_ptr, y_ptr, m, k, n))
        return
    wt = _weight_arg(fn, w)
    grid, part, cnt, kp, _ = _gemv_split_plan(pb, fn, m, k, n, int(fn.meta["ctas_per_sm"]))
    # pdl: the sm_90+ builds wait (griddepcontrol) for the activation prep that precedes them, so they may
    # start early and have their first weights in flight when it finishes
    pb.launch(fn, grid, (wt, a_ptr, y_ptr, m, k, n, part, cnt) + kp, pdl=bool(fn.meta.get("pdl")))


def _prep_lanes(pb: PlanBuilder, t: int, k: int, prep: GemvKernel, arch):
    """The call's activation in the lane GEMVs' layout (ptxgen.formats.tq4_1s.to_lanes_*), one launch of `prep`:
    prep_tq4_1s (forward RHT, fp32), prep_tq4_1s_q8 (RHT + Q8_1), prep_q8_lanes (Q8_1) or prep_f32_lanes — on an
    fp16 x its _x16 twin (_x_reader). Returns the buffer and its bytes per token."""
    row = T4.lane_groups(k) * (T4.LANE_GROUP_Q8 if prep.fast else T4.LANE_GROUP_F32)
    buf = pb.scratch((t, row), np.uint8, once=True)
    nb = t * k // 32
    fn, x_ptr = _x_reader(pb, prep, arch, k, 0)
    pb.launch(fn, ((nb + 7) // 8,), (x_ptr, buf, nb, k))
    return buf, row

"""ptxgen's ops as torch operators (`torch.ops.ptxgen.*`), for torch modules, `torch.compile(fullgraph=True)` and CUDA
graphs (`mode="reduce-overhead"`). Needs torch (the `[torch]` extra); nothing else in ptxgen imports torch.

    from ptxgen.torch import QuantLinear
    layer = QuantLinear.from_gguf("model.gguf", "blk.0.ffn_up.weight").cuda()   # an nn.Module
    y = layer(x)                                  # x: (T, K) float32 / float16 CUDA tensor → (T, M) float32
    fast = torch.compile(layer, fullgraph=True, mode="reduce-overhead")

The operators take the weights as a torch uint8 tensor of their GGUF bytes plus (fmt, M, K), so that a module can
hold them as a buffer (moved, saved and traced by torch); each has a fake (meta) implementation for tracing.
They run on torch's current stream, like any torch op.
"""
from __future__ import annotations

try:
    import torch
except ModuleNotFoundError as e:  # the one module of ptxgen that needs torch: say which extra brings it
    raise ModuleNotFoundError(f"ptxgen.torch needs torch ({e}): pip install torch, or the [torch] extra "
                              "(pip install -e \".[torch]\")", name=e.name) from e

from . import formats
from .runtime import driver, ops
from .runtime.driver import DeviceBuffer
from .runtime.tensors import QuantTensor

_VIEWS: dict = {}  # (data_ptr, bytes, fmt, M, K, E) → QuantTensor over that memory (plans depend on these only)


def quant_tensor(w: torch.Tensor, fmt: str, m: int, k: int, experts: int = 0, max_scale: float = -1.0) -> QuantTensor:
    """A QuantTensor over the GGUF bytes in CUDA uint8 tensor `w` (no copy), shape (M, K) or with `experts`
    (E, M, K); cached, so its launch plans are reused. `w` is checked on every call (a later view at the same
    address may be shorter, or another dtype). `max_scale`: QuantTensor's (< 0: not known)."""
    if w.dtype != torch.uint8 or not w.is_cuda or not w.is_contiguous():
        raise TypeError(f"ptxgen: weights must be a contiguous CUDA uint8 tensor, got {w.dtype} on {w.device}")
    driver.check_device(w, "ptxgen: the weights tensor")
    key = (w.data_ptr(), w.numel(), fmt, m, k, experts, max_scale)
    qt = _VIEWS.get(key)
    if qt is None:
        if len(_VIEWS) > 4096:
            _VIEWS.clear()
        # no reference to `w`: the caller (a module's buffer) owns the memory; the view only names it
        shape = (experts, m, k) if experts else (m, k)
        qt = _VIEWS[key] = QuantTensor(fmt, shape, device=DeviceBuffer.wrap(w.data_ptr(), w.numel()),
                                       max_scale=max_scale if max_scale >= 0 else None)
    return qt


@torch.library.custom_op("ptxgen::mul_mat", mutates_args=())
def mul_mat_op(w: torch.Tensor, x: torch.Tensor, fmt: str, m: int, k: int, mode: str = "exact",
               rotation: str = "auto", max_scale: float = -1.0) -> torch.Tensor:
    """y = x @ W.T (ptxgen.runtime.mul_mat) with W given as its GGUF bytes `w` (uint8) in format `fmt`, M × K;
    `max_scale`: the blocks' largest |fp16 scale field| where known (QuantTensor.max_scale; < 0: not known)."""
    return ops.mul_mat(quant_tensor(w, fmt, m, k, max_scale=max_scale), x.contiguous(), mode=mode, rotation=rotation)


@mul_mat_op.register_fake
def _(w, x, fmt, m, k, mode="exact", rotation="auto", max_scale=-1.0):
    return x.new_empty((x.shape[0], m), dtype=torch.float32)  # (float32 y for an fp16 x too)


@torch.library.custom_op("ptxgen::dequantize", mutates_args=())
def dequantize_op(w: torch.Tensor, fmt: str, m: int, k: int) -> torch.Tensor:
    """W as fp16 (M, K) (ptxgen.runtime.dequantize)."""
    out = torch.empty((m, k), dtype=torch.float16, device=w.device)
    ops.dequantize(quant_tensor(w, fmt, m, k), out=out)
    return out


@dequantize_op.register_fake
def _(w, fmt, m, k):
    return w.new_empty((m, k), dtype=torch.float16)


@torch.library.custom_op("ptxgen::mul_mat_id", mutates_args=())
def mul_mat_id_op(w: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, fmt: str, experts: int, m: int,
                  k: int, max_scale: float = -1.0) -> torch.Tensor:
    """MoE: y[t, j] = x[t(, j)] @ W[ids[t, j]].T (ptxgen.runtime.mul_mat_id) with the E experts' GGUF bytes `w`
    (uint8, E·M rows of K) in format `fmt`; ids (T, slots) int32; x (T, K) or (T, slots, K) → (T, slots, M);
    `max_scale` as mul_mat_op's."""
    return ops.mul_mat_id(quant_tensor(w, fmt, m, k, experts, max_scale), x.contiguous(), ids.contiguous())


@mul_mat_id_op.register_fake
def _(w, x, ids, fmt, experts, m, k, max_scale=-1.0):
    return x.new_empty((ids.shape[0], ids.shape[1], m))


class QuantLinear(torch.nn.Module):
    """A linear layer with quantized weights (no bias): forward(x) = x @ W.T through ptxgen. The weights are the
    buffer `qweight` (GGUF bytes, uint8); `fmt`, `out_features` (M), `in_features` (K) describe them. `max_scale`
    (QuantTensor's) is read from `qweight` when it is given on the CPU."""

    def __init__(self, qweight: torch.Tensor, fmt: str, out_features: int, in_features: int, *, mode: str = "exact",
                 rotation: str = "auto", max_scale: float | None = None):
        super().__init__()
        self.fmt, self.out_features, self.in_features = fmt, int(out_features), int(in_features)
        self.mode, self.rotation = mode, rotation
        want = self.out_features * formats.get(fmt).row_bytes(self.in_features)
        if qweight.dtype != torch.uint8 or qweight.numel() != want:
            raise ValueError(f"QuantLinear: {fmt} {out_features}x{in_features} needs {want} uint8 bytes, got "
                             f"{qweight.numel()} {qweight.dtype}")
        self.register_buffer("qweight", qweight.reshape(-1).contiguous())
        self.max_scale = -1.0 if max_scale is None else float(max_scale)
        if max_scale is None:
            self._read_max_scale()
        self.register_load_state_dict_post_hook(lambda module, _keys: module._read_max_scale())

    def _read_max_scale(self) -> None:
        """max_scale from `qweight` where its bytes are plain CPU memory (not meta, fake or on the GPU: unknown, -1);
        again after load_state_dict, which may replace them."""
        q = self.qweight
        readable = type(q) is torch.Tensor and q.device.type == "cpu"
        self.max_scale = (formats.max_scale(self.fmt, q.numpy(), (self.out_features, self.in_features)) if readable
                          else -1.0)

    @classmethod
    def from_quant_tensor(cls, qt: QuantTensor, **kw) -> "QuantLinear":
        return cls(torch.from_numpy(qt.raw()), qt.fmt, qt.shape[0], qt.shape[1], **{"max_scale": qt.max_scale, **kw})

    @classmethod
    def from_gguf(cls, path, tensor_name, **kw) -> "QuantLinear":
        """One tensor of a GGUF file, or several of one format and K (a list of names: their rows as one layer,
        QuantTensor.cat — a fused q / k / v or gate / up projection; torch.split its output)."""
        if isinstance(tensor_name, str):
            return cls.from_quant_tensor(QuantTensor.from_gguf(path, tensor_name), **kw)
        return cls.from_quant_tensor(QuantTensor.cat([QuantTensor.from_gguf(path, n) for n in tensor_name]), **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = torch.ops.ptxgen.mul_mat(self.qweight, x.reshape(-1, self.in_features), self.fmt, self.out_features,
                                     self.in_features, self.mode, self.rotation, self.max_scale)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"{self.fmt}, in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"

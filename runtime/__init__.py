"""ptxgen.runtime: load and launch ptxgen's kernels from Python (nvJitLink compile, cache, cuda-python).

Importing this module needs only numpy: cuda-python is imported on first use, and a machine without a
GPU or driver gets one clear RuntimeError at the first GPU call. jinja2 is never imported here (kernels
come from the packaged emitted/ folder; `kernels.load(..., source="dsl")` emits on the fly if you have it).

    from ptxgen.runtime import QuantTensor, dequantize, quantize_q8_1
    w = QuantTensor.from_gguf("model.gguf", "blk.0.ffn_up.weight")
    w16 = dequantize(w)            # DeviceArray (M, K) fp16; .numpy() or torch.as_tensor(w16, device="cuda")
"""
from .arrays import DeviceArray, as_device_array
from .compiler import CompileError, compile_ptx
from . import driver
from .driver import CudaError, DeviceBuffer, Timer, current, synchronize
from .kernels import KernelNotFound, load
from .ops import dequantize, mul_mat, quantize_q8_1, rotate_tq4_1s
from .tensors import QuantTensor, read_gguf_tensor, write_gguf

__all__ = [
    "CompileError", "CudaError", "DeviceArray", "DeviceBuffer", "KernelNotFound", "QuantTensor", "Timer",
    "as_device_array", "compile_ptx", "current", "driver", "dequantize", "load", "mul_mat", "quantize_q8_1",
    "read_gguf_tensor", "rotate_tq4_1s", "synchronize", "write_gguf",
]

"""ptxgen.runtime: load and launch ptxgen's kernels from Python (nvJitLink compile, cache, cuda-python).

Importing this module needs only numpy: cuda-python is imported on first use, and a machine without a GPU or
driver gets one clear RuntimeError at the first GPU call (QuantTensor and GGUF reading work without one). jinja2
is never imported here (kernels come from the packaged emitted/ folder; `kernels.load(..., source="dsl")` emits
on the fly if you have it), and torch only if the caller already imported it.

    from ptxgen.runtime import QuantTensor, mul_mat
    w = QuantTensor.from_gguf("model.gguf", "blk.0.ffn_up.weight")
    y = mul_mat(w, x)            # x: (T, K) float32 torch / cupy / NumPy; on x's current stream
"""
from .arrays import DeviceArray, as_device_array
from .compiler import CompileError, compile_ptx
from . import driver
from .driver import CudaError, DeviceBuffer, Timer, current, stream_handle, synchronize
from .kernels import KernelNotFound, load
from .ops import dequantize, mul_mat, mul_mat_id, mul_mat_id_plan, mul_mat_plan, quantize_q8_1, rotate_tq4_1s
from .plans import Workspace, release_capture_workspaces
from .tensors import GGUFError, QuantTensor, list_gguf_tensors, read_gguf_tensor, write_gguf

__all__ = [
    "CompileError", "CudaError", "DeviceArray", "DeviceBuffer", "GGUFError", "KernelNotFound", "QuantTensor", "Timer",
    "Workspace", "as_device_array", "compile_ptx", "current", "driver", "dequantize", "list_gguf_tensors", "load",
    "mul_mat", "mul_mat_id", "mul_mat_id_plan", "mul_mat_plan", "quantize_q8_1",
    "read_gguf_tensor", "release_capture_workspaces", "rotate_tq4_1s",
    "stream_handle", "synchronize", "write_gguf",
]

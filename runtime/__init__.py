"""ptxgen.runtime: load and launch ptxgen's kernels from Python (nvJitLink compile, cache, cuda-python).

Importing this module needs only numpy: cuda-python is imported on first use, and a machine without a
GPU or driver gets one clear RuntimeError at the first GPU call. jinja2 is never imported here.
"""
from .compiler import CompileError, compile_ptx

__all__ = ["CompileError", "compile_ptx"]

"""ptxgen.emu: a NumPy emulator for the PTX ptxgen emits, so kernel numerics are checked without a GPU.

    python -m ptxgen.emu dequantize_q4_k --arch sm_89          # run the emitted PTX against the reference
    python -m ptxgen.emu quantize_q8_1 --ptx my_edit.ptx      # or a hand-edited file
"""
from .machine import EmulationError, Emulator, Memory, Unsupported, run_kernel
from .parser import PtxParseError, parse

__all__ = ["EmulationError", "Emulator", "Memory", "PtxParseError", "Unsupported", "parse", "run_kernel"]

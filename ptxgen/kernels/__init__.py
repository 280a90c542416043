"""The kernel registry: every kernel ptxgen emits, by name, with the arches it is built for."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..arch import TARGETS, Arch, get_arch
from ..builder import Kernel


@dataclass(frozen=True)
class KernelDef:
    name: str
    doc: str
    build: Callable[[Arch], Kernel]
    archs: tuple = TARGETS

    def for_arch(self, arch) -> Kernel:
        arch = get_arch(arch)
        if arch.name not in self.archs and arch.name != "sm_80":
            raise ValueError(f"kernel {self.name} is not built for {arch.name}; it is built for {', '.join(self.archs)}")
        return self.build(arch)


def _registry() -> dict[str, KernelDef]:
    from . import (convert_f16, dequantize, dequantize_q4_k, fixup, frags, gemv, gemv_codec, gemv_t1, gemv_xr, mmq,
                   quantize_q8_1)

    defs = [quantize_q8_1.KERNEL, quantize_q8_1.KERNEL_MMQ, *dequantize.KERNELS, dequantize_q4_k.KERNEL_FRAGS, *frags.KERNELS, convert_f16.KERNEL,
            convert_f16.KERNEL_PERM, *gemv.kernel_defs(), *gemv_t1.PREPS, *gemv_t1.KERNELS, *gemv_codec.KERNELS, gemv_xr.KERNEL, *mmq.kernel_defs(), fixup.KERNEL, *fixup.KERNELS]
    return {d.name: d for d in defs}


KERNELS = _registry()


def get_kernel(name: str) -> KernelDef:
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; valid: {', '.join(KERNELS)}") from None

"""Per-target lowering: each target module decides the instructions a kernel description becomes
(mma.sync or wgmma, cp.async or TMA). A reader finds everything about one target in one module."""
from __future__ import annotations

from dataclasses import dataclass

from ..arch import Arch, ArchError, get_arch
from ..dsl import Mma, Pipeline, SpecError, Tile


@dataclass(frozen=True)
class Lowering:
    arch: Arch
    copy: str  # default copy mechanism of a Pipeline: "cp.async" or "tma"
    mma: str  # default tensor-core instruction: "mma.sync" or "wgmma"
    notes: str = ""

    def pick_copy(self, pipe: Pipeline) -> str:
        copy = pipe.copy or self.copy
        if copy == "cp.async":
            self.arch.require("cp_async", "Pipeline(copy='cp.async')")
        if copy == "tma":
            self.arch.require("cp_async_bulk_tensor", "Pipeline(copy='tma')", "use Pipeline(copy='cp.async')")
        return copy

    def pick_mma(self, mma: Mma, tile: Tile | None = None) -> str:
        chosen = mma.resolve(self.arch, tile)
        return chosen


def lowering_for(arch: "Arch | str") -> Lowering:
    from . import sm89, sm90a, sm120a

    arch = get_arch(arch)
    table = {"sm_80": sm89.LOWERING_SM80, "sm_89": sm89.LOWERING, "sm_90a": sm90a.LOWERING, "sm_120a": sm120a.LOWERING}
    if arch.name not in table:
        raise ArchError(f"no lowering for {arch.name}; targets: {', '.join(table)}")
    return table[arch.name]


__all__ = ["Lowering", "lowering_for", "SpecError"]

"""`Arch`: a compile target as a typed value, with the PTX ISA version to emit and its feature predicates.

One table (`ARCHES`) says what each target has; `tests/test_arch.py` checks every claim against
nvJitLink by compiling a probe instruction on every arch (it must compile exactly where claimed).
"""
from __future__ import annotations

from dataclasses import dataclass, field

FEATURES = (
    "mma_sync_f16",  # mma.sync.aligned.m16n8k16 f16/bf16 → f32
    "mma_sync_s8",  # mma.sync.aligned.m16n8k32 s8 → s32
    "ldmatrix",
    "cp_async",  # cp.async.ca/cg + commit_group/wait_group
    "cp_async_bulk_tensor",  # TMA
    "mbarrier_try_wait",
    "mbarrier_expect_tx",
    "wgmma",
    "stmatrix",
    "setmaxnreg",
    "clusters",
    "griddepcontrol",  # griddepcontrol.launch_dependents / wait: programmatic dependent launch (sm_90+)
)


@dataclass(frozen=True)
class Arch:
    """A target such as sm_89, sm_90a or sm_120a."""

    major: int
    minor: int
    suffix: str = ""  # "a" for the arch-specific feature set (wgmma, setmaxnreg live only there)
    ptx_version: tuple[int, int] = (8, 7)
    max_smem_per_block: int = 48 * 1024  # dynamic shared memory opt-in limit, bytes
    max_regs_per_thread: int = 255
    features: frozenset[str] = field(default_factory=frozenset)
    tma_frame_bytes: int = 0  # the stack frame this target's ptxas gives a kernel whose TMA copies .shared::cluster

    @property
    def name(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def sm(self) -> int:
        return self.major * 10 + self.minor

    @property
    def ptx_version_str(self) -> str:
        return f"{self.ptx_version[0]}.{self.ptx_version[1]}"

    def allowed_stack(self, ptx: str) -> int:
        """Stack bytes a kernel's compile may show without a spill: `tma_frame_bytes` if it issues
        cp.async.bulk.tensor to a .shared::cluster destination, else none (every sm_120a build now copies to
        .shared::cta, so none may have a frame)."""
        return self.tma_frame_bytes if "cp.async.bulk.tensor.2d.shared::cluster" in ptx else 0

    def has(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
        return feature in self.features

    def require(self, feature: str, what: str, alternative: str = "") -> None:
        """Raise a clear error if this arch lacks `feature`."""
        if not self.has(feature):
            having = [a.name for a in ARCHES.values() if a.has(feature)]
            msg = f"{what} needs {feature}, which {self.name} does not have (it is on: {', '.join(having)})"
            if alternative:
                msg += f"; {alternative}"
            raise ArchError(msg)

    has_wgmma = property(lambda self: self.has("wgmma"))
    has_tma = property(lambda self: self.has("cp_async_bulk_tensor"))
    has_cp_async = property(lambda self: self.has("cp_async"))
    has_setmaxnreg = property(lambda self: self.has("setmaxnreg"))

    def __str__(self) -> str:
        return self.name


class ArchError(ValueError):
    """An instruction or kernel asked for a feature the target does not have."""


_AMPERE = {"mma_sync_f16", "mma_sync_s8", "ldmatrix", "cp_async"}
_HOPPER_PLAIN = _AMPERE | {"cp_async_bulk_tensor", "mbarrier_try_wait", "mbarrier_expect_tx", "stmatrix", "clusters",
                           "griddepcontrol"}

ARCHES: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch(8, 0, "", (8, 7), 163 * 1024, features=frozenset(_AMPERE)),
        Arch(8, 9, "", (8, 7), 99 * 1024, features=frozenset(_AMPERE)),
        Arch(9, 0, "a", (8, 7), 227 * 1024, features=frozenset(_HOPPER_PLAIN | {"wgmma", "setmaxnreg"})),
        # consumer Blackwell: mma.sync + TMA, no wgmma (ptxas rejects it); setmaxnreg does assemble there.
        # PTX ISA 8.7 is the first with sm_120a. Its ptxas (CUDA 13.0) gives every kernel whose
        # cp.async.bulk.tensor names a .shared::cluster destination an 8-byte frame (a one-instruction TMA kernel
        # too): each copy tests the address's CTA and may call a slow path. A .shared::cta destination (PTX ISA
        # 8.6; the fp16 mma.sync MMQ's) compiles without it.
        Arch(12, 0, "a", (8, 7), 99 * 1024, features=frozenset(_HOPPER_PLAIN | {"setmaxnreg"}), tma_frame_bytes=8),
    )
}
TARGETS = ("sm_89", "sm_90a", "sm_120a")  # what `ptxgen emit` produces by default


def get_arch(name: "str | Arch") -> Arch:
    if isinstance(name, Arch):
        return name
    try:
        return ARCHES[name]
    except KeyError:
        raise ArchError(f"unknown arch {name!r}; valid: {', '.join(ARCHES)}") from None


def target_archs(names) -> list:
    """The targets named (default: all of TARGETS), or an ArchError that names only TARGETS: an arch ptxgen knows
    but builds no kernels for (sm_80, kept for the runtime's DSL builds) is refused rather than answered with an
    empty manifest. Every command that takes --arch checks it here (ptxgen emit / check, python -m ptxgen.emu)."""
    archs = []
    for n in dict.fromkeys(names or TARGETS):
        if n not in TARGETS and n in ARCHES:
            raise ArchError(f"no kernels are built for {n} (its GPUs are not supported); targets: {', '.join(TARGETS)}")
        if n not in TARGETS:
            raise ArchError(f"unknown arch {n!r}; valid: {', '.join(TARGETS)}")
        archs.append(get_arch(n))
    return archs


def device_target(arch: Arch, device_sm: int) -> str:
    """The `-arch=` nvJitLink should compile `arch`'s PTX for on a device of compute capability `device_sm`.

    Plain targets (sm_89) are forward compatible: their PTX compiles for any newer device. A-suffixed
    targets run only on their own arch.
    """
    if arch.suffix == "a":
        if device_sm != arch.sm:
            raise ArchError(f"{arch.name} PTX runs only on sm_{arch.sm} devices, this one is sm_{device_sm}")
        return arch.name
    if device_sm < arch.sm:
        raise ArchError(f"{arch.name} PTX needs a device of sm_{arch.sm} or newer, this one is sm_{device_sm}")
    return f"sm_{device_sm}"

"""L1: the Arch feature table against nvJitLink: every probe compiles exactly where the table claims."""
import pytest

from ptxgen.arch import ARCHES, FEATURES, ArchError, device_target, get_arch
from ptxgen.probes import PROBES, probe_ptx
from ptxgen.runtime.compiler import CompileError, compile_ptx


def test_every_feature_has_a_probe():
    assert set(PROBES) == set(FEATURES)


@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("arch", list(ARCHES))
def test_feature_table_matches_nvjitlink(arch, feature):
    a = ARCHES[arch]
    try:
        compile_ptx(probe_ptx(a, feature), a.name, name=f"probe_{feature}")
        compiled = True
    except CompileError:
        compiled = False
    assert compiled == a.has(feature), f"{arch} {'compiles' if compiled else 'rejects'} {feature}, table says {a.has(feature)}"


def test_arch_values():
    a = get_arch("sm_90a")
    assert (a.major, a.minor, a.suffix, a.sm) == (9, 0, "a", 90)
    assert a.has_wgmma and a.has_tma and a.has_setmaxnreg
    assert not get_arch("sm_120a").has_wgmma and get_arch("sm_120a").has_tma
    assert not get_arch("sm_89").has_tma and get_arch("sm_89").has_cp_async
    assert all(x.ptx_version <= (8, 7) for x in ARCHES.values())
    with pytest.raises(ArchError, match="valid: sm_80, sm_89, sm_90a, sm_120a"):
        get_arch("sm_75")


def test_device_target():
    assert device_target(get_arch("sm_89"), 90) == "sm_90"
    assert device_target(get_arch("sm_90a"), 90) == "sm_90a"
    with pytest.raises(ArchError, match="runs only on sm_90"):
        device_target(get_arch("sm_90a"), 120)
    with pytest.raises(ArchError, match="needs a device of sm_89 or newer"):
        device_target(get_arch("sm_89"), 80)


def test_a_gemm_spec_for_a_format_its_lowering_does_not_decode_is_refused():
    """The int8 x Q8_1 GEMM decodes Q4_K's ring only (the fp16 mma.sync one Q4_K's ring or any codec's run8; TQ4_1S
    there on the rotated activation the runtime passes); the wgmma build has register-A decodes for Q4_K,
    Q5_K, Q6_K, Q8_0 and TQ4_1S, converting builds for Q4_K, Q5_K and Q8_0: a spec naming another format there is a
    ValueError, never Q4_K's code under the other format's name."""
    from ptxgen.kernels import mmq
    from ptxgen.specs import MmqSpec

    for spec in (MmqSpec(64, act="q8_1", fmt="tq4_1s"), MmqSpec(32, act="q8_1", fmt="q5_K"),
                 MmqSpec(64, "wgmma", fmt="q6_K"), MmqSpec(64, "wgmma", a_regs=True, convert=True, fmt="q6_K"),
                 MmqSpec(64, "wgmma", a_regs=True, convert=True, fmt="tq4_1s")):
        arch = "sm_90a" if spec.mma == "wgmma" else "sm_89"
        with pytest.raises(ValueError, match=spec.name):
            mmq.build(get_arch(arch), spec)

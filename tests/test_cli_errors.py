"""The commands' answers to a user's mistakes: one line on stderr naming it, exit 2, no traceback (exit 1 stays "a
check failed"). CPU only: nothing here compiles more than two small kernels."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from ptxgen import cli
from ptxgen.arch import TARGETS
from ptxgen.cli import main
from ptxgen.emu.__main__ import main as emu_main
from ptxgen.kernels import KERNELS


def _exit2(capsys, argv, fn=main) -> str:
    """Run a command that must refuse its input; its one-line stderr."""
    with pytest.raises(SystemExit) as e:
        fn(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _emu2(capsys, *argv) -> str:
    assert emu_main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m ptxgen.emu: "), err
    return err


# 1. an output folder that cannot be made


def test_emit_into_a_file_or_an_unwritable_place_names_it(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    err = _exit2(capsys, ["emit", "--arch", "sm_89", "--kernel", "gemv_q4_k_t1", "-o", str(f)])
    assert err.startswith(f"ptxgen emit: cannot write to {f}: ") and "not a folder" in err
    err = _exit2(capsys, ["emit", "--kernel", "gemv_q4_k_t1", "-o", str(f)])  # several arches: f/<arch>
    assert f"cannot write to {f}/sm_89" in err and f"{f} is not a folder" in err
    if Path("/proc").is_dir():
        err = _exit2(capsys, ["emit", "--arch", "sm_89", "--kernel", "gemv_q4_k_t1", "-o", "/proc/x"])
        assert err.startswith("ptxgen emit: cannot write to /proc/x: ")


def test_check_sass_into_a_file_is_refused_before_compiling(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    err = _exit2(capsys, ["check", "--arch", "sm_89", "--kernel", "gemv_q4_k_t1", "--sass", str(f)])
    assert err.startswith(f"ptxgen check: cannot write to {f}: ") and "not a folder" in err


# 2. the default output folder and the benchmarks outside a source checkout


def test_default_output_is_the_checkouts_emitted_else_the_current_folder(capsys, tmp_path, monkeypatch):
    assert cli.source_checkout() == REPO and cli.default_output() == REPO / "emitted"
    monkeypatch.setattr(cli, "source_checkout", lambda: None)  # as from site-packages
    monkeypatch.chdir(tmp_path)
    assert main(["emit", "--arch", "sm_89", "--kernel", "gemv_q4_k_t1"]) == 0
    assert capsys.readouterr().out.strip() == "sm_89: 1 kernel → emitted/sm_89"
    assert sorted(p.name for p in (tmp_path / "emitted" / "sm_89").iterdir()) == ["gemv_q4_k_t1.ptx", "manifest.json"]


def test_emit_help_says_where_the_default_output_goes(capsys):
    with pytest.raises(SystemExit):
        main(["emit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "source checkout" in out and "./emitted/<arch>/" in out


def test_bench_lists_the_benchmarks_or_says_they_need_a_checkout(capsys, monkeypatch):
    err = _exit2(capsys, ["bench", "nope"])
    listed = err.split("available: ")[1].strip().split(", ")
    assert "gemv" in listed and "mmq" in listed
    monkeypatch.setattr(cli, "source_checkout", lambda: None)
    err = _exit2(capsys, ["bench", "gemv"])
    assert err.startswith("ptxgen bench: ") and "source checkout" in err


# 3. --early-landing is gone (a seed always lands some copies early)


def test_emulator_has_no_early_landing_flag(capsys):
    with pytest.raises(SystemExit) as e:
        emu_main(["quantize_q8_1", "--early-landing"])
    assert e.value.code == 2 and "unrecognized arguments: --early-landing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        emu_main(["--help"])
    assert "early-landing" not in capsys.readouterr().out


# 4. --shape


@pytest.mark.parametrize("shape", [["0", "256"], ["-5", "256"], ["4", "0"]])
def test_emulator_refuses_a_shape_that_is_not_positive(capsys, shape):
    err = _emu2(capsys, "gemv_q4_k_t1", "--shape", *shape)
    assert f"--shape {' '.join(shape)}: each size must be a positive integer" in err


def test_emulator_names_shape_for_the_harness_limits(capsys):
    err = _emu2(capsys, "gemv_q4_k_t1", "--shape", "4", "100")
    assert "--shape 4 100: " in err and "multiple of the block size 256" in err
    err = _emu2(capsys, "gemv_q4_k_t1", "--shape", "4", "256", "3")
    assert "--shape 4 256 3: " in err and "2 numbers" in err


def test_emulator_zero_shape_warns_nothing_in_a_fresh_process():
    p = subprocess.run([sys.executable, "-m", "ptxgen.emu", "gemv_q4_k_t1", "--shape", "0", "256"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and p.stdout == "" and "Warning" not in p.stderr and "--shape" in p.stderr


# 5. sm_80: known to the runtime's DSL builds, refused by every command


def test_sm80_is_refused_alike_by_emit_check_and_the_emulator(capsys):
    emit = _exit2(capsys, ["emit", "--arch", "sm_80"])
    check = _exit2(capsys, ["check", "--arch", "sm_80"])
    emu = _emu2(capsys, "gemv_q4_k_t1", "--arch", "sm_80")
    why = "no kernels are built for sm_80 (its GPUs are not supported); targets: sm_89, sm_90a, sm_120a"
    assert why in emit and why in check and why in emu


def test_sm80_is_not_listed_as_valid(capsys):
    for fn, argv in ((main, ["emit", "--arch", "sm_70"]), (main, ["check", "--arch", "sm_70"])):
        err = _exit2(capsys, argv, fn)
        assert f"unknown arch 'sm_70'; valid: {', '.join(TARGETS)}" in err and "sm_80" not in err
    err = _emu2(capsys, "gemv_q4_k_t1", "--arch", "sm_70")
    assert f"valid: {', '.join(TARGETS)}" in err and "sm_80" not in err
    for cmd in ("emit", "check"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        assert "sm_80" not in capsys.readouterr().out


def test_sm80_stays_buildable_for_the_runtime():
    """runtime.kernels' source="dsl" builds for an Ampere device's candidate arch, sm_80."""
    assert ".target sm_80" in KERNELS["quantize_q8_1"].for_arch("sm_80").ptx()


# 6. --ptx: the arch is the file's, the entry must be the kernel's


def test_emulator_takes_the_arch_from_the_ptx_target(capsys):
    ptx = REPO / "emitted" / "sm_90a" / "quantize_q8_1.ptx"
    assert emu_main(["quantize_q8_1", "--ptx", str(ptx)]) == 0
    assert capsys.readouterr().out.startswith("quantize_q8_1 (sm_90a): OK")
    err = _emu2(capsys, "quantize_q8_1", "--ptx", str(ptx), "--arch", "sm_89")
    assert "--arch sm_89, but" in err and "built for sm_90a" in err


def test_emulator_refuses_another_kernels_ptx(capsys):
    err = _emu2(capsys, "quantize_q8_1", "--ptx", str(REPO / "emitted" / "sm_89" / "dequantize_q4_k.ptx"))
    assert "the file's entry is dequantize_q4_k, not quantize_q8_1" in err


# 7. an unknown kernel: the close names, not all of them


def test_unknown_kernel_names_the_closest_few(capsys):
    err = _exit2(capsys, ["emit", "--kernel", "gemv_q4k_t1"])
    assert "unknown kernel 'gemv_q4k_t1'; did you mean gemv_q4_k_t1," in err and "`ptxgen list --all`" in err
    assert len(err) < 300
    err = _exit2(capsys, ["check", "--kernel", "zzz"])
    assert "unknown kernel 'zzz'; `ptxgen list --all`" in err
    err = _emu2(capsys, "gemv_q4k_t1")
    assert "no emulator harness for 'gemv_q4k_t1'; did you mean gemv_q4_k_t1," in err and len(err) < 300


# 8. the manifest: one arch per folder, one entry per kernel


def test_emit_refuses_a_folder_of_another_arch(capsys, tmp_path):
    assert main(["emit", "--arch", "sm_90a", "--kernel", "gemv_q4_k_t1", "-o", str(tmp_path), "-q"]) == 0
    before = (tmp_path / "manifest.json").read_text()
    err = _exit2(capsys, ["emit", "--arch", "sm_89", "--kernel", "quantize_q8_1", "-o", str(tmp_path)])
    assert f"{tmp_path} holds sm_90a's kernels" in err and "emit sm_89 into another folder" in err
    assert (tmp_path / "manifest.json").read_text() == before and not (tmp_path / "quantize_q8_1.ptx").exists()
    (tmp_path / "manifest.json").write_text("{}")
    err = _exit2(capsys, ["emit", "--arch", "sm_90a", "--kernel", "gemv_q4_k_t1", "-o", str(tmp_path)])
    assert "is not a ptxgen manifest" in err


def test_emit_of_one_kernel_per_arch_keeps_each_arch_manifest(tmp_path):
    """Several arches into one -o: a sub-folder each, and a second --kernel merges into each arch's own manifest."""
    for k in ("gemv_q4_k_t1", "quantize_q8_1"):
        assert main(["emit", "--arch", "sm_89", "--arch", "sm_90a", "--kernel", k, "-o", str(tmp_path), "-q"]) == 0
    for arch in ("sm_89", "sm_90a"):
        m = json.loads((tmp_path / arch / "manifest.json").read_text())
        assert m["arch"] == arch and [e["kernel"] for e in m["kernels"]] == ["gemv_q4_k_t1", "quantize_q8_1"]
        assert all(f".target {arch}" in (tmp_path / arch / f"{e['kernel']}.ptx").read_text() for e in m["kernels"])


def test_a_kernel_or_arch_named_twice_is_emitted_once(capsys, tmp_path):
    argv = ["emit", "--arch", "sm_89", "--arch", "sm_89", "--kernel", "gemv_q4_k_t1", "--kernel", "gemv_q4_k_t1"]
    assert main([*argv, "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"sm_89: 1 kernel → {tmp_path}"
    assert [e["kernel"] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]] == ["gemv_q4_k_t1"]


# 9. check's help and table


def test_check_options_have_help(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"--arch ARCH one of {', '.join(TARGETS)}" in out and "--kernel KERNEL kernel name" in out


def test_check_table_columns_fit_the_longest_name(capsys):
    long = "gemv_q4_k_mma_t1_fused"
    assert len(long) > 20
    assert main(["check", "--arch", "sm_89", "--kernel", long, "--kernel", "quantize_q8_1"]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    col = head.index("arch")
    assert [r[:col].rstrip() for r in rows] == [long, "quantize_q8_1"]
    assert all(r[col:].startswith("sm_89 ") for r in rows)


def test_list_all_adds_the_unshipped_kernels_with_why(capsys):
    assert main(["list"]) == 0
    shipped = capsys.readouterr().out.splitlines()
    assert main(["list", "--all"]) == 0
    every = capsys.readouterr().out.splitlines()
    extra = [line for line in every if "[not shipped: " in line]
    assert extra and len(every) == len(shipped) + len(extra)
    assert len({line.index(" sm_") for line in every}) == 1  # one column for every name

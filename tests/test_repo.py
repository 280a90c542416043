"""L0: the repository keeps its promises: CI runs the README's commands."""
import re

from conftest import REPO


def readme_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("The two set-up commands", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in block.strip().splitlines()]


def test_ci_runs_the_readme_commands():
    cmds = readme_commands()
    assert len(cmds) == 2
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    for c in cmds:
        assert c in ci, f".ci/run does not run the README command {c!r}"


def test_the_readme_stays_a_readme():
    """The README is for users (what it is, set-up, quick start, API, support matrix, one performance table): under
    15,000 characters; the architecture is docs/design.md's, the measurements bench/NOTES.md's."""
    assert len((REPO / "README.md").read_text()) < 15000


def quick_start_blocks():
    """The README's quick start: (shell lines, the CPU Python block, the GPU Python block)."""
    text = (REPO / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    sh = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    py = re.findall(r"```python\n(.*?)```", text, re.S)
    return [ln for ln in sh.strip().splitlines()], py[0], py[1]


def test_quick_start_runs_as_written_without_a_gpu(tmp_path):
    """A newcomer copies the quick start line by line on a machine without a GPU: every line runs."""
    import subprocess
    import sys

    sh, cpu, _ = quick_start_blocks()
    for line in sh:
        cmd = line.split("  #")[0].replace("python ", f"{sys.executable} ", 1)
        p = subprocess.run(cmd, shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert p.returncode == 0, (line, p.stderr[-2000:])
    p = subprocess.run([sys.executable, "-c", cpu], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "tiny.gguf").exists()

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

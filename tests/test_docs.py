"""The docs (docs/, Sphinx with MyST Markdown and the PyData theme) build with no warning, their reference
pages hold every magic, command and setting the code has, and every shell example in them runs.

The examples' convention (docs/how-to/contributing.md says it for writers):

* a ```` ```console ```` block runs: its `$ ` lines are commands, run in order by one bash in a fresh
  folder holding a copy of `notebooks/`, with this environment's `owsandbox` first on the PATH; its other
  lines are output, each of which must appear, in order, in what the commands printed on stdout and
  stderr together (`...` skips);
* a ```` ```cell ```` block is a notebook cell: a page's cells run in order in one real kernel (no provider
  named: bubblewrap here, what a user gets), in such a folder, and each must end without an error;
* a ```` ```sh ````, ```` ```bash ```` or ```` ```shell ```` block is not run, so it must say why: a MyST
  comment `% not run: REASON` on the line above it (which also keeps a console or cell block from running).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHELL_LANGUAGES = {"console", "cell", "sh", "bash", "shell"}
NOT_RUN = re.compile(r"^% not run: (\S.*)$")
FENCE = re.compile(r"^```([\w{}-]*)\s*$")


@dataclass
class Example:
    page: str  # relative to docs/
    line: int  # of its opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason, when marked

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def examples(docs: Path = DOCS) -> list[Example]:
    """Every fenced shell block of every page, in page order."""
    found = []
    for path in sorted(docs.rglob("*.md")):
        if "_build" in path.parts:
            continue
        lines = path.read_text(encoding="utf-8").split("\n")
        index = 0
        while index < len(lines):
            opening = FENCE.match(lines[index])
            if opening is None:
                index += 1
                continue
            end = next((j for j in range(index + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert end is not None, f"{path.relative_to(docs)}:{index + 1}: a fence that never closes"
            language = opening.group(1)
            if language in SHELL_LANGUAGES:
                marked = NOT_RUN.match(lines[index - 1]) if index else None
                found.append(Example(str(path.relative_to(docs)), index + 1, language,
                                     "\n".join(lines[index + 1:end]), marked.group(1) if marked else None))
            index = end + 1
    return found


def runnable(language: str) -> list[Example]:
    return [example for example in examples() if example.language == language and example.not_run is None]


def commands_and_output(example: Example) -> tuple[list[str], list[str]]:
    commands = [line[2:] for line in example.text.split("\n") if line.startswith("$ ")]
    output = [line for line in example.text.split("\n") if line.strip() and not line.startswith("$ ")]
    return commands, output


def a_fresh_folder(parent: Path) -> Path:
    folder = parent / "example"
    shutil.copytree(ROOT / "notebooks", folder / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    return folder


# -- the convention holds ------------------------------------------------------------------------


@pytest.mark.unit
def test_every_shell_example_runs_or_says_why_not() -> None:
    found = examples()
    assert len([e for e in found if e.not_run is None]) >= 10, "the docs should run examples"
    unmarked = [e.name for e in found if e.language in ("sh", "bash", "shell") and e.not_run is None]
    assert not unmarked, f"shell blocks neither run (console, cell) nor marked `% not run: REASON`: {unmarked}"
    for example in found:
        if example.language == "console" and example.not_run is None:
            commands, _ = commands_and_output(example)
            assert commands, f"{example.name}: a console block with no `$ ` command"


@pytest.mark.unit
def test_the_examples_parser_finds_marks_and_languages(tmp_path: Path) -> None:
    """The parser against a page made for it: what runs, what is marked and why, what is not an example."""
    (tmp_path / "page.md").write_text("# A page\n\n```console\n$ echo hi\nhi\n```\n\n% not run: needs podman\n"
                                      "```sh\npodman ps\n```\n\n```python\nprint(1)\n```\n\n```cell\n%sandbox\n```\n")
    found = examples(tmp_path)
    assert [(e.language, e.line, e.not_run) for e in found] == [("console", 3, None), ("sh", 9, "needs podman"),
                                                                ("cell", 17, None)]
    assert commands_and_output(found[0]) == (["echo hi"], ["hi"])


# -- the build -------------------------------------------------------------------------------------


def build(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-d",
                           str(out / "doctrees"), str(DOCS), str(out / "html")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("docs")
    started = time.monotonic()
    done = build(out)
    print(f"sphinx-build took {time.monotonic() - started:.1f} s")
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stdout[-3000:] + done.stderr[-5000:]
    return out / "html"


@pytest.mark.system
def test_the_docs_build_with_warnings_as_errors(built: Path) -> None:
    for page in ("index", "tutorial/getting-started", "how-to/operators", "reference/magics",
                 "explanation/threat-model", "explanation/protocols"):
        assert (built / f"{page}.html").is_file(), page


@pytest.mark.system
def test_the_reference_holds_every_magic_command_and_setting_of_the_code(built: Path) -> None:
    """What the code's own tables hold is in the pages: a magic, a command or a setting that the reference
    lacked would have to be missing from the table the program itself uses."""
    import html

    from owsandbox import cli
    from owsandbox.kernel.magics.table import all_magics

    magics = html.unescape((built / "reference" / "magics.html").read_text())
    for magic in all_magics().values():
        assert f'id="magic-{magic.kind}-{magic.name}"' in magics and magic.parser.format_usage().split()[1] in magics
    commands = html.unescape((built / "reference" / "cli.html").read_text())
    for spelled, meaning in cli.COMMANDS:
        assert f"owsandbox {spelled}" in commands and meaning[1:] in commands
    listed = subprocess.run([sys.executable, "-m", "owsandbox.cli", "settings"], capture_output=True, text=True,
                            timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("OWSANDBOX_")})
    names = re.findall(r"^(OWSANDBOX_\w+)=", listed.stdout, re.M)
    assert len(names) > 20, listed.stdout
    settings_page = html.unescape((built / "reference" / "settings.html").read_text())
    for name in names:
        assert f'id="{name.lower().replace("_", "-")}"' in settings_page, name


# -- the examples run --------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("example", runnable("console"), ids=lambda e: e.name)
def test_a_console_example_runs_and_prints_what_it_shows(example: Example, tmp_path: Path) -> None:
    from .conftest import require_bwrap

    require_bwrap()
    commands, output = commands_and_output(example)
    folder = a_fresh_folder(tmp_path)
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    env = {k: v for k, v in env.items() if not k.startswith("OWSANDBOX_")}  # as a reader's shell has it
    script = "set -e\n" + "\n".join(commands) + "\n"
    done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=90)  # as a terminal shows both
    printed = done.stdout
    assert done.returncode == 0, f"{example.name}: exit {done.returncode}\n{printed[-3000:]}"
    at = 0
    for line in output:
        if line.strip() == "...":
            continue
        found = printed.find(line.rstrip(), at)
        assert found >= 0, f"{example.name}: {line!r} not printed (after offset {at}):\n{printed[-3000:]}"
        at = found + len(line.rstrip())


CELL_PAGES = sorted({example.page for example in runnable("cell")})


@pytest.mark.system
@pytest.mark.parametrize("page", CELL_PAGES)
def test_a_pages_cells_run_in_a_real_kernel(page: str, tmp_path: Path) -> None:
    from .conftest import DEFAULT_KERNEL_NAME, kernel_in, require_bwrap

    require_bwrap()
    folder = a_fresh_folder(tmp_path)
    with kernel_in(folder, kernel_name=DEFAULT_KERNEL_NAME) as kernel:
        for example in (e for e in runnable("cell") if e.page == page):
            ran = kernel.run(example.text, timeout=60)
            errors = ran.of_type("error")
            assert ran.status == "ok" and not errors, f"{example.name}: {errors or ran.reply['content']}"

"""The README and docs/ say what is true: their examples run as written, and the README is a short page.

Every fenced block tagged `bash` or `python` in README.md and docs/*.md runs, unless the line just before its
fence is a `<!-- no-test: why -->` marker (docs/testing.md documents the convention). Shell blocks run the CLI
on tiny shapes and the traces in tests/data; Python blocks run gradio_client against the session's live app,
whose address is the one thing substituted, through the `ATTENTION_PROFILER_URL` variable the examples read.
docs/agents.md runs in tests/test_agents_doc.py, against a server of its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.timing_slack import slack

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Run by its own test against a server whose MCP tools are named as on a Space.
ELSEWHERE = {"agents.md"}
MAX_README_LINES = 200
# The blocks that cannot run in a test: installs, a server that never returns, a minutes-long benchmark.
MAX_SKIPPED = 5
URL_VARIABLE = "ATTENTION_PROFILER_URL"
RUNNABLE = {"bash", "python"}
LANGUAGES = RUNNABLE | {"text"}

FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!-- no-test: (?P<why>\S.*\S) -->$")
# Inline links and images: [text](target) and ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its language tag, its code, and why it is skipped (None: it runs)."""

    path: Path
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Page:
    """A Markdown page's fenced blocks, and the markers that precede no block (each one a mistake)."""

    blocks: tuple[Block, ...]
    stray_markers: tuple[int, ...]


def pages() -> list[Path]:
    """README.md and every docs/*.md whose examples this file runs."""
    return [README, *(p for p in sorted(DOCS.glob("*.md")) if p.name not in ELSEWHERE)]


def parse(path: Path) -> Page:
    """Split a Markdown file into its fenced blocks, reading each block's `no-test` marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    stray: list[int] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            if MARKER.match(lines[i]) and not (i + 1 < len(lines) and FENCE.match(lines[i + 1])):
                stray.append(i + 1)
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: a fence that never closes"
        marker = MARKER.match(lines[i - 1]) if i else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(path, i + 1, opening.group(1), code, marker.group("why") if marker else None))
        i = end + 1
    return Page(tuple(blocks), tuple(stray))


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in parse(path).blocks]


def runnable(lang: str) -> list[Block]:
    return [b for b in all_blocks() if b.lang == lang and b.skip is None]


def scratch(tmp_path: Path) -> Path:
    """A working folder that sees the repository's test data as the README's commands name it."""
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    return tmp_path


def environment(**extra: str) -> dict[str, str]:
    """The test's environment (the injected calibration, the short timing budget), with the repository
    importable and `python` being this interpreter."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run(args: list[str], cwd: Path, env: dict[str, str], block: Block) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=slack(900))
    assert done.returncode == 0, f"{block.id} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, f"{block.id}:\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), f"{block.id} printed nothing"
    return done


# --- the pages themselves -------------------------------------------------------------------------------


def test_readme_is_a_short_page_that_links_every_doc():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, more than {MAX_README_LINES}"
    targets = set(LINK.findall(README.read_text(encoding="utf-8")))
    docs = sorted(p.name for p in DOCS.glob("*.md"))
    assert docs, "docs/ holds no page"
    missing = [name for name in docs if f"docs/{name}" not in targets]
    assert not missing, f"README.md does not link {missing}"
    assert "docs/screenshot.png" in targets


@pytest.mark.parametrize("path", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_resolves(path: Path):
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{path.name} links to files that do not exist: {broken}"


def test_readme_gives_no_fixed_port_or_missing_file_to_clients():
    """The client example reads its URL from the environment and uploads a file the repository holds."""
    python = [b.code for b in parse(README).blocks if b.lang == "python"]
    assert python, "README.md has no Python example"
    for code in python:
        assert f'os.environ.get("{URL_VARIABLE}"' in code
        assert ":7860" not in code.replace(f'os.environ.get("{URL_VARIABLE}", "http://127.0.0.1:7860/")', "")
        for name in re.findall(r'handle_file\("([^"]+)"\)', code):
            assert (ROOT / name).is_file(), f"README.md uploads {name}, which the repository does not hold"


def test_no_sentence_about_the_makers():
    """The README says what the app does, not which machines or sessions made it."""
    text = README.read_text(encoding="utf-8").lower()
    for phrase in ("this project's", "our machine", "session of the project", "helper agent", "were lent", "red team"):
        assert phrase not in text, f"README.md says {phrase!r}"


def test_every_block_is_tagged_and_at_most_a_few_are_skipped():
    parsed = {path: parse(path) for path in pages()}
    stray = [f"{p.name}:{line}" for p, page in parsed.items() for line in page.stray_markers]
    assert not stray, f"no-test markers that precede no block: {stray}"
    blocks = [b for page in parsed.values() for b in page.blocks]
    untagged = [b.id for b in blocks if b.lang not in LANGUAGES]
    assert not untagged, f"blocks without a bash, python or text tag: {untagged}"
    skipped = [b.id for b in blocks if b.skip is not None]
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} blocks skipped: {skipped}"
    assert all(b.lang in RUNNABLE for b in blocks if b.skip is not None), "a no-test marker on a text block"
    # The examples the README promises: the CLI and the client.
    assert any(b.path == README and b.lang == "bash" and b.skip is None for b in blocks)
    assert any(b.path == README and b.lang == "python" and b.skip is None for b in blocks)


def test_the_parser_reads_markers_and_fences(tmp_path: Path):
    """The block reader itself: a marked block is skipped with its reason, an unmarked one runs, a marker that
    precedes no block is reported, and a fence inside a `text` block is text."""
    page = tmp_path / "case.md"
    text = "\n".join(
        [
            "<!-- no-test: needs the network -->",
            "```bash",
            "pip install x",
            "```",
            "<!-- no-test: stray -->",
            "",
            "```python",
            "print(1)",
            "```",
            "```text",
            "<!-- no-test: shown, not a marker -->",
            "```",
        ]
    )
    page.write_text(text, encoding="utf-8")
    found = parse(page)
    assert [(b.lang, b.skip, b.code) for b in found.blocks] == [
        ("bash", "needs the network", "pip install x\n"),
        ("python", None, "print(1)\n"),
        ("text", None, "<!-- no-test: shown, not a marker -->\n"),
    ]
    assert found.stray_markers == (5,)


def test_ci_runs_the_readmes_first_test_command():
    """.ci/run greps the first README line starting `pip install -r requirements-dev.txt`: it must be the
    whole test command."""
    lines = README.read_text(encoding="utf-8").splitlines()
    first = next(line for line in lines if line.startswith("pip install -r requirements-dev.txt"))
    assert first == "pip install -r requirements-dev.txt && python -m pytest"


# --- the examples run ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", runnable("bash"), ids=lambda b: b.id)
def test_shell_example_runs(block: Block, tmp_path: Path):
    run(["bash", "-euo", "pipefail", "-c", block.code], scratch(tmp_path), environment(), block)


@pytest.mark.parametrize("block", runnable("python"), ids=lambda b: b.id)
def test_python_example_runs(block: Block, tmp_path: Path, app_url: str):
    folder = scratch(tmp_path)
    script = folder / "example.py"
    script.write_text(block.code, encoding="utf-8")
    run([sys.executable, str(script)], folder, environment(**{URL_VARIABLE: app_url}), block)

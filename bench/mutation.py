"""Mutation testing of the trace analysis with mutmut 3: run it, then score each module.

mutmut's settings live in pyproject.toml (`[tool.mutmut]`): which modules it mutates
(`only_mutate`) and which fast unit tests it runs against each mutant
(`pytest_add_cli_args_test_selection`). mutmut writes a `mutants/` tree next to the sources,
so this script runs it in a scratch copy of the working tree, never in the checkout itself.

Usage (from the repository root):

    python bench/mutation.py run                    # copy the tree, mutmut run with 1 child, print the table
    python bench/mutation.py run --only 'profiling.occupancy*'   # just these mutants (mutmut's glob)
    python bench/mutation.py run --sample 55        # a seeded random 55 non-message mutants per module
    python bench/mutation.py run --sample 60 --modules intervals idle_time   # ... of these modules only
    python bench/mutation.py run --rerun-survivors  # after adding tests: rerun only the survivors
    python bench/mutation.py report                 # the table from the last run, nothing run
    python bench/mutation.py report --survivors     # ... and the diff of every surviving mutant
    python bench/mutation.py report --markdown      # the table as markdown

Options: `--workdir` (default /tmp/attention-profiler-mutation; kept between runs, so mutmut
only tests mutants of functions that changed), `--max-children` (default 1: the machine is shared),
`--modules` (module names, e.g. `gpu_metrics`: sample, rerun and report only these; with
`--sample` the sample of the other modules is kept, so runs of different modules add up).

The table counts, per module, the mutants mutmut made, killed, survived and timed out, and
the score: killed (timeouts count as killed) out of those tested, a mutant no selected test
reaches counting as a survivor. With `--sample`, only the sampled mutants are tested and scored
(the sample is kept in mutants/bench-sample.txt for `report`); those with a result from an earlier
run are not run again (mutmut drops the result of a function that changed), so `--sample 120`
after `--sample 60` tests the 60 it adds. A mutant whose only change
is to a message (text in an f-string, a `Finding`, an error, a docstring, or prose of four
words or more) is counted apart as a "message" mutant: a test that pins the wording of every
sentence would be brittle, so those are reported but kept out of the score that matters.
Not run in CI: with one child mutmut tests 1.1-1.7 mutants a second here (2 cores), so a full run
(about 5,200 mutants in 12 modules) takes over an hour; `--sample 120 --modules M` some 5 minutes
a module, plus 3-4 minutes of mutmut's stats and clean runs.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import random
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKDIR = Path("/tmp/attention-profiler-mutation")
# Calls whose string arguments are prose shown to people, not values the code computes with.
MESSAGE_CALLS = frozenset({"Finding", "Insight", "print", "warn", "TraceError", "RunError", "SpecError"})
EVIDENCE_CALLS = frozenset({"Finding", "Insight"})  # (title, detail, evidence): only the first two are prose
# mutmut leaves decorated functions alone; the scratch copy drops this cache (it only saves time)
# so that the kernel-name decoder is mutated too.
UNCACHED = {"profiling/kernels.py": "@functools.lru_cache(maxsize=4096)\n"}
PROSE_WORDS = 4  # a string literal of this many words or more is a sentence
COLUMNS = (
    *("mutants", "tested", "killed", "survived", "no tests", "timeout", "not run", "score %"),
    *("message", "msg killed", "msg score %"),
)


@dataclass
class Mutant:
    name: str
    module: str
    status: str
    message: bool
    line: int
    diff: str


def sync_tree(workdir: Path) -> None:
    """Copy the working tree's files (tracked, and untracked but not ignored) into `workdir`.

    Unchanged files are left alone, mtimes kept: mutmut compares them to reuse its results.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source, target = ROOT / name, workdir / name
        if not source.is_file():
            continue
        same = target.is_file() and target.stat().st_size == source.stat().st_size
        if name in UNCACHED:
            _copy_uncached(source, target, UNCACHED[name])
            continue
        if same and target.stat().st_mtime == source.stat().st_mtime:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _copy_uncached(source: Path, target: Path, decorator: str) -> None:
    """Copy `source` without `decorator`, rewriting the copy only when its text changes."""
    text = source.read_text().replace(decorator, "", 1)
    if not target.is_file() or target.read_text() != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def run_mutmut(workdir: Path, max_children: int, names: list[str]) -> int:
    """`mutmut run` in `workdir`; one OpenMP thread per test process, to stay polite on a shared machine."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    # The console script, not `python -m mutmut`: run as a module, mutmut's main module is imported twice.
    mutmut = shutil.which("mutmut", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [mutmut or "mutmut", "run", "--max-children", str(max_children), *names]
    return subprocess.run(command, cwd=workdir, env=env, check=False).returncode


def changed_strings(before: ast.AST, after: ast.AST, path: tuple[ast.AST, ...] = ()) -> list | None:
    """The (constant, ancestors) pairs where two trees differ, if they differ only in string constants."""
    if type(before) is not type(after):
        return None
    if isinstance(before, ast.Constant):
        if before.value == after.value:
            return []
        return [(before, path)] if isinstance(before.value, str) and isinstance(after.value, str) else None
    found: list = []
    for field, value in ast.iter_fields(before):
        other = getattr(after, field, None)
        pairs = zip(value, other, strict=True) if isinstance(value, list) else [(value, other)]
        if isinstance(value, list) and len(value) != len(other):
            return None
        for a, b in pairs:
            if isinstance(a, ast.AST) and isinstance(b, ast.AST):
                inner = changed_strings(a, b, (*path, before))
                if inner is None:
                    return None
                found += inner
            elif a != b:
                return None
    return found


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def is_message(constant: ast.Constant, ancestors: tuple[ast.AST, ...]) -> bool:
    """A string that is prose: text in an f-string, a Finding's title or detail, an error, a docstring, a sentence.

    The nearest enclosing construct decides: a key looked up (`x["key"]`, even inside an
    f-string) and a dict literal (a Finding's evidence) are data; a sentence elsewhere is prose.
    """
    for depth in range(len(ancestors) - 1, -1, -1):
        node = ancestors[depth]
        child = ancestors[depth + 1] if depth + 1 < len(ancestors) else constant
        if (isinstance(node, ast.Subscript) and child is node.slice) or isinstance(node, ast.Dict):
            return False
        if isinstance(node, (ast.JoinedStr, ast.Raise)):
            return True
        name = _call_name(node)
        if name in EVIDENCE_CALLS and child not in node.args[:2]:
            return False  # the evidence: numbers and names a client reads
        if name in MESSAGE_CALLS or name.endswith("Error"):
            return True
    if len(str(constant.value).split()) >= PROSE_WORDS:
        return True
    return bool(ancestors) and isinstance(ancestors[-1], ast.Expr)  # a docstring


def message_only(original: str, mutated: str) -> bool:
    try:
        changes = changed_strings(ast.parse(original), ast.parse(mutated))
    except SyntaxError:
        return False
    return bool(changes) and all(is_message(c, a) for c, a in changes)


def first_changed_line(original: str, mutated: str, source_file: Path, function: str) -> int:
    """The mutated line's number in the source file (the function's def line plus the offset)."""
    a, b = original.splitlines(), mutated.splitlines()
    offset = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lines = source_file.read_text().splitlines()
    short = function.rpartition(".")[2]
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {short}(")), 0)
    body = next((i for i, line in enumerate(a) if line.lstrip().startswith("def ")), 0)
    return start + 1 + offset - body


def load_mutants(workdir: Path) -> list[Mutant]:
    """Every mutant mutmut made in `workdir`, with its status and whether it only changes a message."""
    os.chdir(workdir)  # mutmut reads its config and mutants/ relative to the working directory
    sys.path.insert(0, str(workdir))
    import libcst as cst
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import read_functions_from_index
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    out = []
    for path in sorted(walk_mutatable_files()):
        data = SourceFileMutationData(path=path)
        data.load()
        for name, code in sorted(data.exit_code_by_key.items()):
            functions = read_functions_from_index(name, path)
            if functions is None:
                raise SystemExit(f"mutmut's index is missing {name}: rerun `mutmut run`")
            original, mutated = (cst.Module([f]).code for f in functions)
            function, _ = orig_function_and_class_names_from_key(name)
            diff = "\n".join(difflib.unified_diff(original.splitlines(), mutated.splitlines(), lineterm="", n=1))
            status = status_by_exit_code[code]
            line = first_changed_line(original, mutated, path, function)
            out.append(Mutant(name, path.stem, status, message_only(original, mutated), line, diff))
    return out


def score_table(
    mutants: list[Mutant], sample: set[str] | None = None, modules: list[str] | None = None
) -> list[tuple[str, list]]:
    """Per module (all, or those in `modules`): the non-message mutants (all, or those in `sample`) by status,
    their score; the message ones. The `all` row sums the modules shown."""
    rows: list[tuple[str, list]] = []
    by_module: dict[str, list[Mutant]] = defaultdict(list)
    mutants = [m for m in mutants if not modules or m.module in modules]
    for m in mutants:
        by_module[m.module].append(m)
    for module in [*sorted(by_module), "all"]:
        group = mutants if module == "all" else by_module[module]
        logic = [m for m in group if not m.message]
        tested = Counter(m.status for m in logic if sample is None or m.name in sample)
        messages = Counter(m.status for m in group if m.message)
        rows.append((module, [len(logic), *_counts(tested), *_message_counts(messages)]))
    return rows


def _counts(c: Counter) -> list:
    """Tested, killed, survived, no tests, timeout, not run, score. No test at all is a survivor too."""
    killed, survived, untested, timeout = c["killed"], c["survived"], c["no tests"], c["timeout"]
    other = sum(c.values()) - killed - survived - untested - timeout
    score = _percent(killed + timeout, killed + survived + untested + timeout)
    return [sum(c.values()) - other, killed, survived, untested, timeout, other, score]


def _message_counts(c: Counter) -> list:
    tested = c["killed"] + c["survived"] + c["timeout"]
    return [sum(c.values()), c["killed"] + c["timeout"], _percent(c["killed"] + c["timeout"], tested)]


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}" if whole else "-"


def render(rows: list[tuple[str, list]], markdown: bool) -> str:
    header = ["module", *COLUMNS]
    lines = [[module, *map(str, values)] for module, values in rows]
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(COLUMNS)) + "|"]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["run", "report"])
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=[], help="mutant names or globs for `mutmut run`")
    parser.add_argument("--sample", type=int, default=0, help="test this many non-message mutants per module")
    parser.add_argument("--seed", type=int, default=0, help="of the sample")
    parser.add_argument("--rerun-survivors", action="store_true", help="run again every mutant that survived")
    parser.add_argument("--survivors", action="store_true", help="print the diff of each survivor")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--modules", nargs="*", default=[], help="module names (e.g. gpu_metrics); default all")
    args = parser.parse_args(argv)
    workdir = args.workdir.resolve()
    if args.command == "run":
        code = _run(workdir, args)
        if code:
            return code
    mutants = load_mutants(workdir)
    sample = _read_sample(workdir)
    print(render(score_table(mutants, sample, args.modules), args.markdown))
    if args.survivors:
        for m in mutants:
            if m.status == "survived" and (sample is None or m.name in sample) and _in(m.module, args.modules):
                kind = "message" if m.message else "logic"
                print(f"\n## {m.name} ({m.module}.py:{m.line}, {kind})\n{m.diff}")
    return 0


def _run(workdir: Path, args: argparse.Namespace) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    sync_tree(workdir)
    names = list(args.only)
    if not (args.sample or args.rerun_survivors or names):
        (workdir / SAMPLE_FILE).unlink(missing_ok=True)  # a full run: every mutant is scored
    if args.sample:
        generate(workdir)
        mutants = load_mutants(workdir)
        sampled = _write_sample(workdir, mutants, args.sample, args.seed, args.modules)
        # As mutmut does unasked: a result stands until its function changes (mutmut then forgets it), so
        # a larger sample tests only what it adds. After new tests, --rerun-survivors.
        done = {m.name for m in mutants if m.status != "not checked"}
        names += [name for name in sampled if name not in done]
        if not names:
            print("every sampled mutant has a result: see `report`, or --rerun-survivors after new tests")
            return 0
    if args.rerun_survivors:
        sample = _read_sample(workdir)
        survivors = _survivors(workdir)
        names += [m.name for m in survivors if (sample is None or m.name in sample) and _in(m.module, args.modules)]
        if not names:
            print("no survivors to rerun")
            return 0
    if args.modules and not names:  # no names would make mutmut test every module's mutants
        print("no mutants of these modules to run: give --sample, --rerun-survivors or --only")
        return 2
    return run_mutmut(workdir, args.max_children, names)


def _in(module: str, modules: list[str]) -> bool:
    return not modules or module in modules


def generate(workdir: Path) -> None:
    """Make (or refresh) the mutants in `workdir` without testing any, so that a sample can be drawn."""
    script = (
        "import os; os.makedirs('mutants', exist_ok=True)\n"
        "from mutmut.__main__ import copy_also_copy_files, copy_src_dir, create_mutants, setup_source_paths\n"
        "copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(1)\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=workdir, check=True, capture_output=True)


SAMPLE_FILE = "mutants/bench-sample.txt"


def _write_sample(
    workdir: Path, mutants: list[Mutant], per_module: int, seed: int, modules: list[str] | None = None
) -> list[str]:
    """A seeded random sample of each module's non-message mutants (of `modules` only, where given), remembered
    for `report`; the names to run. The sample of modules left out is kept from the last sample, if any."""
    by_module: dict[str, list[str]] = defaultdict(list)
    for m in mutants:
        if not m.message and _in(m.module, modules or []):
            by_module[m.module].append(m.name)
    chosen = []
    for names in by_module.values():
        random.Random(seed).shuffle(names)  # a larger sample extends a smaller one with the same seed
        chosen += names[:per_module]
    kept: set[str] = set()
    if modules:
        module_of = {m.name: m.module for m in mutants}
        kept = {n for n in _read_sample(workdir) or set() if module_of.get(n) not in modules}
    (workdir / SAMPLE_FILE).write_text("\n".join(sorted(kept.union(chosen))) + "\n")
    return sorted(chosen)


def _read_sample(workdir: Path) -> set[str] | None:
    path = workdir / SAMPLE_FILE
    return set(path.read_text().split()) if path.is_file() else None


def _survivors(workdir: Path) -> list[Mutant]:
    """The survivors of the last run (read in `workdir`, then back to where we were)."""
    here = Path.cwd()
    try:
        return [m for m in load_mutants(workdir) if m.status == "survived"]
    finally:
        os.chdir(here)


if __name__ == "__main__":
    raise SystemExit(main())

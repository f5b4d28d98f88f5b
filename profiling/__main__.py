"""`python -m profiling {run,compare,sweep,analyze,diff,view,job}`: the blog's scripts, headless.

Needs only torch and pandas (no gradio, no plotly), so it runs on a bare GPU image.
Exit status: 0 done, 2 bad input (a message naming the field), 1 a run that started and failed.
What torch writes to stderr while it profiles (Kineto's `USDT` lines, c10's warnings) goes to
`<trace-dir>/profiler.log`, whose path is printed when it is not empty.
Every string printed from a trace goes through `plain` first: a name carrying `ESC ] 0 ;` or
`ESC [ 2 J` would otherwise retitle, clear or recolour the user's terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attention import BACKENDS, DEVICES, DTYPES, MASKS, MODES, PRESETS, RUN_NAMES, VARIANTS, AttentionSpec, SpecError
from profiling import cli_job, cli_views
from profiling.progress import TerminalProgress
from profiling.terminal import plain, whole_number
from profiling.trace import TraceError

SHAPE_FIELDS = ("batch", "heads", "seq_len", "head_dim")
PRACTICE_FIELDS = ("mode", "kv_heads", "q_len", "mask", "window", "valid_len")
KERNEL_ROWS = 20  # kernels printed by `analyze` unless --top says otherwise
KERNEL_NAME_WIDTH = 70
LOG_NAME = "profiler.log"  # in the trace directory: what the profiling process wrote to stderr
DESCRIPTION = (
    "Profile attention with torch.profiler, or read any torch.profiler (Kineto) Chrome trace, headless.\n"
    "Exit status: 0 done, 2 bad input (the message names the field), 1 a run that started and failed."
)
RUN_EXAMPLE = (
    "python -m profiling run --variant naive --device cpu --batch 1 --heads 4 --seq-len 256 --head-dim 64 "
    "--trace-dir traces"
)
EPILOG = (
    "example: profile naive attention on the CPU (seconds); open the trace it writes in https://ui.perfetto.dev\n"
    f"  {RUN_EXAMPLE}\n"
    "then try --variant inplace (one copy fewer) or --variant sdpa --backend math; --json prints every key."
)
QUIET_KEYS = (
    *("insights", "findings", "per_forward_ops", "per_forward_kernels", "per_backward_kernels", "gpus"),
    *("forward_ms_stats", "backward_ms_stats"),  # 200 samples each: --json has them
)


class UsageError(ValueError):
    """Bad input outside the spec (a path): exit 2, with the field named."""


def add_shape_args(parser: argparse.ArgumentParser, preset: str = "cpu-small", device: str = "auto") -> None:
    """The shape, dtype and device flags, defaulting to one of `attention.PRESETS`."""
    defaults = PRESETS[preset]
    for name in SHAPE_FIELDS:
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=defaults[name], help="default: %(default)s"
        )
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=defaults["dtype"], help="default: %(default)s")
    parser.add_argument("--device", choices=DEVICES, default=device, help="default: %(default)s")


def add_practice_args(parser: argparse.ArgumentParser) -> None:
    """Training, GQA, decode and mask flags; their defaults reproduce the blog's runs."""
    parser.add_argument("--mode", choices=MODES, default="inference", help="training adds the backward pass")
    parser.add_argument("--kv-heads", type=int, default=0, help="key/value heads (GQA); 0 means --heads")
    parser.add_argument("--q-len", type=int, default=0, help="queries per call; 0 means --seq-len; 1 is decode")
    parser.add_argument("--mask", choices=MASKS, default="causal", help="causal is bottom-right aligned")
    parser.add_argument("--window", type=int, default=0, help="keys each query sees, for --mask sliding_window")
    parser.add_argument("--valid-len", default="", help="for --mask padding: one length, or a comma list per row")


def _run_args(parser: argparse.ArgumentParser) -> None:
    add_shape_args(parser)
    add_practice_args(parser)
    parser.add_argument("--compile", action="store_true", help="wrap the attention in torch.compile")
    parser.add_argument("--trace-dir", default=None, help="where traces go (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m profiling", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Formatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="profile one variant", epilog=EPILOG, formatter_class=_Formatter)
    run.add_argument("--variant", choices=tuple(VARIANTS), default="naive")
    run.add_argument("--backend", choices=BACKENDS, default="auto")
    _run_args(run)
    _run_args(sub.add_parser("compare", help="profile every variant/backend on one shape"))
    sweep = sub.add_parser("sweep", help="profile variants over seq_len values")
    _run_args(sweep)
    sweep.add_argument(
        "--variants", default="naive,sdpa-math,sdpa-flash", help=f"comma list of: {', '.join(RUN_NAMES)}"
    )
    sweep.add_argument("--seq-lens", default="128,256,512,1024", help="comma list of seq_len values")
    analyze = sub.add_parser("analyze", help="analyze a Chrome trace (.json or .json.gz)")
    analyze.add_argument("trace")
    analyze.add_argument("--json", action="store_true", help="one JSON object: the summary, `kernels` and `ops`")
    analyze.add_argument("--top", type=whole_number, default=KERNEL_ROWS, help="kernels printed, most time first")
    diff = sub.add_parser("diff", help="what changed between two Chrome traces of one job (before, after)")
    diff.add_argument("before")
    diff.add_argument("after")
    diff.add_argument("--json", action="store_true", help="one JSON object: every row of the diff")
    diff.add_argument(
        "--top", type=whole_number, default=KERNEL_ROWS, help="ops and kernels printed, largest change first"
    )
    cli_views.add_parser(sub)
    cli_job.add_parser(sub)
    return parser


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """The description and the example keep their lines, so the command pastes whole."""


def spec_from_args(args: argparse.Namespace, **extra: Any) -> AttentionSpec:
    """The spec the shape flags describe (plus `extra` fields such as variant and backend)."""
    fields = (*SHAPE_FIELDS, "dtype", "device", "compile", *PRACTICE_FIELDS)
    return AttentionSpec(**{f: getattr(args, f) for f in fields if hasattr(args, f)}, **extra)


def trace_dir(args: argparse.Namespace) -> str:
    """`--trace-dir`, created and checked writable, or a fresh temporary folder."""
    if not args.trace_dir:
        return tempfile.mkdtemp(prefix="attention-profiler-")
    path = Path(args.trace_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(f"trace-dir: cannot write to {path} ({exc.strerror or exc})") from None
    return str(path)


def _plain(value: Any) -> Any:
    """`value` with every string in it (keys too, inside lists and dicts) made `plain`."""
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _plain_table(table: Any, **to_string: Any) -> str:
    """A DataFrame's `to_string`, its text cells, index and headers made `plain` first."""
    table = table.map(lambda v: plain(v) if isinstance(v, str) else v).rename(index=_plain, columns=_plain)
    return table.to_string(**to_string)


def _print(summary: Any, as_json: bool) -> None:
    summary = _plain(summary)
    if as_json:  # json escapes controls anyway; a reader that prints the decoded value gets them plain too
        print(json.dumps(summary, indent=2, default=lambda v: plain(str(v))))
        return
    for row in summary if isinstance(summary, list) else [summary]:
        _print_keys(row)
        for text in row.get("insights", []):
            print(f"  - {text}")
        print()


def _print_keys(row: dict[str, Any]) -> None:
    for key, value in row.items():
        if key not in QUIET_KEYS:
            print(plain(f"{key:>26}: {value}"))  # again: str() of an object the walk above left alone


@contextlib.contextmanager
def profiler_log(directory: str, as_json: bool) -> Iterator[Path]:
    """While the block runs, the worker process's stderr goes to `directory`/profiler.log (Kineto's `USDT`
    lines and c10's warnings are written from C++, so the child's file descriptor 2 is redirected).
    Afterwards the log's path is printed if it is not empty (an empty one is removed): to stdout beside
    the result, or to stderr under --json or after a failure, whose message main() prints next. The block
    holds the printing of the result too, so the path comes last."""
    from profiling.worker import default_worker

    log = Path(directory) / LOG_NAME
    try:
        log.write_bytes(b"")  # this command's log: a reused --trace-dir keeps no older run's lines
    except OSError as exc:
        raise UsageError(f"trace-dir: cannot write {log} ({exc.strerror or exc})") from None
    failed = True
    try:
        with default_worker().stderr_to(log):
            yield log
        failed = False
    finally:
        _show_log(log, sys.stderr if as_json or failed else sys.stdout)


def _show_log(log: Path, stream: Any) -> None:
    try:
        written = log.stat().st_size
    except OSError:  # removed while we ran: nothing to point at
        return
    if written:
        print(plain(f"profiler log: {log}"), file=stream)
    else:
        log.unlink(missing_ok=True)


def _run(args: argparse.Namespace) -> None:
    from profiling.pipeline import profile_attention

    spec, directory = spec_from_args(args, variant=args.variant, backend=args.backend), trace_dir(args)
    with profiler_log(directory, args.json):
        with TerminalProgress() as progress:
            result = profile_attention(spec, directory, progress)
        _print(dict(result.summary), args.json)
        if not args.json:
            if len(result.kernel_table):
                columns = ["name", "per forward", "total (us)", "meaning"]
                print(_plain_table(result.kernel_table[columns], max_colwidth=KERNEL_NAME_WIDTH))
            print(f"trace: {result.trace_path}\ntable: {result.table_path}")


def _compare(args: argparse.Namespace) -> None:
    from profiling.cli_tables import compare_lines
    from profiling.compare import compare

    spec, directory = spec_from_args(args), trace_dir(args)
    with profiler_log(directory, args.json):
        with TerminalProgress() as progress:
            rows = compare(spec, directory, progress=progress)
        if args.json:
            _print(rows, True)
        else:
            _print_lines(compare_lines(_plain(rows)))


def _sweep(args: argparse.Namespace) -> None:
    from attention import parse_runs, parse_seq_lens
    from profiling.cli_tables import sweep_lines
    from profiling.sweep import sweep

    runs, seq_lens = parse_runs(args.variants), parse_seq_lens(args.seq_lens)
    spec, directory = spec_from_args(args), trace_dir(args)
    with profiler_log(directory, args.json):
        with TerminalProgress() as progress:
            points = sweep(spec, runs, seq_lens, directory, progress=progress)
        if args.json:
            _print(points, True)
        else:
            _print_lines(sweep_lines(_plain(points)))


def _print_lines(lines: list[str]) -> None:
    for line in lines:
        print(plain(line))  # again: a table's own text (a lesson quoting a run) passes the same filter


def _analyze(args: argparse.Namespace) -> None:
    from profiling.analysis import analyze_file
    from profiling.records import kernel_records, op_records

    if Path(args.trace).is_dir():
        raise UsageError(f"trace: {args.trace} is a directory; give a .json or .json.gz file")
    with TerminalProgress() as progress:
        analysis = analyze_file(args.trace, progress=progress)
    summary = dict(analysis.summary)
    if args.json:
        tables = {"kernels": kernel_records(analysis.kernel_table), "ops": op_records(analysis.op_table)}
        _print({**summary, **tables}, True)
        return
    _print_keys(_plain(summary))
    if len(analysis.kernel_table) and args.top:
        columns = ["name", "count", "total (us)", "family", "meaning"]
        table = analysis.kernel_table.reindex(columns=columns).head(args.top)
        print(_plain_table(table, max_colwidth=KERNEL_NAME_WIDTH))
        print()
    _print_findings(_plain(summary.get("findings", [])))


def _print_findings(findings: list[dict[str, Any]]) -> None:
    """Every finding, most GPU time first (the summary's order), with its share where it has one."""
    print(f"findings ({len(findings)}):" if findings else "findings: none")
    for finding in findings:
        share = finding.get("gpu_time_percent")
        where = f" [{share:.1f}% of GPU time]" if isinstance(share, (int, float)) else ""
        print(f"  - {finding['title']}{where}: {finding['detail']}")


def _diff(args: argparse.Namespace) -> None:
    from profiling.trace_diff import diff_files
    from profiling.trace_diff_text import diff_text

    for field in ("before", "after"):
        if Path(getattr(args, field)).is_dir():
            raise UsageError(f"{field}: {getattr(args, field)} is a directory; give a .json or .json.gz file")
    with TerminalProgress() as progress:
        diff = diff_files(args.before, args.after, progress=progress)
    if args.json:
        _print(diff, True)
        return
    for line in diff_text(_plain(diff), args.top):
        print(plain(line))


COMMANDS = {
    "run": _run,
    "compare": _compare,
    "sweep": _sweep,
    "analyze": _analyze,
    "diff": _diff,
    "view": cli_views.run,
    "job": cli_job.run,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = COMMANDS[args.command](args)
    except (SpecError, TraceError, UsageError) as exc:
        print(f"error: {plain(str(exc))}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # RunError and friends: the run started and failed
        print(f"error: {plain(str(exc))}", file=sys.stderr)
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main())

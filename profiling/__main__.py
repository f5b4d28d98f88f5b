"""`python -m profiling {run,compare,sweep,analyze}`: the blog's scripts, headless."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

from attention import BACKENDS, DEVICES, DTYPES, PRESETS, VARIANTS, AttentionSpec, SpecError
from profiling.trace import TraceError


def add_shape_args(parser: argparse.ArgumentParser, preset: str = "cpu-small", device: str = "auto") -> None:
    """The shape, dtype and device flags, defaulting to one of `attention.PRESETS`."""
    defaults = PRESETS[preset]
    for name in ("batch", "heads", "seq_len", "head_dim"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=defaults[name])
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=defaults["dtype"])
    parser.add_argument("--device", choices=DEVICES, default=device)


def _run_args(parser: argparse.ArgumentParser) -> None:
    add_shape_args(parser)
    parser.add_argument("--compile", action="store_true", help="wrap the attention in torch.compile")
    parser.add_argument("--trace-dir", default=None, help="where traces go (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m profiling", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="profile one variant")
    run.add_argument("--variant", choices=VARIANTS, default="naive")
    run.add_argument("--backend", choices=BACKENDS, default="auto")
    _run_args(run)
    _run_args(sub.add_parser("compare", help="profile every variant/backend on one shape"))
    sweep = sub.add_parser("sweep", help="profile variants over seq_len values")
    _run_args(sweep)
    sweep.add_argument(
        "--variants", default="naive,sdpa-math,sdpa-flash", help="comma list: naive, inplace, sdpa-<backend>, flex"
    )
    sweep.add_argument("--seq-lens", default="128,256,512,1024", help="comma list of seq_len values")
    analyze = sub.add_parser("analyze", help="analyze a Chrome trace (.json or .json.gz)")
    analyze.add_argument("trace")
    analyze.add_argument("--json", action="store_true")
    return parser


def parse_variants(text: str) -> list[tuple[str, str]]:
    """`naive,sdpa-flash` -> [("naive", "auto"), ("sdpa", "flash")]."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        variant, _, backend = item.partition("-")
        if variant not in VARIANTS or (backend and backend not in BACKENDS):
            raise SpecError("variants", f"{item!r} is not one of naive, inplace, flex, sdpa-<{'|'.join(BACKENDS)}>")
        out.append((variant, backend or "auto"))
    if not out:
        raise SpecError("variants", "give at least one variant")
    return out


def parse_seq_lens(text: str) -> list[int]:
    """`128,256` -> [128, 256]; each value is then checked by the spec like any seq_len."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SpecError("seq_lens", f"must be a comma list of whole numbers, got {text!r}") from None
    if not values:
        raise SpecError("seq_lens", "give at least one seq_len, e.g. 128,256,512")
    return values


def spec_from_args(args: argparse.Namespace, **extra: Any) -> AttentionSpec:
    """The spec the shape flags describe (plus `extra` fields such as variant and backend)."""
    fields = ("batch", "heads", "seq_len", "head_dim", "dtype", "device", "compile")
    return AttentionSpec(**{f: getattr(args, f) for f in fields if hasattr(args, f)}, **extra)


def _print(summary: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return
    rows = summary if isinstance(summary, list) else [summary]
    for row in rows:
        for key, value in row.items():
            if key in ("insights", "per_forward_ops", "per_forward_kernels"):
                continue
            print(f"{key:>26}: {value}")
        for text in row.get("insights", []):
            print(f"  - {text}")
        print()


def _progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trace_dir = getattr(args, "trace_dir", None) or tempfile.mkdtemp(prefix="attention-profiler-")
    try:
        if args.command == "run":
            from profiling.runner import profile_attention

            result = profile_attention(spec_from_args(args, variant=args.variant, backend=args.backend), trace_dir)
            _print(result.summary, args.json)
            if not args.json:
                print(f"trace: {result.trace_path}\ntable: {result.table_path}")
                if result.kernel_table.shape[0]:
                    print(
                        result.kernel_table[["name", "per forward", "total (us)", "meaning"]].to_string(max_colwidth=70)
                    )
        elif args.command == "compare":
            from profiling.compare import compare, compare_table

            rows, _ = compare(spec_from_args(args), trace_dir, progress=_progress)
            if args.json:
                _print(rows, True)
            else:
                print(compare_table(rows).drop(columns="what the trace revealed").to_string(index=False))
        elif args.command == "sweep":
            from profiling.sweep import sweep

            variants, seq_lens = parse_variants(args.variants), parse_seq_lens(args.seq_lens)
            rows = sweep(spec_from_args(args), variants, seq_lens, trace_dir, progress=_progress)
            _print(rows, args.json)
        else:
            from profiling.analyze import analyze_file

            analysis = analyze_file(args.trace)
            _print(analysis.summary, args.json)
            if not args.json and len(analysis.kernel_table):
                print(
                    analysis.kernel_table[["name", "count", "total (us)", "meaning"]]
                    .head(20)
                    .to_string(max_colwidth=60)
                )
    except (SpecError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # RunError and friends: the run started and failed
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

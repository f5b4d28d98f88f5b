"""A diff of two traces (profiling/trace_diff.py `diff_sides`) as plain-text lines, for the CLI and the app's
text box: steps, GPU metrics, regressions, then the ops and kernels that changed most."""

from __future__ import annotations

from typing import Any

TEXT_ROWS = 20  # ops and kernels printed by `diff_text`, largest |Δ| first
TEXT_WIDTH = 120


def _cell(value: Any, width: int) -> str:
    """`value` right-aligned in `width` characters: numbers to 4 significant figures past 10,000, "—" for null."""
    if value is None:
        text = "—"
    elif isinstance(value, float):
        text = f"{value:,.1f}" if abs(value) < 1e7 else f"{value:.3g}"
    else:
        text = str(value)
    return text[:width].rjust(width)


def _name(name: Any, width: int) -> str:
    text = str(name)
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"


def diff_text(diff: dict[str, Any], top: int = TEXT_ROWS) -> list[str]:
    """The diff as plain-text lines of at most TEXT_WIDTH characters: steps, GPU metrics, regressions, then
    the `top` ops and kernels with the largest |Δ total time| (the JSON has every row)."""
    lines = [f"before: {diff.get('before')}", f"after:  {diff.get('after')}", ""]
    head = f"{'':<42}{'before':>16}{'after':>16}{'Δ':>16}{'Δ%':>9}  status"
    for title, rows in (("steps (mean per step)", diff["steps"]), ("GPU metrics", diff["gpu_metrics"])):
        if rows:
            lines += [title, head]
            for row in rows:
                cells = "".join(_cell(row[k], 16) for k in ("before", "after", "Δ")) + _cell(row["Δ%"], 9)
                lines.append(f"  {_name(row['name'], 40)}{cells}  {row['status']}")
            step = rows[0]
            if step.get("p_value") is not None:
                lines.append(
                    f"  step medians {step['median_before']:,.1f} -> {step['median_after']:,.1f} us, "
                    f"Mann-Whitney p = {step['p_value']:g} over {step['steps_before']} and {step['steps_after']} steps"
                )
            lines.append("")
    lines += [
        "top regressions (largest growth of total time)",
        *(
            f"  {r['kind']:<7}{_name(r['name'], 62)}{_cell(r['before'], 14)}{_cell(r['after'], 14)}"
            f"{_cell(r['Δ'], 12)}{_cell(r['Δ%'], 9)}"
            for r in diff["regressions"]
        ),
        "",
    ]
    for kind, label in (("ops", "total host (us)"), ("kernels", "total device (us)")):
        counts = diff["counts"][kind]
        lines.append(
            f"{kind} ({label}): {counts['added']} added, {counts['removed']} removed, {counts['changed']} changed"
        )
        if diff[kind]:
            lines.append(f"  {'status':<8}{'name':<52}{'Δ calls':>9}{'before':>14}{'after':>14}{'Δ':>12}{'Δ%':>9}")
        for row in diff[kind][:top]:
            lines.append(
                f"  {row['status']:<8}{_name(row['name'], 52)}{_cell(row['Δ calls'], 9)}"
                f"{_cell(row[f'{label} before'], 14)}{_cell(row[f'{label} after'], 14)}"
                f"{_cell(row[f'Δ {label}'], 12)}{_cell(row[f'Δ% {label}'], 9)}"
            )
        if len(diff[kind]) > top:
            lines.append(f"  … {len(diff[kind]) - top} more rows in --json")
        lines.append("")
    return lines

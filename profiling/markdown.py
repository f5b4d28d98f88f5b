"""Markdown for the page: the one place insights (and anything else from a trace) become markup.

Strings from a trace are data. Op and kernel names are attacker-controlled on a public Space
(an uploaded trace can name an op `<img src=…>` or `[Open in Perfetto](javascript:…)`), and
Gradio's sanitizer keeps some of that. So every character CommonMark gives a meaning to is
backslash-escaped, which renders it literally and leaves no tag, link or emphasis behind.
"""

from __future__ import annotations

import html
import re
import string
from typing import Any

from profiling.insights import Insight
from profiling.timing import stats_from_dict

_PUNCTUATION = re.compile("([" + re.escape(string.punctuation) + "])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")
NO_INSIGHT = "_No insight rule fired for this trace._"


def escape(text: str) -> str:
    """`text` as literal Markdown: every ASCII punctuation character escaped, one line."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_BREAKS.sub(" ", str(text)))


def insights_markdown(insights: list[Insight]) -> str:
    """A bullet per insight, its title in bold, then its share of GPU time; all of it escaped."""
    if not insights:
        return NO_INSIGHT
    return "\n".join(f"- **{escape(i.title)}**{_share(i.gpu_time_percent)}: {escape(i.detail)}" for i in insights)


def _share(percent: float | None) -> str:
    """A finding's share of GPU time, where it is about GPU events (the findings are sorted by it)."""
    return f" ({percent:.1f}% of GPU time)" if percent is not None else ""


GPU_CARD_FIELDS = (
    ("GPU utilization", "gpu_utilization_percent", "%"),
    ("Est. SM efficiency", "sm_efficiency_percent", "%"),
    ("Est. achieved occupancy", "achieved_occupancy_percent", "%"),
    ("Tensor-core time", "tensor_core_time_percent", "%"),
    # Kernels the decoder cannot place on tensor or other cores: shown beside the share, so that
    # time in unknown kernels never reads as "no tensor cores".
    ("Tensor-core use unknown", "tensor_core_unknown_percent", "%"),
    ("Average step", "average_step_time_us", " µs"),
    ("GPU idle (merged)", "idle_time_us", " µs"),
)
NO_EVIDENCE = "n/a (no evidence)"
# Kineto fills blocks per SM and est. achieved occupancy from CUPTI's kernel records only.
NOT_ON_ROCM = {
    "sm_efficiency_percent": "n/a (ROCm traces carry no blocks per SM)",
    "achieved_occupancy_percent": "n/a (ROCm traces carry no occupancy estimate)",
}


def gpu_card(summary: dict[str, Any]) -> str:
    """The Overview's GPU card: the device, then each metric the trace has evidence for."""
    name = summary.get("gpu_name")
    lines = [f"### {escape(name) if name else 'GPU: not described in this trace'}"]
    memory, capability, arch = (
        summary.get("gpu_memory_bytes"),
        summary.get("compute_capability"),
        summary.get("gpu_arch"),
    )
    amd = isinstance(arch, str) and arch.startswith("gfx")
    facts = [f"{memory / 1024**3:.1f} GiB"] if isinstance(memory, (int, float)) else []
    facts += [f"{summary['sm_count']:,} {'CUs' if amd else 'SMs'}"] if isinstance(summary.get("sm_count"), int) else []
    facts += [f"compute capability {escape(capability)}"] if capability else []
    facts += [escape(arch)] if isinstance(arch, str) and arch else []
    if facts:
        lines.append(" · ".join(facts))
    for label, key, unit in GPU_CARD_FIELDS:
        value = summary.get(key)
        missing = NOT_ON_ROCM.get(key, NO_EVIDENCE) if amd else NO_EVIDENCE
        lines.append(f"- **{label}**: " + (f"{value:,.2f}{unit}" if isinstance(value, (int, float)) else missing))
    return "\n".join(lines)


def _ms(value: Any) -> str:
    return f"{value:.3f} ms" if isinstance(value, (int, float)) else "n/a"


def _mib(value: Any) -> str:
    return f"{value / 1024**2:.2f} MiB" if isinstance(value, (int, float)) else "n/a"


def _throughput(summary: dict[str, Any]) -> str:
    """TFLOP/s against the compute roof, or GB/s against the bandwidth roof: whichever bounds the run."""
    if summary.get("roofline_bound") == "memory" and summary.get("peak_gbps"):
        share = 100 * summary["achieved_gbps"] / summary["peak_gbps"]
        return f"{summary['achieved_gbps']:.1f} GB/s ({share:.1f}% of peak)"
    percent = summary.get("percent_of_peak")
    return f"{summary.get('achieved_tflops', 0):.3f} TFLOP/s" + (f" ({percent:.1f}% of peak)" if percent else "")


def _timed(summary: dict[str, Any], name: str) -> str:
    """`name`'s unprofiled wall clock as median ± half the IQR, marked where its cv says it is noisy; a
    summary made before the spread was kept shows its lone median."""
    stats = stats_from_dict(summary.get(f"{name}_ms_stats"))
    if stats is None:
        return _ms(summary.get(f"{name}_unprofiled_ms"))
    figure = f"{stats.median:.3f} ± {stats.half_iqr:.3f} ms"
    return f"≈ {figure} (noisy, cv {100 * stats.cv:.0f}%)" if stats.noisy else figure


# Forward and backward are both read from the unprofiled loop, on CPU and GPU alike, so their ratio
# means something: never a profiled backward beside an unprofiled forward.
TIMED_HOW = "_forward and backward: unprofiled wall clock with device sync, median ± half the IQR of the calls timed_"


def metric_cards(summary: dict[str, Any]) -> str:
    """Profile's headline: a card per number a reader looks for first, then how the times were taken.

    The cards are a `<dl>` that the page's CSS lays out as a wrapping grid (`ui/page.css`), so a phone
    wraps them card by card. Inside an HTML block Markdown is not parsed, so the values are HTML-escaped
    rather than Markdown-escaped: every one of them is still text, never markup.
    """
    training = summary.get("mode") == "training"
    cards = {
        "forward (unprofiled)": _timed(summary, "forward"),
        **({"backward (unprofiled)": _timed(summary, "backward")} if training else {}),
        "kernels / forward": f"{summary.get('kernels_per_forward', 0):g}",
        "peak memory": _mib(summary.get("peak_memory_bytes")),
        **({"saved for backward": _mib(summary.get("saved_for_backward_bytes"))} if training else {}),
        "throughput": _throughput(summary),
        "max abs error": f"{summary.get('max_abs_error', 0):.2e}",
        "backend used": str(summary.get("backend_used") or summary.get("variant") or "n/a"),
    }
    items = "".join(
        f'<div class="metric-card"><dt class="metric-label">{html.escape(label)}</dt>'
        f'<dd class="metric-value">{html.escape(_LINE_BREAKS.sub(" ", value))}</dd></div>'
        for label, value in cards.items()
    )
    return f'<dl class="metric-cards">{items}</dl>\n\n{TIMED_HOW}'

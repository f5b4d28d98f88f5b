"""Rotary position embedding applied in eager PyTorch: several kernels per call where one would do."""

from __future__ import annotations

from profiling.insights.base import NAME_IN_PROSE, Evidence, Finding, Rule, gpu_share, short
from profiling.kernels import decode_most, short_name_in
from profiling.rotary import rotary_work
from profiling.step_breakdown import step_at

MIN_KERNELS_PER_CALL = 2  # one kernel per call is already fused


def unfused_rotary(ev: Evidence) -> Finding | None:
    """The kernels launched inside the frames that apply RoPE, where they are more than one per call."""
    work = rotary_work(ev.trace)
    if work is None or work.kernels_per_call < MIN_KERNELS_PER_CALL or work.gpu_us <= work.fused_us:
        return None
    gpu = work.gpu
    per_name = gpu["name"].value_counts()  # decoded once per distinct name, not per kernel
    per_name = per_name[per_name > 0]  # a categorical's counts hold every name of the trace, launched here or not
    infos = decode_most(gpu["name"], gpu["dur"])
    kinds = per_name.groupby([short_name_in(infos, str(name)) for name in per_name.index], sort=False).sum()
    kinds = kinds.sort_values(ascending=False, kind="stable")
    worst = gpu.loc[gpu["dur"].idxmax()]
    lost = (
        f" The trace lost the launch events of {work.lost_launches:,} GPU events, whose frames are unknown: the share "
        "counts only the kernels whose launch it kept, so it is a lower bound."
        if work.lost_launches
        else ""
    )
    return Finding(
        "Rotary embedding unfused",
        f"{short(work.frame_name, NAME_IN_PROSE)} ran {work.frames:,} times and launched {work.kernels_per_call:.1f} "
        f"kernels per call ({', '.join(f'{n} x{c}' for n, c in kinds.head(3).items())}), each reading and writing "
        "all of q or k. A fused rotary kernel (vLLM's rotary_embedding, flash-attn's apply_rotary_emb, Liger's) or "
        f"torch.compile applies cos and sin in one pass.{lost}",
        {
            "frame": work.frame_name,
            "calls": work.frames,
            "kernels": len(gpu),
            "kernels_per_call": work.kernels_per_call,
            "gpu_us": work.gpu_us,
            "kernel_names": kinds.to_dict(),
            "lost_launches": work.lost_launches,
            "ts_us": float(worst["ts"]) + ev.trace.ts_base_us,
            "step": step_at(ev.trace, float(worst["ts"]), device_side=True),
        },
        gpu_share(ev, work.gpu_us),
    )


RULES: tuple[Rule, ...] = (
    Rule("unfused_rotary", "python frames applying RoPE (with_stack) that launch 2+ kernels per call", unfused_rotary),
)

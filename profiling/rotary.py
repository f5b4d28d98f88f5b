"""Rotary position embedding (RoPE): the GPU work launched inside the Python frames that apply it.

transformers' `apply_rotary_pos_emb` computes `q * cos + rotate_half(q) * sin` (and the same for k) in eager
PyTorch: a slice, a `neg`, a `cat`, two `mul`s and an `add`, each a kernel that reads and writes the whole of
q or k. A fused rotary kernel (vLLM's `rotary_embedding_kernel`, flash-attn's `apply_rotary`, Liger's) does it
in one pass. The frames are `python_function` events (a trace recorded with `with_stack=True`) whose name
says rotary or RoPE; the kernels are those whose launch lies inside one on the same thread (correlation ids).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiling.kernels import decode_most
from profiling.structure import lane_codes
from profiling.trace import LAUNCH_CATEGORIES, Trace
from profiling.windows import latest_start_on_lane

# A frame that applies RoPE, by its function's name: `modeling_qwen2.py(68): apply_rotary_pos_emb`,
# `apply_rotary_emb`, `rope_forward`. Literal alternatives: linear in the name.
ROTARY_FRAME = re.compile(r"rotary|(?<![a-z])rope(?![a-z])", re.IGNORECASE)
MODULE_PREFIX = "nn.Module: "  # a module's own frame: the embedding module computes cos/sin, not their use
FUSED_FAMILY = "rotary"  # the decoder's family of fused rotary kernels (kernel_patterns.json)


@dataclass(frozen=True)
class RotaryWork:
    """The GPU work the RoPE frames launched."""

    frames: int  # calls of a RoPE-applying function
    frame_name: str
    gpu: pd.DataFrame  # the GPU events launched inside them (name, dur, ts, ...)
    fused_us: float  # of which in fused rotary kernels
    lost_launches: int  # GPU events in the trace whose launch event is missing (their frame is unknown)

    @property
    def gpu_us(self) -> float:
        return float(self.gpu["dur"].sum())

    @property
    def kernels_per_call(self) -> float:
        return len(self.gpu) / self.frames if self.frames else 0.0


def rotary_frames(trace: Trace) -> pd.DataFrame:
    """The complete `python_function` events that apply RoPE (not the embedding module's own frame)."""
    rows = trace.complete_rows[trace.complete_column("cat") == "python_function"]
    names = trace.events["name"].to_numpy()[rows]
    distinct = pd.unique(names)
    applying = {n for n in distinct if ROTARY_FRAME.search(n) and not n.startswith(MODULE_PREFIX)}
    return trace.events.iloc[rows[np.isin(names, list(applying))]] if applying else trace.events.iloc[:0]


def rotary_work(trace: Trace) -> RotaryWork | None:
    """The GPU work launched inside RoPE frames, or None where the trace has no such frame."""
    frames = rotary_frames(trace)
    if frames.empty:
        return None
    ev = trace.events
    lanes = lane_codes(trace)
    launches = np.flatnonzero(ev["cat"].isin(LAUNCH_CATEGORIES).to_numpy() & (ev["ph"].to_numpy() == "X"))
    outer = _outermost(frames, lanes)
    at = ev["ts"].to_numpy()[launches]
    k = latest_start_on_lane(lanes[outer.index.to_numpy()], outer["ts"].to_numpy(), lanes[launches], at)
    inside = k >= 0
    inside[inside] = at[inside] <= outer["end"].to_numpy()[k[inside]]  # k: a position among the frames
    correlations = ev["correlation"].to_numpy()[launches[inside]]
    gpu = trace.gpu_activity
    launched = gpu[gpu["correlation"].isin(correlations[~np.isnan(correlations)])]
    known = ev["correlation"].to_numpy()[launches]
    lost = int((~gpu["correlation"].isin(known[~np.isnan(known)])).sum())
    infos = decode_most(launched["name"], launched["dur"])  # once per name
    fused_names = [name for name, info in infos.items() if info.family == FUSED_FAMILY]
    fused = launched["name"].isin(fused_names).to_numpy()
    return RotaryWork(
        frames=len(outer),
        frame_name=str(frames["name"].value_counts().index[0]),
        gpu=launched,
        fused_us=float(launched["dur"].to_numpy()[fused].sum()),
        lost_launches=lost,
    )


def _outermost(frames: pd.DataFrame, lanes: np.ndarray) -> pd.DataFrame:
    """The frames no other RoPE frame on their lane contains (nested calls counted once), by start."""
    order = np.lexsort((-frames["end"].to_numpy(), frames["ts"].to_numpy(), lanes[frames.index.to_numpy()]))
    frames = frames.iloc[order]
    lane = lanes[frames.index.to_numpy()]
    end = frames["end"].to_numpy()
    reach = pd.Series(end).groupby(lane).cummax().shift().to_numpy()  # the furthest end of earlier frames
    same_lane = np.r_[False, lane[1:] == lane[:-1]]
    nested = same_lane & (frames["end"].to_numpy() <= np.nan_to_num(reach, nan=-np.inf))
    return frames[~nested]

"""The shape panel: the run controls the Profile, Compare and Sweep tabs share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ui.components import integer

# The device's choices are what this machine accepts; the info says what the missing GPU would add.
CPU_INFO = "no GPU on this server: auto runs on the CPU; a GPU adds device times, CUDA kernels and the fused backends"
GPU_INFO = "auto runs on the GPU: device times, CUDA kernels and the fused flash, efficient and cuDNN backends"


@dataclass
class Shape:
    """The run controls shared by the Profile, Compare and Sweep tabs, in the endpoints' order."""

    batch: gr.Number
    heads: gr.Number
    seq_len: gr.Number
    head_dim: gr.Number
    dtype: gr.Dropdown
    device: gr.Dropdown
    compile: gr.Checkbox
    mode: gr.Dropdown
    kv_heads: gr.Number
    q_len: gr.Number
    mask: gr.Dropdown
    window: gr.Number
    valid_len: gr.Textbox

    def all(self) -> list[Any]:
        """What /profile and /compare take after the variant: the shape, then the run's other parameters."""
        shape = [self.batch, self.heads, self.seq_len, self.head_dim, self.dtype, self.device, self.compile]
        return [*shape, *self.extra()]

    def extra(self) -> list[Any]:
        return [self.mode, self.kv_heads, self.q_len, self.mask, self.window, self.valid_len]


def shape_controls(defaults: dict[str, Any], cuda: bool) -> Shape:
    from attention import DTYPES, LIMITS

    def size(name: str) -> gr.Number:
        low, high = LIMITS[name]
        return integer(name, defaults[name], info=f"{low}–{high:,}")

    with gr.Row():
        batch, heads, seq_len, head_dim = size("batch"), size("heads"), size("seq_len"), size("head_dim")
    with gr.Row():
        dtype = gr.Dropdown(list(DTYPES), value=defaults["dtype"], label="dtype", allow_custom_value=True)
        device = gr.Dropdown(
            ["auto", "cpu", "cuda"] if cuda else ["auto", "cpu"],
            value="auto",
            label="device",
            info=GPU_INFO if cuda else CPU_INFO,
            allow_custom_value=True,
        )
        compile_box = gr.Checkbox(False, label="torch.compile")
    return Shape(batch, heads, seq_len, head_dim, dtype, device, compile_box, *_practice_controls())


def _practice_controls() -> tuple[Any, ...]:
    """Training, GQA, decode and masks: neutral by default, so the blog's runs stay as they were."""
    from attention import MASKS, MODES

    with gr.Row():
        mode = gr.Dropdown(
            list(MODES),
            value="inference",
            label="mode",
            info="training adds the backward pass",
            allow_custom_value=True,
        )
        kv_heads = integer("kv_heads", 0, info="0 = heads; fewer is GQA, 1 is MQA")
        q_len = integer("q_len", 0, info="0 = seq_len; 1 is KV-cache decode")
        mask = gr.Dropdown(list(MASKS), value="causal", label="mask", allow_custom_value=True)
        window = integer("window", 0, info="keys each query sees", visible=False)
        valid_len = gr.Textbox("", label="valid_len", info="one length, or one per batch row", visible=False)
    mask.change(
        lambda m: (gr.update(visible=m == "sliding_window"), gr.update(visible=m == "padding")),
        mask,
        [window, valid_len],
        api_visibility="private",
    )
    return mode, kv_heads, q_len, mask, window, valid_len

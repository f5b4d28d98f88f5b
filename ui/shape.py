"""The shape panel: the run controls the Profile, Compare and Sweep tabs share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr


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
        return gr.Number(value=defaults[name], label=name, info=f"{low}–{high:,}", minimum=None, precision=None)

    with gr.Row():
        batch, heads, seq_len, head_dim = size("batch"), size("heads"), size("seq_len"), size("head_dim")
    with gr.Row():
        dtype = gr.Dropdown(list(DTYPES), value=defaults["dtype"], label="dtype", allow_custom_value=True)
        device = gr.Dropdown(
            ["auto", "cpu", "cuda"] if cuda else ["auto", "cpu"], value="auto", label="device", allow_custom_value=True
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
        kv_heads = gr.Number(0, label="kv_heads", info="0 = heads; fewer is GQA, 1 is MQA", precision=None)
        q_len = gr.Number(0, label="q_len", info="0 = seq_len; 1 is KV-cache decode", precision=None)
        mask = gr.Dropdown(list(MASKS), value="causal", label="mask", allow_custom_value=True)
        window = gr.Number(0, label="window", info="keys each query sees", visible=False, precision=None)
        valid_len = gr.Textbox("", label="valid_len", info="one length, or one per batch row", visible=False)
    mask.change(
        lambda m: (gr.update(visible=m == "sliding_window"), gr.update(visible=m == "padding")),
        mask,
        [window, valid_len],
        api_visibility="private",
    )
    return mode, kv_heads, q_len, mask, window, valid_len

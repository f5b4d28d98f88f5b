"""Which SDPA backend really ran: read from the trace, not from what was asked.

`F.scaled_dot_product_attention` dispatches to one aten op per backend, and on a GPU each backend
launches its own family of kernels; either is evidence inside the forward windows.
"""

from __future__ import annotations

from profiling.kernels import decode_most
from profiling.windows import WindowStats

# aten ops torch 2.x dispatches SDPA to (aten/src/ATen/native/transformers/attention.cpp).
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_attention_math_for_mps": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}
KERNEL_FAMILIES = {"flash-attention": "flash", "efficient-attention": "efficient", "cudnn-attention": "cudnn"}


def backend_used(forwards: WindowStats | None) -> str | None:
    """The SDPA backend the forwards ran (by their aten op, else their kernels), or None if no SDPA ran."""
    if forwards is None:
        return None
    for name in forwards.ops["name"].unique():
        if name in SDPA_OPS:
            return SDPA_OPS[name]
    infos = decode_most(forwards.gpu["name"], forwards.gpu["dur"]) if len(forwards.gpu) else {}
    for info in infos.values():
        family = KERNEL_FAMILIES.get(info.family)
        if family:
            return family
    return None

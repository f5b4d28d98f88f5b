"""Record the CPU pair: the same attention job before (naive, `masked_fill`) and after (`masked_fill_`).

    python tests/data/cpu_pair/record.py  # writes before.json.gz and after.json.gz beside this file

Ten ProfilerSteps each (schedule: 1 wait, 2 warm-up, 10 active), batch 2, 8 heads, 512 tokens, head_dim 64,
float32, causal mask, one thread: the only change is the in-place masked fill, which removes one copy of the
scores per step (the blog's 6 -> 5 kernels).
"""

import gzip
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from attention.inplace import inplace_attention
from attention.naive import naive_attention

HERE = Path(__file__).resolve().parent


def record(fn: Callable[..., torch.Tensor], out: Path) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 512, 64) for _ in range(3))
    mask = torch.ones(512, 512, dtype=torch.bool).triu(1)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=2, active=10)) as prof:
        for _ in range(13):
            fn(q, k, v, mask=mask)
            prof.step()
    raw = out.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


if __name__ == "__main__":
    torch.set_num_threads(1)
    record(naive_attention, HERE / "before.json.gz")
    record(inplace_attention, HERE / "after.json.gz")

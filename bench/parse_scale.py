"""Parse-time scaling: analyze synthetic traces of 1x, 4x and 16x size and print events/s.

    python bench/parse_scale.py            # 25k, 100k and 400k events
Linear parsing shows as a flat events/s column; the ratio column compares each size with 1x.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import write_trace
from profiling.analysis import analyze_file
from profiling.charts import timeline

BASE_STEPS = 155  # about 25,000 events


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in (1, 4, 16):
            path = Path(tmp) / f"trace_{scale}x.json.gz"
            events = write_trace(path, BASE_STEPS * scale)
            start = time.perf_counter()
            analysis = analyze_file(path)
            parsed = time.perf_counter()
            figure_bytes = len(timeline(analysis).to_json())
            drawn = time.perf_counter()
            rows.append((scale, events, path.stat().st_size, parsed - start, drawn - parsed, figure_bytes))
    base_rate = rows[0][1] / rows[0][3]
    header = ("size", "events", "gzip MiB", "analyze s", "events/s", "vs 1x", "timeline s", "figure MiB")
    print("".join(f"{h:>12}" for h in header))
    for scale, events, size, parse_s, draw_s, figure in rows:
        rate = events / parse_s
        cells = (
            f"{scale}x",
            f"{events:,}",
            f"{size / 2**20:.2f}",
            f"{parse_s:.2f}",
            f"{rate:,.0f}",
            f"{rate / base_rate:.2f}",
            f"{draw_s:.2f}",
            f"{figure / 2**20:.2f}",
        )
        print("".join(f"{c:>12}" for c in cells))


if __name__ == "__main__":
    main()

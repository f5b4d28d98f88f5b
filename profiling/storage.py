"""Per-request run directories with bounded disk: old and surplus runs are removed."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

MAX_RUNS = 64
MAX_AGE_S = 3600.0
PREFIX = "run-"


class RunStore:
    """Creates one fresh directory per request under `root`, pruning as it goes.

    Only directories this store made (named `run-*`) are ever pruned or handed out.
    """

    def __init__(self, root: str | Path | None = None, max_runs: int = MAX_RUNS, max_age_s: float = MAX_AGE_S) -> None:
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / "attention-profiler"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_runs = max_runs
        self.max_age_s = max_age_s
        self._lock = threading.Lock()

    def runs(self) -> list[Path]:
        """This store's run directories, oldest first."""
        return sorted((p for p in self.root.glob(f"{PREFIX}*") if p.is_dir()), key=lambda p: p.stat().st_mtime)

    def new_dir(self) -> Path:
        with self._lock:
            self.prune(keep=self.max_runs - 1)
            path = self.root / f"{PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
            path.mkdir()
            return path

    def prune(self, keep: int | None = None) -> list[Path]:
        """Remove runs older than `max_age_s`, then the oldest beyond `keep` (default max_runs)."""
        keep = self.max_runs if keep is None else keep
        now = time.time()
        runs = self.runs()
        doomed = [p for p in runs if now - p.stat().st_mtime > self.max_age_s]
        fresh = [p for p in runs if p not in doomed]
        doomed += fresh[: max(0, len(fresh) - keep)]
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return doomed

    def owns(self, path: str | Path) -> bool:
        """True only for a file inside one of this store's run directories."""
        try:
            resolved = Path(path).resolve()
            relative = resolved.relative_to(self.root.resolve())
        except (OSError, ValueError):
            return False
        return len(relative.parts) >= 2 and relative.parts[0].startswith(PREFIX) and resolved.is_file()

    def disk_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())

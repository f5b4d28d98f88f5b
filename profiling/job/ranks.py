"""Which rank each trace of a job is: from its `distributedInfo`, else its file name, else the lowest rank
no other trace claims, in sorted path order.

`distributedInfo` is a top-level key of the trace (`{"backend": "nccl", "rank": 0, "world_size": 8}`),
which the reader keeps in `Trace.metadata`; each rank's summary carries it back from where the trace was
read, so no file is opened twice to number the ranks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_RANKS = 64  # traces in one job (issue 23)
# A world size past this is no real job's (the largest hold ~1e5 GPUs); a hostile one would list a
# billion missing ranks. Read as unknown.
MAX_WORLD_SIZE = 1 << 20
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class JobError(ValueError):
    """A job that cannot be analysed as given; the message names the field and the files."""


class DuplicateRankError(JobError):
    """Two traces claim the same rank."""


@dataclass(frozen=True)
class RankInfo:
    """One trace's place in the job. `source` says where `rank` came from."""

    path: str
    rank: int
    source: str  # "distributedInfo", "file name" or "order"
    world_size: int | None = None
    backend: str | None = None


@dataclass(frozen=True)
class JobRanks:
    """Every trace's rank, in rank order, and the ranks `world_size` names that no trace has."""

    ranks: list[RankInfo]
    world_size: int | None
    missing: list[int] = field(default_factory=list)


def _whole(value: Any) -> int | None:
    # bool is an int to Python but not a rank; a negative rank is no rank.
    return value if type(value) is int and value >= 0 else None


def distributed_fields(info: Any) -> tuple[int | None, int | None, str | None]:
    """(rank, world_size, backend) of a `distributedInfo` value; None for each field absent or malformed."""
    if not isinstance(info, Mapping):
        return None, None, None
    backend = info.get("backend")
    world_size = _whole(info.get("world_size"))
    if world_size is not None and not 0 < world_size <= MAX_WORLD_SIZE:
        world_size = None
    return _whole(info.get("rank")), world_size, backend if isinstance(backend, str) else None


def rank_from_name(path: str) -> int | None:
    """The first `rank[-_]?N` in the file's name (not its folders'), else None."""
    found = RANK_IN_NAME.search(Path(path).name)
    return int(found.group(1)) if found else None


def assign_ranks(paths: Sequence[str], infos: Sequence[Any]) -> JobRanks:
    """Number the traces `paths`, whose `distributedInfo` values are `infos` (None where unread).

    Raises JobError past MAX_RANKS or without traces, DuplicateRankError where two traces claim a rank.
    """
    if not paths:
        raise JobError("traces: no trace files given")
    if len(paths) > MAX_RANKS:
        raise JobError(f"traces: {len(paths)} files; a job takes at most {MAX_RANKS} ranks")
    ranks = number_the_rest([_rank_of(path, info) for path, info in zip(paths, infos, strict=True)])
    _refuse_duplicates(ranks)
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    world_size = max(sizes) if sizes else None  # traces that disagree: the largest, so no rank is lost
    have = {r.rank for r in ranks}
    missing = [r for r in range(world_size) if r not in have] if world_size is not None else []
    return JobRanks(sorted(ranks, key=lambda r: r.rank), world_size, missing)


def _rank_of(path: str, info: Any) -> RankInfo | tuple[str, int | None, str | None]:
    """The trace's rank from its distributedInfo or name; else what is known of it, numbered later."""
    rank, world_size, backend = distributed_fields(info)
    if rank is not None:
        return RankInfo(path, rank, "distributedInfo", world_size, backend)
    named = rank_from_name(path)
    if named is not None:
        return RankInfo(path, named, "file name", world_size, backend)
    return path, world_size, backend


def number_the_rest(found: list[RankInfo | tuple[str, int | None, str | None]]) -> list[RankInfo]:
    """Traces without a rank, in sorted path order, take the lowest ranks no other trace claims."""
    taken = {f.rank for f in found if isinstance(f, RankInfo)}
    free = (r for r in range(len(found) + len(taken)) if r not in taken)
    numbered = {p: next(free) for p, _, _ in sorted(f for f in found if not isinstance(f, RankInfo))}
    return [f if isinstance(f, RankInfo) else RankInfo(f[0], numbered[f[0]], "order", f[1], f[2]) for f in found]


def _refuse_duplicates(ranks: list[RankInfo]) -> None:
    seen: dict[int, list[RankInfo]] = {}
    for info in ranks:
        seen.setdefault(info.rank, []).append(info)
    clashes = {rank: infos for rank, infos in seen.items() if len(infos) > 1}
    if clashes:
        rank, infos = min(clashes.items())
        files = ", ".join(f"{Path(i.path).name} (from its {i.source})" for i in infos)
        raise DuplicateRankError(f"traces: rank {rank} is claimed by {len(infos)} files: {files}")

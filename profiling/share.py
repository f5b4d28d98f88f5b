"""Upload a trace to the Hugging Face Hub and return a Perfetto link, in one call.

The token is the user's own. It is passed to `HfApi` and nowhere else: never logged, echoed,
stored, put in a file name, or left in an error message. `api_factory` is the one seam that
tests replace, since no test machine can reach the Hub.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

PERFETTO = "https://ui.perfetto.dev/#!/?url="
# The Hub's rule, as huggingface_hub's `validate_repo_id` states it: ASCII letters, digits, `-`, `_` and `.`,
# 1 to 96 a side, neither starting nor ending with `-` or `.`, no `--` or `..`, not ending in `.git`. That
# function's own regex uses `\w`, which lets through Unicode letters (`alıce/tr`) that the Hub then refuses
# with an error that read here as if the Hub could not be reached.
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(f"{_NAME}/{_NAME}", re.ASCII)
REPO_ID_HELP = "give it as owner/name in ASCII letters, digits, '-', '_' and '.', e.g. alice/attention-traces"
QUOTE_CHARS = 100  # the most of any input an error message repeats
REPO_TYPES = ("dataset", "model")
PUBLIC_NOTE = "Perfetto fetches the trace from your browser, so the repo must be public for the link to open."


class ShareError(ValueError):
    """A share that could not happen; the message names the field and never holds the token."""


def _default_api(token: str) -> Any:
    from huggingface_hub import HfApi

    return HfApi(token=token)


def perfetto_url(file_url: str) -> str:
    return PERFETTO + urllib.parse.quote(file_url, safe="")


def _scrub(message: str, token: str) -> str:
    return message.replace(token, "***") if token else message


def valid_repo_id(repo_id: str) -> bool:
    """Whether the Hub would take `repo_id` as a repo's name (see REPO_ID)."""
    banned = "--" in repo_id or ".." in repo_id or repo_id.endswith(".git")
    return REPO_ID.fullmatch(repo_id) is not None and not banned


def _hub_error(exc: Exception, repo_id: str, token: str) -> ShareError:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    shown = repo_id[:QUOTE_CHARS]
    if status in (401, 403):
        return ShareError(f"token: the Hub refused it (HTTP {status}); it needs write access to {shown}")
    if status == 404:
        return ShareError(
            f"repo_id: {shown} was not found; create it first as a public dataset (huggingface.co/new-dataset)"
        )
    if status is not None:
        return ShareError(f"share: the Hub answered HTTP {status}: {_scrub(str(exc), token)[:200]}")
    return ShareError(f"share: could not reach the Hugging Face Hub ({type(exc).__name__})")


def share_trace(
    trace_path: str | Path,
    repo_id: str,
    token: str,
    repo_type: str = "dataset",
    api_factory: Callable[[str], Any] = _default_api,
) -> dict[str, str]:
    """Upload `trace_path` to `repo_id` under `traces/`; return its URL and a Perfetto link."""
    token = (token or "").strip()
    repo_id = (repo_id or "").strip()
    if not token:
        raise ShareError("token: give a Hugging Face token with write access, or log in")
    if not valid_repo_id(repo_id):
        raise ShareError(f"repo_id: {REPO_ID_HELP}")
    if repo_type not in REPO_TYPES:
        raise ShareError(f"repo_type: must be one of {', '.join(REPO_TYPES)}")
    path = Path(trace_path)
    if not path.is_file():
        raise ShareError("trace: there is no trace to share yet; profile or analyze one first")
    filename = f"traces/{path.name}"
    api = api_factory(token)
    try:
        # No create_repo: it needs the `manage-repos` scope, which can also delete repos; the user
        # creates the repo once, and the Space's login asks only for `write-repos`.
        api.upload_file(
            path_or_fileobj=str(path),
            path_in_repo=filename,
            repo_id=repo_id,
            repo_type=repo_type,
            commit_message=f"Add {path.name} from Attention Profiler",
        )
    except Exception as exc:  # the Hub client raises HTTP, network and validation errors alike
        raise _hub_error(exc, repo_id, token) from None
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, filename, repo_type=None if repo_type == "model" else repo_type)
    return {"url": url, "perfetto_url": perfetto_url(url), "note": PUBLIC_NOTE}

"""Fair use of a public Space: ASGI middleware in front of Gradio's routes.

- Uploads (`POST /gradio_api/upload`): one file per request; a declared `Content-Length` no larger
  than the upload limit; and the bytes each client, and all clients together, hold on disk kept under
  a quota. Gradio alone accepts any number of files in one request and streams them all to disk
  before any handler runs (40 files of 9 MB took 344 MB in 1.6 s, without a queue slot).
- The queue (`POST /gradio_api/queue/join`): each client may have at most `pending_per_client`
  requests waiting or running, so one client cannot fill the queue for everyone.

A client is its address; behind a proxy that sets `X-Forwarded-For` (a Space), the first address
there, when `trust_proxy` says so. Refusals are plain JSON `{"detail": "<field>: ..."}` with 411,
413 or 429, before any byte of the body is stored.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
from python_multipart.multipart import parse_options_header
from starlette.formparsers import MultiPartException

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UPLOAD_PATH, JOIN_PATH = "/gradio_api/upload", "/gradio_api/queue/join"
MULTIPART_SLACK = 64 * 1024  # a multipart body's headers and boundaries around its one file
PENDING_ENV = "ATTENTION_PROFILER_PENDING_PER_CLIENT"
CLIENT_QUOTA_ENV, TOTAL_QUOTA_ENV = "ATTENTION_PROFILER_CLIENT_UPLOAD_BYTES", "ATTENTION_PROFILER_UPLOAD_DISK_BYTES"
GiB = 1024**3


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit() or int(value) == 0:
        raise ValueError(f"{name}: give a positive whole number, got {value[:100]!r}")
    return int(value)


@dataclass(frozen=True)
class Quotas:
    """What one client, and everyone, may hold; from the environment or the defaults."""

    upload_bytes: int  # the largest one upload (Gradio's max_file_size)
    client_bytes: int  # uploads one client holds on disk at once
    total_bytes: int  # uploads all clients hold on disk at once
    pending_per_client: int  # requests one client may have waiting or running

    @classmethod
    def from_env(cls, upload_bytes: int) -> Quotas:
        client = _env_int(CLIENT_QUOTA_ENV, upload_bytes + MULTIPART_SLACK)
        return cls(
            upload_bytes=upload_bytes,
            client_bytes=client,
            total_bytes=_env_int(TOTAL_QUOTA_ENV, max(4 * GiB, client)),
            pending_per_client=_env_int(PENDING_ENV, 2),
        )


def client_key(headers: list[tuple[bytes, bytes]], peer: tuple[str, int] | None, trust_proxy: bool) -> str:
    """Who is asking: the first `X-Forwarded-For` address behind a trusted proxy, else the peer address."""
    if trust_proxy:
        for name, value in headers:
            if name.lower() == b"x-forwarded-for" and value.strip():
                return value.split(b",")[0].strip().decode("latin-1")[:64]
    return peer[0] if peer else "unknown"


TRUST_PROXY_ENV = "ATTENTION_PROFILER_TRUST_PROXY"


def trust_proxy_default() -> bool:
    """`ATTENTION_PROFILER_TRUST_PROXY` (1 or 0), else whether this is a Space: there the app sits behind
    Hugging Face's proxy, which sets X-Forwarded-For; locally nothing does, and a client could forge it."""
    value = os.environ.get(TRUST_PROXY_ENV, "").strip().lower()
    if value:
        return value in ("1", "true", "yes", "on")
    return bool(os.environ.get("SPACE_ID"))


@dataclass
class UploadLedger:
    """The upload files each client made, with their sizes; a file counts while it is still on disk."""

    files: dict[str, dict[str, int]] = field(default_factory=dict)  # client -> path -> bytes
    lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self, client: str | None = None) -> int:
        """Bytes still on disk, of one client or of everyone; forgets files Gradio has deleted."""
        with self.lock:
            total = 0
            for who, paths in list(self.files.items()):
                for path in [p for p in paths if not os.path.exists(p)]:
                    del paths[path]
                if not paths:
                    del self.files[who]
                elif client is None or who == client:
                    total += sum(paths.values())
            return total

    def record(self, client: str, paths: list[str]) -> None:
        with self.lock:
            mine = self.files.setdefault(client, {})
            for path in paths:
                try:
                    mine[path] = Path(path).stat().st_size
                except OSError:
                    continue  # already gone


def _refusal(status: int, detail: str) -> tuple[Message, Message]:
    body = json.dumps({"detail": detail}).encode()
    start = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, {"type": "http.response.body", "body": body}


class OneFilePerRequest:
    """Wraps an upload body's `receive`: the second multipart part raises MultiPartException, which
    Gradio's parser answers with 400 after deleting the files it had started."""

    def __init__(self, receive: Receive, boundary: bytes) -> None:
        self._receive = receive
        # Each part opens with the delimiter and CRLF; the body closes with the delimiter and "--".
        self._opening = b"--" + boundary + b"\r\n"
        self._tail = b""  # shorter than `_opening`, so no opening is ever counted twice
        self._parts = 0

    async def __call__(self) -> Message:
        message = await self._receive()
        if message.get("type") == "http.request":
            data = self._tail + message.get("body", b"")
            self._parts += data.count(self._opening)
            self._tail = data[-(len(self._opening) - 1) :]
            if self._parts > 1:
                raise MultiPartException("upload: one file per request; send each trace on its own")
        return message


class FairUse:
    """The middleware: upload rules and the per-client queue cap (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        blocks: Any,
        quotas: Quotas,
        trust_proxy: bool | None = None,
        ledger: UploadLedger | None = None,
    ) -> None:
        self.app = app
        self.blocks = blocks
        self.quotas = quotas
        self.trust_proxy = trust_proxy_default() if trust_proxy is None else trust_proxy
        self.ledger = ledger or UploadLedger()
        self._joining: dict[str, int] = {}  # joins being handled now, per client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or scope.get("method") != "POST" or path not in (UPLOAD_PATH, JOIN_PATH):
            return await self.app(scope, receive, send)
        client = client_key(scope.get("headers", []), scope.get("client"), self.trust_proxy)
        if path == UPLOAD_PATH:
            return await self._upload(scope, receive, send, client)
        return await self._join(scope, receive, send, client)

    async def _upload(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        headers = dict(scope.get("headers", []))
        refusal = self._upload_refusal(headers, client)
        if refusal is not None:
            for message in _refusal(*refusal):
                await send(message)
            return
        _, options = parse_options_header(headers.get(b"content-type", b""))
        boundary = options.get(b"boundary", b"")
        guarded = OneFilePerRequest(receive, boundary) if boundary else receive
        body = bytearray()
        status = [0]

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif message["type"] == "http.response.body" and status[0] == 200 and len(body) < 1024**2:
                body.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, guarded, capture)
        if status[0] == 200:
            try:
                paths = [str(p) for p in json.loads(bytes(body))]
            except (ValueError, TypeError):
                paths = []
            self.ledger.record(client, paths)

    def _upload_refusal(self, headers: dict[bytes, bytes], client: str) -> tuple[int, str] | None:
        declared = headers.get(b"content-length", b"")
        if not declared.isdigit():
            return 411, "upload: send the file with a Content-Length (no chunked uploads)"
        size, q = int(declared), self.quotas
        if size > q.upload_bytes + MULTIPART_SLACK:
            return 413, f"upload: {size:,} bytes is over this server's {q.upload_bytes:,}-byte limit per upload"
        held = self.ledger.held(client)
        if held + size > q.client_bytes:
            return 429, (
                f"upload: you hold {held:,} bytes of uploads here and this one is {size:,}; the limit is "
                f"{q.client_bytes:,} per client (uploads are deleted after an hour)"
            )
        everyone = self.ledger.held()
        if everyone + size > q.total_bytes:
            return 429, f"upload: this server holds {everyone:,} bytes of uploads, its limit; try again later"
        return None

    async def _join(self, scope: Scope, receive: Receive, send: Send, client: str) -> None:
        pending = self._pending(client) + self._joining.get(client, 0)
        if pending >= self.quotas.pending_per_client:
            for message in _refusal(
                429,
                f"queue: you already have {pending} requests waiting or running (at most "
                f"{self.quotas.pending_per_client} per client); wait for one to finish",
            ):
                await send(message)
            return
        self._joining[client] = self._joining.get(client, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            self._joining[client] -= 1
            if not self._joining[client]:
                del self._joining[client]

    def _pending(self, client: str) -> int:
        """This client's events in Gradio's queue, waiting or running."""
        queue = getattr(self.blocks, "_queue", None)
        if queue is None:
            return 0
        events = [e for q in list(queue.event_queue_per_concurrency_id.values()) for e in list(q.queue)]
        events += [e for job in list(queue.active_jobs) if job for e in job]
        return sum(1 for event in events if self._owner(event) == client)

    def _owner(self, event: Any) -> str:
        request = getattr(event, "request", None)
        if request is None:
            return ""
        peer = request.client
        headers = list(request.headers.raw)
        return client_key(headers, (peer.host, peer.port) if peer else None, self.trust_proxy)


def refusing_urls(component: gr.File, field: str = "trace") -> gr.File:
    """`component`, made to refuse a FileData whose path is a URL before any download.

    Gradio would fetch such a URL whole, into memory, before a handler's type or size check (an API or
    MCP caller can send one; an 800 MiB body cost +1.8 GB). This app has no use for remote files. (Not
    a subclass: Gradio writes a `.pyi` stub beside any module that defines a component class.)
    """
    move = component.async_move_resource_to_block_cache

    async def uploads_only(url_or_file_path: str | Path | None) -> str | None:
        if isinstance(url_or_file_path, str) and url_or_file_path.lower().startswith(("http://", "https://")):
            raise gr.Error(f"{field}: upload the file; this app does not fetch URLs", print_exception=False)
        return await move(url_or_file_path)

    component.async_move_resource_to_block_cache = uploads_only  # type: ignore[method-assign]
    return component

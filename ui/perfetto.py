"""Open in Perfetto: a trace on this page handed to the Perfetto UI in a new tab, with no token and no upload.

Perfetto's documented deep-linking protocol (perfetto.dev/docs/visualization/deep-linking-to-perfetto-ui):
`window.open(perfetto)`, then `PING` until the new window answers `PONG` (the channel is not buffered: a
message sent before its listener is registered is lost), then one `{perfetto: {buffer, title, fileName}}`.
The bytes go from this page to the Perfetto tab inside the browser. Hub sharing (ui/share.py) stays, for
permanent links.
"""

from __future__ import annotations

import html
import json
import os
from urllib.parse import urlsplit

import gradio as gr

URL_ENV = "ATTENTION_PROFILER_PERFETTO_URL"
DEFAULT_URL = "https://ui.perfetto.dev"
PING_MS = 50  # how often to ask the new tab whether it listens yet
GIVE_UP_MS = 20_000  # past this without a PONG the tab is not Perfetto, or never loaded

NOTE = (
    "**Open in Perfetto** opens the trace in a new tab at {host}, straight from this page: no token, no upload. "
    "Perfetto asks *Open trace?* when this page is not on localhost: answer **Yes**."
)

# The click handler. It opens the tab first, synchronously, while the click still counts as the user's
# gesture (a pop-up blocker refuses window.open later). Every message shown is built here from constants
# and numbers: nothing from the trace or its file name reaches the Markdown.
_OPEN = """
async (trace) => {
  const target = %(url)s;
  if (!trace || !trace.url) return "No trace yet: run a profile or upload a trace first.";
  const tab = window.open(target);
  if (!tab) return "The browser blocked the Perfetto tab: allow pop-ups for this page, then click again.";
  const origin = new URL(target).origin;
  const name = trace.orig_name || trace.path.split("/").pop();
  const bytes = fetch(trace.url).then((r) => {
    if (!r.ok) throw new Error("the trace could not be read (HTTP " + r.status + ")");
    return r.arrayBuffer();
  });
  const ready = new Promise((resolve, reject) => {
    const started = Date.now();
    const listen = (event) => {
      if (event.source === tab && event.origin === origin && event.data === "PONG") stop(resolve);
    };
    const ping = () => {
      if (tab.closed) return stop(() => reject(new Error("the Perfetto tab was closed")));
      if (Date.now() - started > %(give_up)d) {
        return stop(() => reject(new Error("Perfetto did not answer within %(give_up_s)d s")));
      }
      tab.postMessage("PING", origin);
    };
    const timer = setInterval(ping, %(ping)d);
    const stop = (settle) => { clearInterval(timer); window.removeEventListener("message", listen); settle(); };
    window.addEventListener("message", listen);
    ping();
  });
  try {
    const [buffer] = await Promise.all([bytes, ready]);
    const size = buffer.byteLength;
    // Sent once, as the file's own bytes: Perfetto reads .json and .json.gz alike, and fileName keeps the extension.
    tab.postMessage({perfetto: {buffer: buffer, title: name, fileName: name}}, origin, [buffer]);
    return "Sent the trace (" + size.toLocaleString("en-US") + " bytes) to the Perfetto tab.";
  } catch (error) {
    return "Could not open the trace in Perfetto: " + error.message + ".";
  }
}
"""


def perfetto_url() -> str:
    """The Perfetto UI to open: `ATTENTION_PROFILER_PERFETTO_URL` (a test's local stub), else ui.perfetto.dev."""
    url = os.environ.get(URL_ENV, "").strip() or DEFAULT_URL
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{URL_ENV}: give an http(s) URL, got {url[:200]!r}")
    return url


def open_js(url: str, give_up_ms: int = GIVE_UP_MS) -> str:
    """The click handler's JavaScript for the Perfetto UI at `url` (a JSON string literal inside it): an async
    function of the File's value that resolves to the status line; `give_up_ms` without a PONG ends it."""
    values = {"url": json.dumps(url), "ping": PING_MS, "give_up": give_up_ms, "give_up_s": give_up_ms // 1000}
    return _OPEN % values


def perfetto_button(trace: gr.File) -> None:
    """An "Open in Perfetto" button for the file in `trace`, its status line, and a note on Perfetto's prompt.

    The URL is read when the page is built. The elem_ids derive from the trace's (`<id>-perfetto`,
    `<id>-perfetto-status`), so the button can sit under several files on one page."""
    url = perfetto_url()
    prefix = f"{trace.elem_id}-perfetto" if trace.elem_id else None
    with gr.Row(equal_height=True):
        button = gr.Button("Open in Perfetto", size="sm", scale=0, min_width=160, elem_id=prefix)
        status = gr.Markdown(elem_id=prefix and f"{prefix}-status", latex_delimiters=[])
    gr.Markdown(NOTE.format(host=html.escape(urlsplit(url).netloc)), elem_classes="perfetto-note")
    button.click(None, trace, status, js=open_js(url), api_visibility="private", queue=False)

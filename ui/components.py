"""Components that tell API and MCP callers what the app accepts: integers with their ranges, and trace
files that must be uploaded first.

Gradio builds an endpoint's schema from its input components' `api_info()`, and its MCP tool schemas
from that. Defining a component class makes Gradio write a `.pyi` stub beside this module (ignored by
git); `is_template` keeps the page rendering them as the built-in component they extend.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.data_classes import FileData
from gradio_client.utils import is_file_obj_with_meta
from pydantic import ConfigDict, PrivateAttr, ValidationInfo, model_validator

from endpoints.common import app_error


def integer_ranges() -> dict[str, tuple[int, int]]:
    """Each integer run parameter's accepted range, from `attention.LIMITS` (the spec's own bounds):
    kv_heads, q_len and window are 0 (their neutral value) up to the bound of what they count."""
    from attention import LIMITS

    return {
        **LIMITS,
        "kv_heads": (0, LIMITS["heads"][1]),
        "q_len": (0, LIMITS["seq_len"][1]),
        "window": (0, LIMITS["seq_len"][1]),
    }


class Integer(gr.Number):
    """A whole-number field whose API schema says `{"type": "integer", "minimum", "maximum"}`.

    It keeps `precision=None` and no component bounds: `precision=0` would round 2.5 to 2 silently, and
    Gradio's own bound check words its error without the field's name. The spec's validation rejects
    both with a message that names the field.
    """

    is_template = True

    def __init__(self, value: float | None = None, *, low: int, high: int, **options: Any) -> None:
        self.low, self.high = low, high
        super().__init__(value, precision=None, minimum=None, maximum=None, **options)

    def get_config(self, cls: type | None = None) -> dict[str, Any]:
        # The page gets a plain Number's props (Gradio reads them from the class's __init__ signature).
        return super().get_config(cls or gr.Number)

    def api_info(self) -> dict[str, Any]:  # type: ignore[override]
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


def integer(name: str, value: int, **options: Any) -> Integer:
    """An `Integer` for the run parameter `name`, over its range from `integer_ranges()`."""
    low, high = integer_ranges()[name]
    return Integer(value, low=low, high=high, label=name, **options)


UPLOAD_FIRST = (
    "upload the file first (POST /gradio_api/upload, one file per request), then pass the path it returns "
    'as {"path": PATH, "meta": {"_type": "gradio.FileData"}}'
)


def _what(value: Any) -> str:
    if isinstance(value, str):
        return "a text path"
    if isinstance(value, dict):
        return 'an object without "meta"'
    return f"a value of type {type(value).__name__}"


def _uploaded_file_model(field: str) -> type[FileData]:
    """FileData that lets a caller's bad value through as a refusal naming `field`, for `TraceFile.preprocess`
    to raise. (Gradio's own check raises a ValueError there, which a plain-HTTP caller receives as an
    anonymous error; an error raised inside a pydantic validator would be wrapped the same way.)"""

    class UploadedFile(FileData):
        model_config = ConfigDict(title="FileData")  # the schema gradio_client and the MCP server recognise
        _refusal: str | None = PrivateAttr(None)

        @model_validator(mode="wrap")
        @classmethod
        def validate_model(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:  # replaces FileData's
            if not (info.context and info.context.get("validate_meta")) or is_file_obj_with_meta(value):
                return handler(value)
            refused = handler({"path": "", "meta": {"_type": "gradio.FileData"}})
            refused._refusal = f"{field}: got {_what(value)}; {UPLOAD_FIRST}"
            return refused

    UploadedFile.__doc__ = FileData.__doc__
    return UploadedFile


class TraceFile(gr.File):
    """A file input that names its field when an API caller sends a path instead of an uploaded file.

    (A FileData naming a file this server did not receive is still refused by Gradio before any hook of
    ours, with an anonymous error: docs/agents.md shows the upload step.)
    """

    is_template = True

    def __init__(self, *, field: str, **options: Any) -> None:
        super().__init__(**options)
        self.data_model = _uploaded_file_model(field)

    def get_config(self, cls: type | None = None) -> dict[str, Any]:
        return super().get_config(cls or gr.File)

    def preprocess(self, payload: Any) -> Any:
        refusal = getattr(payload, "_refusal", None)
        if refusal:
            raise app_error(refusal)
        return super().preprocess(payload)

"""Markdown for the page: the one place insights (and anything else from a trace) become markup.

Strings from a trace are data. Op and kernel names are attacker-controlled on a public Space
(an uploaded trace can name an op `<img src=…>` or `[Open in Perfetto](javascript:…)`), and
Gradio's sanitizer keeps some of that. So every character CommonMark gives a meaning to is
backslash-escaped, which renders it literally and leaves no tag, link or emphasis behind.
"""

from __future__ import annotations

import re
import string

from profiling.insights import Insight

_PUNCTUATION = re.compile("([" + re.escape(string.punctuation) + "])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")
NO_INSIGHT = "_No insight rule fired for this trace._"


def escape(text: str) -> str:
    """`text` as literal Markdown: every ASCII punctuation character escaped, one line."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_BREAKS.sub(" ", str(text)))


def insights_markdown(insights: list[Insight]) -> str:
    """A bullet per insight, its title in bold; all of it escaped."""
    if not insights:
        return NO_INSIGHT
    return "\n".join(f"- **{escape(i.title)}**: {escape(i.detail)}" for i in insights)

"""Text from outside the exporter, made safe once: the one place that decodes and bounds it.

Names that tenants and other programs choose (process names from /proc and NVML, user names from
passwd, cgroup paths, environment variables, pod names from the kubelet) arrive as bytes that need
not be UTF-8, or as ``str`` carrying surrogate escapes (``pwd`` decodes a Latin-1 passwd entry that
way).  Such a string cannot be encoded as UTF-8, so one of them in a label would break every
scrape.  Everything from outside goes through :func:`text` where it is read, and label values
through :func:`label` where they are written, so neither a bad byte nor a 100 KB name can cost
more than its own series.

Printing is the other edge: :func:`for_terminal` escapes what a terminal would act on (an ESC
sequence can set the window title or clear the screen), :func:`for_markdown` what Markdown and
HTML would interpret.
"""

from __future__ import annotations

import hashlib
import re

# Longest label value written as-is, in characters: longer than any Kubernetes name (253) or Unix
# user name; a longer value keeps its first characters and a hash of the whole, so two long values
# that share a prefix stay two series.
LABEL_MAX = 256
_HASH_CHARS = 12

# Control characters, line and paragraph separators, and every format character (Unicode's Cf):
# the bidi embeddings, overrides and isolates (U+202A-E, U+2066-9: "U+202E" makes "gpj.exe" read
# "exe.jpg"), the zero-width ones (U+200B-F, U+2060-4, U+FEFF) and the rest of Cf, which a
# terminal shows as nothing or lets reorder what follows.  The ranges are Unicode 15's Cf;
# tests/test_hostile_names.py holds them to this Python's unicodedata.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
# What changes meaning inside a Markdown table cell (GitHub's flavour): emphasis, code, links,
# strikethrough, the cell separator, and raw HTML or entities.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&])")


def text(raw: bytes | str) -> str:
    """``raw`` as text that is always valid Unicode: bad UTF-8 bytes (and the surrogate escapes
    that stand for them in a ``str``) become U+FFFD."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    try:
        raw.encode("utf-8")
        return raw
    except UnicodeEncodeError:
        pass
    try:  # surrogate escapes stand for the bytes that were not UTF-8: decode those leniently
        return raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a lone surrogate of another kind
        return raw.encode("utf-8", "replace").decode("utf-8")


def label(value: str, limit: int = LABEL_MAX) -> str:
    """A label value that can be encoded and is at most ``limit`` characters long.

    A longer value is cut and ends in ``~`` and 12 hex digits of its SHA-256, so distinct values stay
    distinct (two equal series in one family would make Prometheus reject the whole scrape)."""
    value = text(value)
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    return f"{value[: limit - _HASH_CHARS - 1]}~{digest}"


def _escape_control(m: re.Match[str]) -> str:
    c = m.group(0)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
    )


def for_terminal(value: str) -> str:
    """``value`` with every control character written as an escape, so printing it moves no cursor,
    sets no title, clears nothing and breaks no table row."""
    return _CONTROL.sub(_escape_control, text(value))


def for_markdown(value: str) -> str:
    """``value`` for a Markdown table cell: on one line, with Markdown's and HTML's special
    characters escaped (a raw ``<script>`` or ``|`` stays text)."""
    flat = " ".join(for_terminal(value).replace("\\n", " ").replace("\\r", " ").split())
    return _MARKDOWN.sub(r"\\\1", flat)

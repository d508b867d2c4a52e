"""What of a setting may be shown: secrets are redacted by key and by URL, at the one place every
message about settings goes through.

Errors about settings reach stderr, ``--once``'s JSON (which monitoring UIs display) and the
``config_reload_failed`` log line.  A value quoted there passes :func:`redacted` first: a secret
key's value is never shown, nor a URL's password, nor its path and query (Slack- and Discord-style
webhook URLs carry their secret in the path).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

HIDDEN = "<secret, not shown>"
# Keys whose values are secrets, wherever they appear in a settings tree.
_SECRET_KEY = re.compile(r"(password|token|secret|credential|(^|_)key$)", re.IGNORECASE)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*[^\s'\".,:;)\]]")  # not the sentence's punctuation


def is_secret_key(key: object) -> bool:
    """A key whose value is a secret (a ``*_file`` key names a file: its path is shown)."""
    return isinstance(key, str) and not key.endswith("_file") and bool(_SECRET_KEY.search(key))


def redact_url(url: str) -> str:
    """The URL's scheme, host and port; a user name stays, a password, path and query do not."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return HIDDEN
    user = f"{parts.username}:***@" if parts.password is not None else (f"{parts.username}@" if parts.username else "")
    rest = "/..." if parts.path not in ("", "/") or parts.query or parts.fragment else parts.path
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{user}{host}{port}{rest}"


def redact_text(text: str) -> str:
    """Every URL in ``text`` redacted (for messages that quote one, such as a library's error)."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redacted(value: Any, key: object = None) -> Any:
    """``value`` (a setting, or a tree of them) with every secret replaced: safe to quote."""
    if is_secret_key(key):
        return HIDDEN if value is not None else None
    if isinstance(value, dict):
        return {k: redacted(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(v) for v in value)
    if isinstance(value, str) and "://" in value:
        return redact_text(value)
    return value

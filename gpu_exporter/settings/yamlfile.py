"""Reading the YAML files a person writes (the config file, the web config), with errors that name
the file and stay short, whatever is in it.

- The file must be UTF-8 text; the message says where the first bad byte is.
- YAML aliases may not expand to more than ``MAX_VALUES`` values: a 400-byte "billion laughs"
  file would otherwise become 9^9 values when validated or printed.
- Values quoted in messages go through ``short()``, so no message grows with the input.
"""

from __future__ import annotations

import reprlib
from pathlib import Path
from typing import Any

import yaml

MAX_VALUES = 100_000
MAX_MESSAGE = 2000

_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3


class YamlFileError(Exception):
    pass


def short(value: object) -> str:
    """``repr(value)``, cut short for a message."""
    return _repr.repr(value)


def clip(message: str, limit: int = MAX_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 20] + " ... (cut short)"


def read_mapping(path: Path, what: str) -> dict[str, Any] | None:
    """The mapping in a YAML file, None if it is empty; YamlFileError saying what is wrong."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise YamlFileError(f"cannot read {what} {path}: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise YamlFileError(
            f"{what} {path} is not UTF-8 text: byte 0x{raw[e.start]:02x} on line {line} (save it as UTF-8)"
        ) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise YamlFileError(clip(f"{what} {path} is not valid YAML: {e}")) from e
    except RecursionError as e:
        raise YamlFileError(f"{what} {path} is nested too deeply") from e
    if data is None:
        return None
    if not isinstance(data, dict):
        raise YamlFileError(f"{what} {path} must hold a mapping of settings, not a {type(data).__name__}")
    if _expanded_size(data, MAX_VALUES) > MAX_VALUES:
        raise YamlFileError(
            f"{what} {path} expands to more than {MAX_VALUES} values (YAML aliases repeating each other?)"
        )
    return data


def _expanded_size(data: object, budget: int) -> int:
    """How many values ``data`` holds, counting shared (aliased) ones each time; stops past ``budget``."""
    seen = 0
    stack = [data]
    while stack and seen <= budget:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return seen

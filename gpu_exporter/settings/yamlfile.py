"""Reading the YAML files a person writes (the config file, the web config), with errors that name
the file and stay short, whatever is in it.

- The file must be UTF-8 text; the message says where the first bad byte is.
- YAML aliases may not expand to more than ``MAX_VALUES`` values: a 400-byte "billion laughs"
  file would otherwise become 9^9 values when validated or printed.
- Values quoted in messages go through ``short()``, so no message grows with the input.
- Every file a person names (these, certificates, ``*_file`` secrets) is read by ``read_bounded``:
  only a regular file, opened without blocking and read no further than a bound, so a named pipe,
  a device or a 512 MiB file in its place is refused at once instead of hanging or bloating the
  daemon.
"""

from __future__ import annotations

import errno
import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_VALUES = 100_000
MAX_MESSAGE = 2000
# The most a config, web config, certificate or secret file may hold: each is a few KiB at most.
MAX_FILE_BYTES = 1 << 20
MAX_SECRET_BYTES = 1 << 16  # a token, a password or a URL in a *_file
_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))  # fmt: skip

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


def open_regular(path: Path | str, *, follow: bool = True) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file at ``path`` and its stat on opening; else OSError saying what it is instead (its
    strerror: "a named pipe, not a regular file").  Opened non-blocking, so a FIFO without a writer
    is refused at once rather than waited on; without ``follow``, a symbolic link is refused (ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise OSError(errno.EINVAL, f"{kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_bounded(path: Path | str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at ``path`` (``open_regular``), if it holds at most ``limit``;
    else OSError saying what it is instead ("larger than 1048576 bytes")."""
    fd, _ = open_regular(path)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit and (chunk := os.read(fd, min(1 << 16, limit + 1 - got))):
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return b"".join(chunks)


def read_mapping(path: Path, what: str) -> dict[str, Any] | None:
    """The mapping in a YAML file, None if it is empty; YamlFileError saying what is wrong."""
    try:
        raw = read_bounded(path)
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

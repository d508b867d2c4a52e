"""The tests of gpu-exporter, and what tests of a message share: ``assert_mentions``."""

from __future__ import annotations


def assert_mentions(message: str, *facts: str) -> None:
    """Asserts that ``message`` carries each of ``facts`` (a value, a name, the fix), whatever the wording
    around them: a test that pins a whole sentence breaks on every rewording and does not say which part
    matters."""
    missing = [fact for fact in facts if fact not in message]
    assert not missing, f"{message!r} does not mention {missing!r}"

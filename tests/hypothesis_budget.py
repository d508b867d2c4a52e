"""How many examples a Hypothesis property test tries: its budget in the whole suite, less in ``--fast``.

The whole suite (CI's gate) runs Hypothesis' default profile: a test's ``examples(n)`` is ``n``, as
the test asks.  ``pytest --fast`` loads the ``fast`` profile instead (tests/conftest.py): a tenth of
the examples, for every property test, those that ask for a number through ``examples`` and those
that take Hypothesis' default.  ``--hypothesis-profile`` given on the command line wins over both.
"""

from __future__ import annotations

from hypothesis import settings

FAST = "fast"
DEFAULT_EXAMPLES = 100  # Hypothesis' own default, the budget a test's ``n`` is relative to
FAST_EXAMPLES = 10

settings.register_profile(FAST, max_examples=FAST_EXAMPLES)


def examples(n: int) -> int:
    """``n`` examples under the default profile, and as many in proportion under the loaded one
    (at least one).  Read when the test module is imported, after the profile is loaded."""
    return max(1, n * settings().max_examples // DEFAULT_EXAMPLES)

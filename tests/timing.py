"""Time in tests: what a busy machine may cost, so that no test depends on how fast this one is.

A test asserts what happened (the error, the state, the exit status), not how long it took.  Where
the duration is the behaviour (a deadline, a timeout, a prompt stop), it is asserted against the
deadline under test plus ``LATE_S``; where a test must prove that something did *not* wait for a
timeout, the timeout is ``NEVER_S``, and the outcome (anything but a timeout) is the proof.

The suite must pass on a 2-core machine with ``stress-ng --cpu 4`` beside it: each thread gets a
third of a core and is scheduled hundreds of milliseconds late; a subprocess takes seconds to start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The most a busy machine may add to a deadline under test before its effect is seen: ten times the
# scheduling delays measured with four CPU hogs on two cores, and far less than ``NEVER_S``, so a
# test still tells "ended at the deadline" from "waited for what it must not wait for".
LATE_S = 10.0

# A timeout, a hang or a wait that no delay of a busy machine reaches.  A call given this long that
# ends any other way than by a timeout did not wait for it; a server that holds a connection this
# long makes a client that should have given up earlier fail the test instead of passing by luck.
NEVER_S = 60.0


def wait_until(condition: Callable[[], object], timeout: float = NEVER_S, interval: float = 0.005) -> bool:
    """Whether ``condition`` became true within ``timeout`` seconds (checked every ``interval``).

    For a condition the test expects: it returns as soon as it holds, so the generous default costs
    time only when the code under test is wrong.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True

"""Servers that tests write by hand: the accept loop they share."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def serve_connections(
    listener: socket.socket, handle: Callable[[socket.socket], object], stopping: threading.Event
) -> threading.Thread:
    """Accepts on ``listener`` until ``stopping`` is set or it is closed; each connection goes to
    ``handle`` on a daemon thread of its own.  Returns the accepting thread, started.

    The listener gets a short accept timeout (unless it has one), so that the loop sees ``stopping``.
    """
    if listener.gettimeout() is None:
        listener.settimeout(0.05)

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed under us: the test is over
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return thread

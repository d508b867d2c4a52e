"""Web: the hardened HTTP server that every page is served by, and the exporter-toolkit web config.

It knows HTTP, TLS and basic auth, and nothing of what it serves: the wiring hands it the pages
(a path and a function that returns the status, bytes, content type and headers of an answer).

- ``address``: ``HOST:PORT`` as the flags take it (no asyncio, no ssl: the settings parse it).
- ``server``: the asyncio loop in its own thread and what one request may hold; ``http``: request
  heads read and answers written, byte by byte as RFC 9112 says.
- ``connection`` (one client socket) and ``table`` (every socket: places, eviction, handshake
  slots, memory back); ``tls``: the one adapter over asyncio's private ``SSLProtocol``; ``fds``:
  the file descriptor limit.
- ``config`` (the web config file, key by key against exporter-toolkit's), ``tls_context`` and
  ``ciphers`` (what its TLS keys become in Python's ssl), ``watcher`` (reloading it), ``auth``
  (basic auth: bcrypt, remembered answers, the bounded queue of checks) and ``rate_limit``;
  ``pacing``: what a client can make the server log, at most once an interval, with a count.

May import: the parsing helpers in ``settings`` (``yamlfile``, ``durations``) and the package version.
Never: ``snapshot``, ``sources``, ``serving``, ``alerting``, ``kubernetes``, ``accounting``,
``report`` or the wiring.  What is shown is decided elsewhere; this part only serves it, and a
part that shows something never reaches the server but through the wiring.
"""

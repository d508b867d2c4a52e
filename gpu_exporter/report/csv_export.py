"""``report --format csv``: the report's cost as a spreadsheet reads it, one row per GPU, holder, price
period and state (``charges``), whose costs add up to the report's total to the last digit.

Names come from labels that tenants choose (pods, jobs, containers, users): a cell that a spreadsheet
would read as a formula (one starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) is
neutralised as OWASP's "CSV Injection" page advises, by a leading ``'``; quotes, commas and line
breaks are quoted by the csv module.  An unknown figure is an empty cell, never 0.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from ..untrusted import for_terminal
from .charges import Charge, charges
from .cost import Part

COLUMNS = ("node", "gpu", "uuid", "model", "holder_kind", "holder", "namespace", "pod", "hpc_job", "container",
           "container_engine", "user", "state", "period_start", "period_end", "hours", "price_per_hour", "price_basis",
           "cost", "currency")  # fmt: skip
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def safe(text: str) -> str:
    """Text a spreadsheet shows as text: a leading ``'`` before what it would read as a formula, and
    other control characters than line breaks and tabs written as escapes (a file that is ``cat`` to a
    terminal drives no cursor)."""
    text = "'" + text if text.startswith(_FORMULA) else text
    # Line breaks and tabs stay: the csv module quotes them, and a name reads back whole.
    return "".join(c if c in "\r\n\t" or c.isprintable() else for_terminal(c) for c in text)


def number(v: float | None, digits: int = 6) -> str:
    """A figure as plain decimal digits (no exponent, no sign for a positive value), at least one and at
    most ``digits`` after the point (a parser that guesses types reads 10 as an integer, 10.0 as a
    decimal); an unknown one is empty."""
    if v is None:
        return ""
    text = f"{v + 0.0:.{digits}f}".rstrip("0")
    text = text + "0" if text.endswith(".") else text
    return "0.0" if text == "-0.0" else text


def _row(c: Charge) -> list[str]:
    h = c.holder
    text = [c.node, c.gpu, c.uuid, c.model or "", h.kind, h.name, h.namespace, h.pod, h.hpc_job, h.container,
            h.engine, h.user]  # fmt: skip
    return [
        *(safe(x) for x in text),
        c.state,
        c.period_start,
        c.period_end,
        number(c.hours),
        number(c.price_per_hour),
        c.basis or "",
        "" if c.cost is None else str(c.cost),
        safe(c.currency or ""),  # checked where it is read (client.CURRENCY); neutralised here all the same
    ]


def write(rows: Iterable[Charge]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")  # RFC 4180's line ending
    w.writerow(COLUMNS)
    w.writerows(_row(c) for c in rows)
    return out.getvalue()


def as_csv(parts: Sequence[Part], doc: dict[str, Any]) -> str:
    return write(charges(parts, doc))

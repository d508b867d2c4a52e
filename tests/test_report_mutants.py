"""The report's money column: every amount in every format goes through ``money``, so a wrong symbol,
a lost currency or a rounding step shows on every line a reader compares with their invoice."""

from __future__ import annotations

import pytest

from gpu_exporter.report.rightsizing import money


@pytest.mark.parametrize(
    ("amount", "currency", "text"),
    [
        (1234.4, "GBP", "£1,234"),  # whole units from 100 up
        (100.0, "USD", "$100"),
        (99.5, "USD", "$99.50"),  # cents below 100
        (-250.0, "EUR", "€-250"),  # a negative saving is rounded like a positive one
        (5.0, "JPY", "¥5.00"),
        (12.5, "CHF", "12.50 CHF"),  # no symbol: the code after the figure
        (12.5, None, "12.50"),  # no currency known: the figure alone
    ],
)
def test_amounts_are_written_with_their_currency_and_rounded_by_size(amount: float, currency: str | None,
                                                                     text: str) -> None:  # fmt: skip
    assert money(amount, currency) == text

"""PCIe throughput from the byte counters, checked against the driver's own sample.

``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES`` count bytes since the driver loaded, and nvml.h warns
"Value can be wrapped".  How wide they are is not documented: every L40S reading posted in
dcgm-exporter #721 is below 2^32, although the driver answers "unsigned long long".  So:

* A counter is as wide as its value type says, except that a 64-bit type is taken for 32 bits
  until the counter has shown a value of 2^32 or more.  Differences are taken modulo that width, so
  a wrap between two polls is a wrap, not a reset, and ``gpu_pcie_*_bytes_total`` keep counting up.
* A 32-bit counter that wraps more than once between polls (4 GiB: under a second at Gen4/Gen5
  speeds) comes out short by a multiple of 4 GiB, and nothing in the counter says so.  So the rate
  the counters give is checked against ``nvmlDeviceGetPcieThroughput`` (the driver watching the link
  for 20 ms) at each static refresh, and where a narrow counter moved more than half its range in
  one poll.  Where they disagree beyond ``TOLERANCE`` of the larger (and by more than ``FLOOR``), a
  counter that may be narrow is not used: the rate is the driver's sample, and the counter, short,
  is not exported.  A counter that has shown 2^32 or more cannot have wrapped, and stays in use
  whatever the sample says (a 20 ms glimpse of a bursty load).
* The sample blocks for 40 ms and costs the driver 1.4 ms of CPU (an H200), so apart from the first
  poll and the static refresh's check it is taken at the slow cadence (``paced``): a busy L40S, whose
  32-bit counters move more than half their range in every 5 s poll, is checked once per
  ``poll_slow_interval``, its counter standing in between as long as the last check agreed; one that
  disagreed shows the last sample until a later one agrees with the counter again.

Nothing here calls the driver: the backend hands over the counters of each poll and a way to take
the sample.
"""

from __future__ import annotations

from collections.abc import Callable

Sample = tuple[float | None, float | None] | None  # bytes per second (tx, rx), None where unavailable
Paced = Callable[[], tuple[Sample, bool]]  # the slow cadence's sample, and whether it was taken just now
Counts = tuple[int | None, int | None, int, int]  # tx, rx (None: no counter), read at (monotonic us), bits
Totals = tuple[int | None, int | None]

MIN_SPAN_S = 0.1  # the shortest span between two readings worth dividing by
TOLERANCE = 0.5  # a counter short by a lost 4 GiB wrap in a 1 s poll is off by far more than this
FLOOR = 64 * 2**20  # bytes per second: below this, two readings of an idle link always agree
_NARROW = 32  # bits a 64-bit answer is taken for until the counter passes 2^32


class PcieCounters:
    """One GPU's two byte counters across polls (and static refreshes of the same GPU)."""

    def __init__(self) -> None:
        self._wide = [False, False]  # the counter has shown 2^32 or more: it is 64 bits wide
        self._last: tuple[int | None, int | None] | None = None  # the raw readings of the previous poll
        self._totals: list[int | None] = [None, None]  # the counters unwrapped: gpu_pcie_*_bytes_total
        self._counted: tuple[int, int, int] | None = None  # totals and when read, as a rate was last taken
        self._rates: tuple[float, float] | None = None
        self._check_due = True
        self._pending: Sample = None  # a sample of the previous poll, to check the first rate against
        self._trusted = True

    def recheck(self) -> None:
        """A static refresh: check the counters against the driver's sample again."""
        self._check_due = True

    def poll(
        self, counts: Counts | None, sample: Callable[[], Sample], paced: Paced | None = None
    ) -> tuple[Sample, Totals | None]:
        """This poll's rates (bytes per second) and the counters to export (None: not exported).
        ``sample`` takes the driver's sample now; ``paced`` gives the slow cadence's (without it, a
        sample now at every call)."""
        if paced is None:
            paced = lambda: (sample(), True)  # noqa: E731
        if counts is None:  # no counters (a GeForce, a driver before R550): the sample, paced
            self._last = self._counted = None
            return paced()[0], None
        tx, rx, read_at, bits = counts
        jumped = self._unwrap((tx, rx), bits)
        if tx is None or rx is None:  # one direction has no counter: no rate from them, only totals
            self._counted = None
            return paced()[0], self._shown()
        rates, fresh = self._rate(read_at)
        if rates is None:
            first = sample()  # the first poll: no rate yet, the driver's sample meanwhile
            if self._check_due:
                self._pending = first
            return first, self._shown()
        taken: Sample = None
        if fresh and self._check_due:  # a static refresh: checked now
            taken = self._pending if self._pending is not None and not jumped else sample()
        elif fresh and (jumped or not self._trusted):
            # A narrow counter that may have wrapped unseen, or one that disagreed: checked when the
            # slow cadence takes its sample, not every poll.  Meanwhile a trusted counter stands and
            # an untrusted one gives way to the last sample.
            paced_sample, new = paced()
            taken = paced_sample if new else None
            if not self._trusted and not new:
                return paced_sample, None
        if taken is not None:
            self._pending = None
            self._check_due = False
            self._trusted = self._agree(rates, taken)
        if not self._trusted:
            return taken if taken is not None else paced()[0], None
        return rates, self._shown()

    def _unwrap(self, raw: tuple[int | None, int | None], bits: int) -> bool:
        """Add this poll's differences to the totals; True when a narrow counter moved more than half
        its range (a rate near the limit its width allows)."""
        last, self._last = self._last, raw
        jumped = False
        for d in (0, 1):
            now, then, total = raw[d], last[d] if last is not None else None, self._totals[d]
            if now is None or then is None or total is None:
                self._totals[d] = now
                continue
            if now >= 2**_NARROW:
                self._wide[d] = True
            width = bits if bits < 64 else (64 if self._wide[d] else _NARROW)
            delta = now - then
            if delta < 0 and width == 64:  # a 64-bit counter going back was reset: start over
                self._totals[d], self._counted = now, None
                continue
            delta %= 2**width
            jumped |= width < 64 and delta > 2 ** (width - 1)
            self._totals[d] = total + delta
        return jumped

    def _rate(self, read_at: int) -> tuple[tuple[float, float] | None, bool]:
        tx, rx = self._totals
        assert tx is not None and rx is not None  # both counters answered (poll checks)
        now = (tx, rx, read_at)
        then = self._counted
        if then is None:
            self._counted, self._rates = now, None
            return None, False
        span = (read_at - then[2]) / 1e6
        if span < MIN_SPAN_S:  # too short to divide by: the last rate stands, the span goes on
            return self._rates, False
        self._counted = now
        self._rates = ((now[0] - then[0]) / span, (now[1] - then[1]) / span)
        return self._rates, True

    def _agree(self, rates: tuple[float, float], taken: tuple[float | None, float | None]) -> bool:
        """Whether the counters may be used: those that may be narrow agree with the sample."""
        for d in (0, 1):
            s = taken[d]
            if self._wide[d] or s is None:
                continue
            if abs(rates[d] - s) > max(TOLERANCE * max(rates[d], s), FLOOR):
                return False
        return True

    def _shown(self) -> Totals | None:
        return (self._totals[0], self._totals[1]) if self._trusted else None

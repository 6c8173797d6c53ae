"""What one benchmark run measured: every round of a benchmark
(:class:`Result`), the scaling samples (:class:`ScalingResult`) and how busy
the machine was meanwhile (:class:`Load`).  ``run.py`` fills them and
``report.py`` prints them; neither imports the other."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import cases
from common import Sample, median

__all__ = ["Load", "Result", "ScalingResult"]


@dataclass
class Result:
    """Every round of one benchmark, and what its audit counted."""

    name: str
    title: str
    commits: str
    events: int
    target: cases.Target | None
    lib: list[Sample] = field(default_factory=list)
    floor: list[Sample] = field(default_factory=list)  # the reference side's samples
    # "library" / "floor" (the row's library and reference side) ->
    # (durable, empty, no-fsync commits) per event, from the audit run
    audit: dict[str, tuple[float, ...]] = field(default_factory=dict)
    lib_side: str = cases.LIBRARY
    ref_side: str = cases.FLOOR
    bench: str = ""  # the benchmark that produced it (for --only and profiling)
    missing: str = ""  # why the row could not be measured ("" when it was)

    @property
    def available(self) -> bool:
        return not self.missing and bool(self.lib) and bool(self.floor)

    @property
    def ref_label(self) -> str:
        return "floor" if self.ref_side == cases.FLOOR else cases.SIDE_LABELS[self.ref_side]

    @property
    def lib_us(self) -> float:
        return median(s.us_per_event for s in self.lib)

    @property
    def floor_us(self) -> float:
        return median(s.us_per_event for s in self.floor)

    @property
    def lib_cpu(self) -> float:
        return median(s.cpu_us_per_event for s in self.lib)

    @property
    def floor_cpu(self) -> float:
        return median(s.cpu_us_per_event for s in self.floor)

    @property
    def time_ratio(self) -> float:
        """Median over rounds of (library time / floor time) per event, paired by round."""
        return median(a.us_per_event / b.us_per_event for a, b in zip(self.lib, self.floor))

    @property
    def ratio(self) -> float:
        """The ratio the target reads: time ratio, or throughput ratio (library / floor events/s)."""
        if self.target is not None and self.target.kind == "throughput":
            return median(b.us_per_event / a.us_per_event for a, b in zip(self.lib, self.floor))
        return self.time_ratio

    @property
    def met(self) -> bool | None:
        if self.target is None or not self.available:
            return None
        return self.target.met(self.ratio)

    @property
    def spread(self) -> tuple[float, float]:
        """Smallest and largest per-round ratio (how noisy the rounds were)."""
        if self.target is not None and self.target.kind == "throughput":
            values = [b.us_per_event / a.us_per_event for a, b in zip(self.lib, self.floor)]
        else:
            values = [a.us_per_event / b.us_per_event for a, b in zip(self.lib, self.floor)]
        return min(values), max(values)


@dataclass
class ScalingResult:
    """Per op: samples by (side, rows), rounds in order."""

    small_rows: int
    big_rows: int
    events: int
    build_seconds: float = 0.0
    samples: dict[tuple[str, str, int], list[Sample]] = field(default_factory=dict)
    audit: dict[str, tuple[float, ...]] = field(default_factory=dict)
    target: cases.Target = cases.Scaling.target

    def us(self, op: str, side: str, rows: int) -> float:
        return median(s.us_per_event for s in self.samples[(op, side, rows)])

    def growth(self, op: str, side: str) -> float:
        """Median over rounds of (cost at big_rows / cost at small_rows), paired by round."""
        big, small = (
            self.samples[(op, side, self.big_rows)],
            self.samples[(op, side, self.small_rows)],
        )
        return median(b.us_per_event / s.us_per_event for b, s in zip(big, small))

    def vs_floor(self, op: str, rows: int) -> float:
        lib, flo = self.samples[(op, "library", rows)], self.samples[(op, "floor", rows)]
        return median(a.us_per_event / b.us_per_event for a, b in zip(lib, flo))

    def met(self, op: str) -> bool:
        return self.target.met(self.growth(op, "library"))


def _busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (/proc/stat), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    values = [int(v) for v in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Load:
    """How busy the machine was with *other* work during the run.

    ``others_cpus``: CPU time used by every other process (all busy CPU time in
    /proc/stat minus this process and its children) divided by wall time, i.e.
    how many CPUs other work kept busy on average.  Load averages are kept too,
    but they include this run and the tail of whatever ran just before it.
    """

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())
        self.sample()

    def sample(self) -> None:
        if hasattr(os, "getloadavg"):
            self.samples.append(os.getloadavg())

    @property
    def max1(self) -> float:
        return max((s[0] for s in self.samples), default=0.0)

    @property
    def mean1(self) -> float:
        return sum(s[0] for s in self.samples) / len(self.samples) if self.samples else 0.0

    @property
    def others_cpus(self) -> float | None:
        wall0, busy0, own0 = self._start
        busy1 = _busy_cpu_seconds()
        if busy0 is None or busy1 is None:
            return None
        wall = time.perf_counter() - wall0
        others = (busy1 - busy0) - (_own_cpu_seconds() - own0)
        return max(0.0, others / wall) if wall > 0 else None

"""The benchmarks: each has a library side and a raw-SQLite floor side that
do the same durable commits on their own fresh files.

A side is opened as a :class:`Session`: files created, setup and warm-up
done (untimed), and the measured work cut into *units* (one event, or one
batch of 100 events, or one whole ``process_all`` call), grouped in
*phases* (most benchmarks have one; scaling has advance, receive, apply).
The runner executes the units of all sessions of a round in small
alternating blocks (floor block, library block, library block, floor
block, ...), so both sides see the same background load, and times each
block; ``check()`` verifies the outcome after the clock stopped.
"""

from __future__ import annotations

import inspect
import os
import random
import shutil
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import prefill
import raw
from common import Event, chunks, make_events
from floor import FloorConsumer, FloorProducer, connect, create_files, fsync_file
from reliable_flow import Consumer, Producer, relay, relay_batch
from reliable_flow.reservation import RESERVATION

__all__ = ["BENCHMARKS", "RNA", "Benchmark", "Row", "Scaling", "Session", "Sizes", "Target"]

# Sides a benchmark can open: the library (default two-step consumer), the
# library with the consumer's receive-and-apply mode, the project's floor,
# and the two minimal raw pipelines of raw.py.
LIBRARY, RNA, FLOOR, RAW4, RAW2 = "library", "library_rna", "floor", "raw4", "raw2"
SIDE_LABELS = {
    LIBRARY: "library (two-step consumer)",
    RNA: "library (apply_on_receive=True)",
    FLOOR: "floor (library's schema and commits)",
    RAW4: "minimal raw 4-commit",
    RAW2: "raw 2-durable-commit",
}


def rna_available() -> bool:
    """Whether the installed library has the consumer's receive-and-apply mode."""
    return "apply_on_receive" in inspect.signature(Consumer).parameters


Unit = Callable[[], object]


@dataclass(frozen=True)
class Target:
    """A goal from the issue.  ``kind``: ``time`` (ratio = library time /
    reference time per event, must be <= limit) or ``throughput`` (ratio =
    library events/s / reference events/s, must be >= limit)."""

    kind: str
    limit: float
    text: str

    def met(self, ratio: float) -> bool:
        return ratio <= self.limit if self.kind == "time" else ratio >= self.limit


@dataclass(frozen=True)
class Row:
    """One line of the results table: side ``lib`` measured against side ``ref``
    in the same rounds (a benchmark may run more than two sides)."""

    name: str
    title: str
    lib: str
    ref: str
    commits: str
    target: Target | None = None


@dataclass(frozen=True)
class Sizes:
    """How much work one round does; ``quick()`` is the ~30 s smoke run."""

    single: int = 200  # events per round: advance / receive / relay / apply alone
    e2e: int = 200  # events per round, unbatched end to end
    batched: int = 3000  # events per round, batched end to end (chunks of 100)
    flows: int = 10_000  # process_all: flows with one pending event each
    scaling_events: int = 150  # events per op per size per round
    big_rows: int = 1_000_000  # events already in the "full" files
    small_rows: int = 1_000  # events already in the "nearly empty" files
    heavy_rounds: int = 3  # cap on rounds for process_all(batch_size=1): 10,000 fsyncs a side
    block: int = 10  # units per interleaving block

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            single=30,
            e2e=30,
            batched=500,
            flows=500,
            scaling_events=30,
            big_rows=100_000,
            heavy_rounds=2,
            block=5,
        )


@dataclass
class Session:
    """One side of one round, ready to run: ``phases`` maps a phase name to
    its units, each unit covering ``per_unit`` events."""

    phases: dict[str, list[Unit]]
    per_unit: int
    conns: list[Any]
    check: Callable[[], None] = lambda: None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in self.closers:
            close()


def _paths(workdir: str) -> tuple[str, str]:
    return os.path.join(workdir, "producer.db"), os.path.join(workdir, "consumer.db")


def _advance(producer: Any, e: Event) -> Any:
    return producer.advance(
        e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind, payload=e.payload
    )


def _expect(results: Sequence[Any], status: str, what: str) -> None:
    bad = [r for r in results if r.status != status]
    if bad:
        raise AssertionError(f"{what}: {len(bad)} results were not {status!r}, e.g. {bad[0]!r}")


def open_library(
    p_path: str, c_path: str, warm: Sequence[Event], *, apply_on_receive: bool = False
) -> tuple[Producer, Consumer]:
    """A Producer/Consumer pair, bound, with the statement cache warm.  With
    ``apply_on_receive`` the consumer stores an in-order event already applied."""
    producer = Producer(p_path, RESERVATION)
    if apply_on_receive:
        consumer = Consumer(c_path, RESERVATION, apply_on_receive=True)  # type: ignore[call-arg]
    else:
        consumer = Consumer(c_path, RESERVATION)
    for e in warm:
        assert _advance(producer, e).status == "committed"
        assert relay(producer, consumer).status == "accepted"
        if not apply_on_receive:
            assert consumer.apply_next(e.flow_id).status == "applied"
    if apply_on_receive:
        _all_applied(c_path, len(warm), "warm-up")
    return producer, consumer


def _all_applied(c_path: str, n: int, what: str) -> None:
    """Read the consumer file directly (after the clock): ``n`` inbox rows, all applied."""
    conn = sqlite3.connect(c_path)
    try:
        total, done = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'applied') FROM inbox"
        ).fetchone()
    finally:
        conn.close()
    if total != n or done != n:
        raise AssertionError(f"{what}: {total} inbox rows ({n} expected), {done} applied")


def open_raw(kind: str, p_path: str, c_path: str, warm: Sequence[Event]) -> raw.Raw4 | raw.Raw2:
    """One of the minimal raw pipelines on fresh files, warmed like the others."""
    raw.create_raw_files(p_path, c_path)
    pipeline = raw.Raw4(p_path, c_path) if kind == RAW4 else raw.Raw2(p_path, c_path)
    for e in warm:
        pipeline.one(e)
    return pipeline


def open_floor(
    p_path: str, c_path: str, warm: Sequence[Event]
) -> tuple[FloorProducer, FloorConsumer]:
    """The floor's pair, warmed the same way (files must exist)."""
    fp, fc = FloorProducer(p_path), FloorConsumer(c_path)
    for e in warm:
        fp.advance(e), fc.receive(e), fp.mark(e), fc.apply(e)
    return fp, fc


def _lib_conns(*objs: Any) -> list[Any]:
    # Audit only: the library's connections are private; read to count commits.
    return [obj._store._db.conn for obj in objs]


# -- the benchmarks ------------------------------------------------------------------------


class Benchmark:
    """One named comparison, library vs floor, on fresh files each round."""

    name = ""
    title = ""
    commits = ""  # what the durable commits are, for the report
    target: Target | None = None
    heavy = False  # rounds capped by Sizes.heavy_rounds
    sides: tuple[str, ...] = (FLOOR, LIBRARY)

    def __init__(self, sizes: Sizes) -> None:
        self.sizes = sizes

    def rows(self) -> list[Row]:
        """The table lines this benchmark produces (library side vs reference side)."""
        return [Row(self.name, self.title, LIBRARY, FLOOR, self.commits, self.target)]

    def available(self, side: str) -> bool:
        return side != RNA or rna_available()

    def events(self) -> int:
        raise NotImplementedError

    def workload(self, rng: random.Random) -> list[Event]:
        return make_events(self.events(), rng)

    def open(self, side: str, workdir: str, rng: random.Random) -> Session:
        """Fresh files in ``workdir``, setup and warm-up done; both sides get
        the same events for the same ``rng`` seed."""
        warm, events = make_events(3, rng), self.workload(rng)
        p_path, c_path = _paths(workdir)
        if side == FLOOR:
            create_files(p_path, c_path)
            fp, fc = open_floor(p_path, c_path, warm)
            session = self.floor(fp, fc, events)
            session.closers += [fp.close, fc.close]
        elif side in (RAW4, RAW2):
            pipeline = open_raw(side, p_path, c_path, warm)
            session = self.raw(pipeline, events)
            session.closers.append(pipeline.close)
        elif side == RNA:
            producer, consumer = open_library(p_path, c_path, warm, apply_on_receive=True)
            session = self.library_rna(producer, consumer, events, c_path, len(warm))
            session.closers += [producer.close, consumer.close]
        else:
            producer, consumer = open_library(p_path, c_path, warm)
            session = self.library(producer, consumer, events)
            session.closers += [producer.close, consumer.close]
        return session

    def raw(self, pipeline: raw.Raw4 | raw.Raw2, events: list[Event]) -> Session:
        raise NotImplementedError

    def library_rna(
        self, producer: Producer, consumer: Consumer, events: list[Event], c_path: str, warm: int
    ) -> Session:
        raise NotImplementedError

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        raise NotImplementedError

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        raise NotImplementedError

    def close(self) -> None:
        """Drop anything cached across rounds."""


class Advance(Benchmark):
    name = "advance"
    title = "advance alone"
    commits = "1 per event (flow upsert + outbox row + delivery row)"
    target = Target("time", 1.15, "<= 1.15x a raw one-commit write of the same rows (floor)")

    def events(self) -> int:
        return self.sizes.single

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        return Session({"main": [lambda e=e: fp.advance(e) for e in events]}, 1, [fp.conn])

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        results: list[Any] = []
        units = [lambda e=e: results.append(_advance(producer, e)) for e in events]
        return Session(
            {"main": units},
            1,
            _lib_conns(producer),
            lambda: _expect(results, "committed", "advance"),
        )


class Receive(Benchmark):
    name = "receive"
    title = "receive alone"
    commits = "1 per event (inbox row)"

    def events(self) -> int:
        return self.sizes.single

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        return Session({"main": [lambda e=e: fc.receive(e) for e in events]}, 1, [fc.conn])

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        results: list[Any] = []
        # JSON text, as relay hands it over.
        units = [lambda e=e: results.append(consumer.receive(e.body)) for e in events]
        return Session(
            {"main": units},
            1,
            _lib_conns(consumer),
            lambda: _expect(results, "accepted", "receive"),
        )


class Relay(Benchmark):
    name = "relay"
    title = "relay alone"
    commits = "2 per event (inbox row; accepted mark)"

    def events(self) -> int:
        return self.sizes.single

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        for chunk in chunks(events, 100):
            fp.advance_many(chunk)

        def unit(e: Event) -> None:
            fc.receive(e)
            fp.mark(e)

        return Session({"main": [lambda e=e: unit(e) for e in events]}, 1, [fp.conn, fc.conn])

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        for chunk in chunks(events, 100):
            with producer.batch() as b:
                for e in chunk:
                    _advance(b, e)
        results: list[Any] = []

        def check() -> None:
            _expect(results, "accepted", "relay")
            assert relay(producer, consumer).status == "idle"

        units = [lambda: results.append(relay(producer, consumer)) for _ in events]
        return Session({"main": units}, 1, _lib_conns(producer, consumer), check)


class Apply(Benchmark):
    name = "apply"
    title = "apply_next alone"
    commits = "1 per event (projection upsert + effect row + inbox mark)"

    def events(self) -> int:
        return self.sizes.single

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        for chunk in chunks(events, 100):
            fc.receive_many(chunk)
        return Session({"main": [lambda e=e: fc.apply(e) for e in events]}, 1, [fc.conn])

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        for chunk in chunks(events, 100):
            _expect(
                consumer.receive_many([e.body for e in chunk]), "accepted", "setup receive_many"
            )
        results: list[Any] = []
        units = [lambda e=e: results.append(consumer.apply_next(e.flow_id)) for e in events]
        return Session(
            {"main": units},
            1,
            _lib_conns(consumer),
            lambda: _expect(results, "applied", "apply_next"),
        )


class EndToEnd(Benchmark):
    """One event at a time, advance to applied: the library's two consumer
    modes against the floor and the two minimal raw pipelines, all five
    sides interleaved in the same rounds."""

    name = "e2e"
    title = "end to end, unbatched"
    commits = "4 per event (advance; receive; accepted mark; apply)"
    sides = (FLOOR, LIBRARY, RAW4, RAW2, RNA)

    def rows(self) -> list[Row]:
        two_step = "advance; relay (inbox, mark); apply_next"
        rna = "advance; relay (inbox stored applied, mark)"
        return [
            Row(self.name, self.title, LIBRARY, FLOOR, self.commits),
            Row(
                "e2e_raw4",
                "end to end, unbatched: library vs minimal raw 4-commit",
                LIBRARY,
                RAW4,
                two_step,
                Target("throughput", 1.0, ">= 1.0x minimal raw 4-commit events/s"),
            ),
            Row(
                "e2e_raw2",
                "end to end, unbatched: library vs raw 2-commit",
                LIBRARY,
                RAW2,
                two_step,
            ),
            Row(
                "e2e_rna_raw4",
                "end to end, unbatched, receive-and-apply: library vs minimal raw 4-commit",
                RNA,
                RAW4,
                rna,
                Target("throughput", 1.4, ">= 1.4x minimal raw 4-commit events/s"),
            ),
            Row(
                "e2e_rna_raw2",
                "end to end, unbatched, receive-and-apply: library vs raw 2-commit",
                RNA,
                RAW2,
                rna,
                Target("time", 1.25, "<= 1.25x raw 2-commit time/event"),
            ),
        ]

    def events(self) -> int:
        return self.sizes.e2e

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        def unit(e: Event) -> None:
            fp.advance(e)
            fc.receive(e)
            fp.mark(e)
            fc.apply(e)

        return Session({"main": [lambda e=e: unit(e) for e in events]}, 1, [fp.conn, fc.conn])

    def raw(self, pipeline: raw.Raw4 | raw.Raw2, events: list[Event]) -> Session:
        one = pipeline.one
        return Session(
            {"main": [lambda e=e: one(e) for e in events]},
            1,
            pipeline.conns,
            lambda: raw.check(pipeline, events),
        )

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        results: list[Any] = []

        def unit(e: Event) -> None:
            results.append(_advance(producer, e))
            results.append(relay(producer, consumer))
            results.append(consumer.apply_next(e.flow_id))

        def check() -> None:
            _expect(results[0::3], "committed", "advance")
            _expect(results[1::3], "accepted", "relay")
            _expect(results[2::3], "applied", "apply_next")

        return Session(
            {"main": [lambda e=e: unit(e) for e in events]},
            1,
            _lib_conns(producer, consumer),
            check,
        )

    def library_rna(
        self, producer: Producer, consumer: Consumer, events: list[Event], c_path: str, warm: int
    ) -> Session:
        # With apply_on_receive the relay's receive stores the in-order event
        # applied; there is nothing left for apply_next to do (checked below).
        results: list[Any] = []

        def unit(e: Event) -> None:
            results.append(_advance(producer, e))
            results.append(relay(producer, consumer))

        def check() -> None:
            _expect(results[0::2], "committed", "advance")
            _expect(results[1::2], "accepted", "relay")
            _all_applied(c_path, warm + len(events), "receive-and-apply")

        return Session(
            {"main": [lambda e=e: unit(e) for e in events]},
            1,
            _lib_conns(producer, consumer),
            check,
        )


class Batched(Benchmark):
    """100 events per transaction of each commit: the library against the
    floor and the two minimal raw pipelines in their batched form."""

    name = "e2e_batched"
    title = "end to end, batched (100)"
    commits = "4 per 100 events (batch(); relay_batch: inbox, marks; process_all)"
    target = Target("throughput", 0.65, ">= 0.65x floor events/s")
    batch = 100
    sides = (FLOOR, LIBRARY, RAW4, RAW2, RNA)

    def rows(self) -> list[Row]:
        return [
            Row(self.name, self.title, LIBRARY, FLOOR, self.commits, self.target),
            Row(
                "e2e_batched_raw4",
                "end to end, batched (100): library vs minimal raw 4-commit batched",
                LIBRARY,
                RAW4,
                self.commits,
                Target("throughput", 0.5, ">= 0.5x minimal raw batched events/s"),
            ),
            Row(
                "e2e_batched_raw2",
                "end to end, batched (100): library vs raw 2-commit batched",
                LIBRARY,
                RAW2,
                self.commits,
            ),
            Row(
                "e2e_batched_rna",
                "end to end, batched (100), receive-and-apply: library vs floor",
                RNA,
                FLOOR,
                self.rna_commits,
                Target("throughput", 0.65, ">= 0.65x floor events/s"),
            ),
            Row(
                "e2e_batched_rna_raw4",
                "end to end, batched (100), receive-and-apply: library vs minimal raw 4-commit batched",
                RNA,
                RAW4,
                self.rna_commits,
                Target("throughput", 0.5, ">= 0.5x minimal raw batched events/s"),
            ),
        ]

    rna_commits = "3 per 100 events (batch(); relay_batch: inbox stored applied, marks)"

    def events(self) -> int:
        return self.sizes.batched

    def floor(self, fp: FloorProducer, fc: FloorConsumer, events: list[Event]) -> Session:
        def unit(chunk: Sequence[Event]) -> None:
            fp.advance_many(chunk)
            fc.receive_many(chunk)
            fp.mark_many(chunk)
            fc.apply_many(chunk)

        units = [lambda c=c: unit(c) for c in chunks(events, self.batch)]
        return Session({"main": units}, self.batch, [fp.conn, fc.conn])

    def raw(self, pipeline: raw.Raw4 | raw.Raw2, events: list[Event]) -> Session:
        batch = pipeline.batch
        units = [lambda c=c: batch(c) for c in chunks(events, self.batch)]
        return Session(
            {"main": units}, self.batch, pipeline.conns, lambda: raw.check(pipeline, events)
        )

    def _loop(
        self, producer: Producer, consumer: Consumer, events: list[Event], check_applied: Callable[[int], None]
    ) -> Session:
        """``batch()``, ``relay_batch``, ``process_all`` per chunk; ``check_applied``
        gets how many events the ``process_all`` calls applied in all."""
        advanced: list[Any] = []
        relayed: list[Any] = []
        applied: list[int] = []

        def unit(chunk: Sequence[Event]) -> None:
            with producer.batch() as b:
                for e in chunk:
                    _advance(b, e)
            advanced.extend(b.results)
            relayed.extend(relay_batch(producer, consumer, limit=self.batch).results)
            drained = consumer.process_all(batch_size=self.batch)
            applied.append(sum(d.applied for d in drained.values()))

        def check() -> None:
            _expect(advanced, "committed", "batch advance")
            _expect(relayed, "accepted", "relay_batch")
            check_applied(sum(applied))

        units = [lambda c=c: unit(c) for c in chunks(events, self.batch)]
        return Session({"main": units}, self.batch, _lib_conns(producer, consumer), check)

    def library(self, producer: Producer, consumer: Consumer, events: list[Event]) -> Session:
        def every_one(applied: int) -> None:
            assert applied == len(events), (applied, len(events))

        return self._loop(producer, consumer, events, every_one)

    def library_rna(
        self, producer: Producer, consumer: Consumer, events: list[Event], c_path: str, warm: int
    ) -> Session:
        # The relay's receive_many stores each in-order event applied; the
        # process_all that a bulk loop still runs finds nothing left.
        def none_left(applied: int) -> None:
            assert applied == 0, applied
            _all_applied(c_path, warm + len(events), "batched receive-and-apply")

        return self._loop(producer, consumer, events, none_left)


class ProcessAll(Benchmark):
    """process_all over many flows with one pending event each: one unit, the whole call."""

    batch_size = 1

    def __init__(self, sizes: Sizes) -> None:
        super().__init__(sizes)
        self.name = f"process_all_b{self.batch_size}"
        self.title = f"process_all, {sizes.flows:,} flows, batch_size={self.batch_size}"
        self.commits = (
            f"1 per {self.batch_size} event{'s' if self.batch_size > 1 else ''} (applies)"
        )
        self._base: tuple[str, dict[str, Event]] | None = None

    def events(self) -> int:
        return self.sizes.flows

    def open(self, side: str, workdir: str, rng: random.Random) -> Session:
        if self._base is None:
            base_dir = os.path.join(os.path.dirname(workdir), f"base-{self.name}")
            os.makedirs(base_dir)
            path = os.path.join(base_dir, "consumer.db")
            self._base = (path, prefill.pending_inbox(path, self.sizes.flows, seed=7))
        src, by_id = self._base
        path = os.path.join(workdir, "consumer.db")
        shutil.copyfile(src, path)
        fsync_file(path)
        n = len(by_id)
        if side == "floor":
            fc = FloorConsumer(path)
            done: list[int] = []
            return Session(
                {"main": [lambda: done.append(fc.process_all(by_id, self.batch_size))]},
                n,
                [fc.conn],
                lambda: self._check(done == [n], done),
                [fc.close],
            )
        consumer = Consumer(path, RESERVATION)
        out: list[dict[str, Any]] = []

        def check() -> None:
            self._check(
                len(out[0]) == n and all(d.applied == 1 for d in out[0].values()), len(out[0])
            )

        return Session(
            {"main": [lambda: out.append(consumer.process_all(batch_size=self.batch_size))]},
            n,
            _lib_conns(consumer),
            check,
            [consumer.close],
        )

    @staticmethod
    def _check(ok: bool, got: object) -> None:
        if not ok:
            raise AssertionError(f"process_all did not apply exactly one event per flow: {got!r}")

    def close(self) -> None:
        if self._base is not None:
            shutil.rmtree(os.path.dirname(self._base[0]), ignore_errors=True)
            self._base = None


class ProcessAll1(ProcessAll):
    batch_size = 1
    heavy = True


class ProcessAll100(ProcessAll):
    batch_size = 100


# -- scaling: two file sizes x two sides x three operations ----------------------------------


class Scaling:
    """Per-event cost of advance, receive and apply_next on new flows, with
    ``small_rows`` vs ``big_rows`` events already in the files.

    The big files are built once per run (``prefill.history``) and shared by
    the library and the floor, which write disjoint new flows into them;
    each round starts from an empty WAL (``wal_checkpoint(TRUNCATE)``).
    Copying ~900 MB per round would cost more than the whole measurement and
    flood the disk with writeback.  The small files are fresh copies of a
    small base per round and side.
    """

    name = "scaling"
    ops = ("advance", "receive", "apply")
    target = Target("time", 1.3, "<= 1.3x the same op at 1e3 rows")

    def __init__(self, sizes: Sizes, tmp: str) -> None:
        self.sizes = sizes
        self.tmp = tmp
        self.build_seconds = 0.0
        self.bases: dict[int, tuple[str, str]] = {}

    def build(self) -> None:
        for rows in (self.sizes.small_rows, self.sizes.big_rows):
            directory = os.path.join(self.tmp, f"rows-{rows}")
            os.makedirs(directory)
            start = time.perf_counter()
            self.bases[rows] = prefill.history(directory, rows, seed=rows)
            if rows == self.sizes.big_rows:
                self.build_seconds = time.perf_counter() - start

    def _files(self, rows: int, workdir: str) -> tuple[str, str]:
        p_src, c_src = self.bases[rows]
        if rows != self.sizes.big_rows:
            out = []
            for src in (p_src, c_src):
                dst = os.path.join(workdir, os.path.basename(src))
                shutil.copyfile(src, dst)
                fsync_file(dst)
                out.append(dst)
            return out[0], out[1]
        return p_src, c_src

    def checkpoint(self) -> None:
        """Empty the big files' WAL, so every round starts from the same state."""
        for path in self.bases[self.sizes.big_rows]:
            conn = connect(path)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()

    def open(self, rows: int, side: str, workdir: str, rng: random.Random) -> Session:
        """One side at one size: phases advance, receive, apply of new flows (seq 1)."""
        p_path, c_path = self._files(rows, workdir)
        warm = make_events(1, rng, steps_per_flow=1)
        events = make_events(self.sizes.scaling_events, rng, steps_per_flow=1)
        if side == "floor":
            fp, fc = open_floor(p_path, c_path, warm)
            return Session(
                {
                    "advance": [lambda e=e: fp.advance(e) for e in events],
                    "receive": [lambda e=e: fc.receive(e) for e in events],
                    "apply": [lambda e=e: fc.apply(e) for e in events],
                },
                1,
                [fp.conn, fc.conn],
                closers=[fp.close, fc.close],
            )
        producer, consumer = Producer(p_path, RESERVATION), Consumer(c_path, RESERVATION)
        for e in warm:  # no relay: the files already bind this consumer
            assert _advance(producer, e).status == "committed"
            assert consumer.receive(e.body).status == "accepted"
            assert consumer.apply_next(e.flow_id).status == "applied"
        results: dict[str, list[Any]] = {op: [] for op in self.ops}

        def check() -> None:
            _expect(results["advance"], "committed", "advance")
            _expect(results["receive"], "accepted", "receive")
            _expect(results["apply"], "applied", "apply_next")

        return Session(
            {
                "advance": [
                    lambda e=e: results["advance"].append(_advance(producer, e)) for e in events
                ],
                "receive": [
                    lambda e=e: results["receive"].append(consumer.receive(e.body)) for e in events
                ],
                "apply": [
                    lambda e=e: results["apply"].append(consumer.apply_next(e.flow_id))
                    for e in events
                ],
            },
            1,
            _lib_conns(producer, consumer),
            check,
            [producer.close, consumer.close],
        )

    def close(self) -> None:
        for p_path, _ in self.bases.values():
            shutil.rmtree(os.path.dirname(p_path), ignore_errors=True)
        self.bases.clear()


BENCHMARKS: tuple[type[Benchmark], ...] = (
    Advance,
    Receive,
    Relay,
    Apply,
    EndToEnd,
    Batched,
    ProcessAll1,
    ProcessAll100,
)

"""Run the reliable_flow benchmark suite: library vs raw-SQLite floor, same run.

    python benchmarks/run.py                  # everything, a few minutes
    python benchmarks/run.py --quick          # ~30 s smoke run (smaller sizes)
    python benchmarks/run.py --only e2e --only scaling --rounds 7
    python benchmarks/run.py --write-results  # also regenerate benchmarks/RESULTS.md

See benchmarks/README.md for what each benchmark measures and how to read it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Hashable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import cases
import report
from common import CommitCounter, Sample, machine
from results import Load, Result, ScalingResult

DEFAULT_ROUNDS = 5
QUICK_ROUNDS = 3
SCALING = "scaling"


def _fresh(tmp: str, label: str) -> str:
    return tempfile.mkdtemp(prefix=label + "-", dir=tmp)


Key = Hashable


def interleave(
    sessions: dict[Key, cases.Session],
    block: int,
    offset: int = 0,
    profiler: Any = None,
    profiled: Key | None = None,
) -> dict[tuple[Key, str], Sample]:
    """Run every session's units, phase by phase, in alternating blocks of
    ``block`` units (the order of sessions rotates from block to block), and
    time each side's blocks.  Returns a Sample per (session key, phase)."""
    keys = list(sessions)
    phases = list(sessions[keys[0]].phases)
    elapsed: dict[tuple[Key, str], float] = {}
    cpu: dict[tuple[Key, str], float] = {}
    for phase in phases:
        count = len(sessions[keys[0]].phases[phase])
        assert all(len(s.phases[phase]) == count for s in sessions.values()), "unequal sides"
        for b, start in enumerate(range(0, count, block)):
            turn = (offset + b) % len(keys)
            for key in keys[turn:] + keys[:turn]:
                units = sessions[key].phases[phase][start : start + block]
                profiling = profiler is not None and key == profiled
                c0 = time.process_time()
                if profiling:
                    profiler.enable()
                t0 = time.perf_counter()
                for unit in units:
                    unit()
                t1 = time.perf_counter()
                if profiling:
                    profiler.disable()
                c1 = time.process_time()
                elapsed[(key, phase)] = elapsed.get((key, phase), 0.0) + (t1 - t0)
                cpu[(key, phase)] = cpu.get((key, phase), 0.0) + (c1 - c0)
    return {
        (key, phase): Sample(
            elapsed[(key, phase)], len(s.phases[phase]) * s.per_unit, cpu[(key, phase)]
        )
        for key, s in sessions.items()
        for phase in phases
    }


def run_sessions(
    openers: dict[Key, Callable[[str], cases.Session]],
    tmp: str,
    label: str,
    block: int,
    offset: int = 0,
    counter: CommitCounter | None = None,
    profiler: Any = None,
    profiled: Key | None = None,
) -> dict[tuple[Key, str], Sample]:
    """Open one session per key on fresh directories, interleave them, check, clean up."""
    dirs: list[str] = []
    sessions: dict[Key, cases.Session] = {}
    try:
        for key, opener in openers.items():
            dirs.append(_fresh(tmp, f"{label}-{key}".replace(" ", "").replace("'", "")))
            sessions[key] = opener(dirs[-1])
            if counter is not None:
                for conn in sessions[key].conns:
                    counter.attach(conn)
        samples = interleave(sessions, block, offset, profiler, profiled)
        for session in sessions.values():
            session.check()
        return samples
    finally:
        if counter is not None:
            counter.detach()
        for session in sessions.values():
            session.close()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _audit(
    openers: dict[Key, Callable[[str], cases.Session]], tmp: str, label: str
) -> dict[str, tuple[float, ...]]:
    """Commits per event for each side, counted one side at a time:
    (durable, empty, committed without fsync)."""
    out = {}
    for key, opener in openers.items():
        counter = CommitCounter()
        samples = run_sessions({key: opener}, tmp, label, 10**9, counter=counter)
        events = sum(s.events for s in samples.values())
        side = key if isinstance(key, str) else key[1]
        out[side] = (counter.durable / events, counter.empty / events, counter.lazy / events)
    return out


def _openers(
    bench: cases.Benchmark, seed: int, sides: tuple[str, ...] | None = None
) -> dict[Key, Callable[[str], cases.Session]]:
    # Every side gets the same events (same seed) on its own files.
    return {
        side: (lambda d, side=side: bench.open(side, d, random.Random(seed)))
        for side in (sides if sides is not None else bench.sides)
    }


def _sides(bench: cases.Benchmark) -> tuple[str, ...]:
    return tuple(side for side in bench.sides if bench.available(side))


NOT_AVAILABLE = {
    cases.RNA: "not available: the installed Consumer has no apply_on_receive parameter",
}


def run_benchmark(
    bench: cases.Benchmark,
    audit_bench: cases.Benchmark,
    rounds: int,
    tmp: str,
    log: Callable[[str], None],
    load: Load,
) -> list[Result]:
    """All sides of one benchmark, interleaved in every round; one Result per row."""
    sides = _sides(bench)
    audit = _audit(_openers(audit_bench, 12345, sides), tmp, f"audit-{bench.name}")
    audit_bench.close()
    results = []
    for row in bench.rows():
        result = Result(
            row.name,
            row.title,
            row.commits,
            bench.events(),
            row.target,
            lib_side=row.lib,
            ref_side=row.ref,
            bench=bench.name,
        )
        missing = [side for side in (row.lib, row.ref) if side not in sides]
        if missing:
            result.missing = NOT_AVAILABLE.get(missing[0], f"not available ({missing[0]})")
        else:
            result.audit = {"library": audit[row.lib], "floor": audit[row.ref]}
        results.append(result)
    if bench.heavy:
        rounds = min(rounds, bench.sizes.heavy_rounds)
    try:
        for r in range(rounds):
            samples = run_sessions(
                _openers(bench, 1000 + r, sides),
                tmp,
                f"{bench.name}-r{r}",
                bench.sizes.block,
                offset=r,
            )
            for result in results:
                if not result.missing:
                    result.lib.append(samples[(result.lib_side, "main")])
                    result.floor.append(samples[(result.ref_side, "main")])
            load.sample()
            if len(sides) == 2:
                lib, flo = samples[(cases.LIBRARY, "main")], samples[(cases.FLOOR, "main")]
                log(
                    f"  round {r + 1}/{rounds}: floor {flo.us_per_event:8.1f} us/event, "
                    f"library {lib.us_per_event:8.1f} us/event, "
                    f"ratio {lib.us_per_event / flo.us_per_event:.2f} "
                    f"(CPU us/event: floor {flo.cpu_us_per_event:.0f}, "
                    f"library {lib.cpu_us_per_event:.0f})"
                )
            else:
                log(
                    f"  round {r + 1}/{rounds}: us/event (CPU) "
                    + ", ".join(
                        f"{side} {samples[(side, 'main')].us_per_event:.1f} "
                        f"({samples[(side, 'main')].cpu_us_per_event:.0f})"
                        for side in sides
                    )
                )
    finally:
        bench.close()
    return results


def profile_benchmark(
    bench: cases.Benchmark, tmp: str, lib: str = cases.LIBRARY, ref: str = cases.FLOOR
) -> tuple[Any, Sample]:
    """cProfile the ``lib`` side's units of one round (the ``ref`` side runs interleaved, unprofiled)."""
    profiler = cProfile.Profile()
    try:
        samples = run_sessions(
            _openers(bench, 4242, (ref, lib)),
            tmp,
            f"profile-{bench.name}",
            bench.sizes.block,
            profiler=profiler,
            profiled=lib,
        )
    finally:
        bench.close()
    return profiler, samples[(lib, "main")]


def run_scaling(
    sizes: cases.Sizes, rounds: int, tmp: str, log: Callable[[str], None], load: Load
) -> ScalingResult:
    scaling = cases.Scaling(sizes, tmp)
    small, big = sizes.small_rows, sizes.big_rows
    try:
        log(f"  building files with {small:,} and {big:,} events of history ...")
        scaling.build()
        log(f"  built the {big:,}-event pair in {scaling.build_seconds:.1f} s")
        out = ScalingResult(small, big, sizes.scaling_events, scaling.build_seconds)

        def openers(r: int, sizes_: tuple[int, ...]) -> dict[Key, Callable[[str], cases.Session]]:
            # Different ids per side: on the big files both sides write into the same files.
            return {
                (rows, side): (
                    lambda d, rows=rows, side=side: scaling.open(
                        rows, side, d, random.Random(f"{r}-{side}-{rows}")
                    )
                )
                for rows in sizes_
                for side in ("floor", "library")
            }

        out.audit = _audit(openers(-1, (small,)), tmp, "audit-scaling")
        for r in range(rounds):
            scaling.checkpoint()
            samples = run_sessions(
                openers(r, (small, big)), tmp, f"scaling-r{r}", sizes.block, offset=r
            )
            for ((rows, side), op), sample in samples.items():
                out.samples.setdefault((op, side, rows), []).append(sample)
            load.sample()
            log(
                "  round {}/{}: library advance/receive/apply us/event at {:,} rows: {} | at {:,}: {}".format(
                    r + 1,
                    rounds,
                    small,
                    " ".join(
                        f"{out.samples[(op, 'library', small)][-1].us_per_event:.0f}"
                        for op in cases.Scaling.ops
                    ),
                    big,
                    " ".join(
                        f"{out.samples[(op, 'library', big)][-1].us_per_event:.0f}"
                        for op in cases.Scaling.ops
                    ),
                )
            )
        return out
    finally:
        scaling.close()


MEMORY_JSON = os.path.join(HERE, "memory.json")


POSTGRES_MD = os.path.join(HERE, "RESULTS-postgres.md")


def load_postgres() -> str | None:
    """The PostgreSQL tables of the last ``python benchmarks/postgres.py
    --write-results`` (RESULTS-postgres.md), as a section for RESULTS.md:
    its date and load lines, and its end-to-end and producer-process tables,
    copied as they were measured (None if never run)."""
    if not os.path.exists(POSTGRES_MD):
        return None
    with open(POSTGRES_MD, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # Renamed, so that sync_docs.py still finds run.py's own date line only.
    keep: list[str] = []
    for line in lines:
        for mark, name in (("**Date:**", "**PostgreSQL run:**"), ("**Load:**", "**Its load:**"),
                           ("**Server:**", "**Server:**")):
            if line.startswith(mark):
                keep += [name + line[len(mark):], ""]
    body: list[str] = []
    copying = False
    for line in lines:
        if line.startswith("## "):
            copying = line.startswith(("## End to end", "## Concurrent producer processes"))
            if copying:
                body += ["", "###" + line[2:]]
            continue
        if copying:
            body.append(line)
    intro = (
        "Measured by `python benchmarks/postgres.py --write-results` (not re-measured by run.py); "
        "the full report, with every round: [RESULTS-postgres.md](RESULTS-postgres.md)."
    )
    return "\n".join([intro, "", *keep, *body]).rstrip() + "\n"


def load_memory() -> dict[str, Any] | None:
    """The last result saved by ``python benchmarks/memory.py`` (None if never run)."""
    try:
        with open(MEMORY_JSON, encoding="utf-8") as f:
            return json.load(f)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    names = [b(cases.Sizes()).name for b in cases.BENCHMARKS] + [SCALING]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: small sizes, 3 rounds (~30 s)"
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        choices=names,
        help=f"run only this benchmark (repeatable): {', '.join(names)}",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help=f"interleaved rounds per benchmark (default {DEFAULT_ROUNDS}, quick {QUICK_ROUNDS})",
    )
    parser.add_argument(
        "--write-results", action="store_true", help="regenerate benchmarks/RESULTS.md"
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="with --write-results: skip the cProfile of benchmarks that miss their target",
    )
    parser.add_argument(
        "--tmp", metavar="DIR", help="where to put the temporary files (default: system temp)"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    if rounds < 1:
        parser.error("--rounds must be >= 1")
    sizes = cases.Sizes.quick() if args.quick else cases.Sizes()
    audit_sizes = cases.Sizes.quick()
    selected = args.only or names

    def log(line: str) -> None:
        print(line, flush=True)

    tmp = tempfile.mkdtemp(prefix="reliable-flow-bench-", dir=args.tmp)
    started = time.perf_counter()
    load = Load()
    info = machine(tmp)
    log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    log(f"load average at start: {load.samples[0][0]:.2f} (1 min) on {os.cpu_count()} CPUs")
    results: list[Result] = []
    scaling: ScalingResult | None = None
    try:
        for kind in cases.BENCHMARKS:
            bench = kind(sizes)
            if bench.name not in selected:
                continue
            log(f"{bench.name}: {bench.title} [{bench.commits}] sides: {', '.join(_sides(bench))}")
            results.extend(run_benchmark(bench, kind(audit_sizes), rounds, tmp, log, load))
        if SCALING in selected:
            log(
                f"{SCALING}: advance / receive / apply_next on new flows, "
                f"{sizes.small_rows:,} vs {sizes.big_rows:,} rows already in the files"
            )
            scaling = run_scaling(sizes, rounds, tmp, log, load)
        load.sample()
        elapsed = time.perf_counter() - started
        memory = load_memory()
        text = report.table(results, scaling, memory)
        log("")
        log(text)
        others = load.others_cpus
        log(
            f"total {elapsed:.0f} s; load average max {load.max1:.2f}, mean {load.mean1:.2f} (1 min)"
            + (
                ""
                if others is None
                else f"; other processes kept {others:.2f} CPUs busy on average"
            )
        )
        if args.write_results:
            profiles: dict[str, Any] = {}
            if not args.no_profile:
                done: dict[tuple[str, str], Any] = {}  # one profile per (benchmark, library side)
                for r in results:
                    if r.met is False:
                        key = (r.bench, r.lib_side)
                        if key not in done:
                            log(
                                f"profiling the {r.lib_side} side of {r.bench} (missed: {r.name}) ..."
                            )
                            kind = next(k for k in cases.BENCHMARKS if k(sizes).name == r.bench)
                            done[key] = report.summarize(
                                *profile_benchmark(kind(sizes), tmp, r.lib_side, r.ref_side)
                            )
                        profiles[r.name] = done[key]
            path = os.path.join(HERE, "RESULTS.md")
            with open(path, "w", encoding="utf-8") as out:
                out.write(
                    report.markdown(
                        info,
                        results,
                        scaling,
                        load,
                        elapsed,
                        rounds,
                        quick=args.quick,
                        argv=sys.argv[1:],
                        profiles=profiles,
                        memory=memory,
                        postgres=load_postgres(),
                    )
                )
            log(f"wrote {path}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

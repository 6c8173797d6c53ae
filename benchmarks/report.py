"""Tables for the terminal and benchmarks/RESULTS.md, and the cProfile of a
benchmark that missed its target.  Every number comes from the run."""

from __future__ import annotations

import cProfile
import os
import pstats
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cases
import explain

if TYPE_CHECKING:
    from results import Load, Result, ScalingResult

__all__ = ["markdown", "summarize", "table"]


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _met(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "**no**")


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _commits(audit: dict[str, tuple[float, ...]], side: str) -> str:
    """Durable commits per event, then (+ commits without fsync, + empty commits)."""
    counts = tuple(audit.get(side, (float("nan"),))) + (0.0, 0.0)
    durable, empty, lazy = counts[0], counts[1], counts[2]
    text = _num(durable)
    if lazy:
        text += f" (+{_num(lazy)} no fsync)"
    if empty:
        text += f" (+{empty:.2f} empty)"
    return text


def _ratio(r: Result) -> str:
    if r.target is not None and r.target.kind == "throughput":
        return f"{r.ratio:.2f}x events/s"
    return f"{r.ratio:.2f}x time"


def _spread(r: Result) -> str:
    low, high = r.spread
    return f"{low:.2f}..{high:.2f}"


def table(
    results: Sequence[Result],
    scaling: ScalingResult | None,
    memory: dict[str, Any] | None = None,
) -> str:
    """The main table: one row per comparison (library vs the floor or a raw
    pipeline), one per scaled op, and the memory run if one was saved."""
    header = [
        "benchmark",
        "commits/event lib / ref",
        "library us/event",
        "reference us/event",
        "ratio (median of rounds)",
        "spread (min..max)",
        "library events/s",
        "reference events/s",
        "target",
        "met?",
    ]
    rows = []
    for r in results:
        if not r.available:
            rows.append(
                [
                    r.title,
                    "—",
                    "—",
                    "—",
                    r.missing,
                    "—",
                    "—",
                    "—",
                    r.target.text if r.target else "(none)",
                    "not measured",
                ]
            )
            continue
        rows.append(
            [
                r.title,
                f"{_commits(r.audit, 'library')} / {_commits(r.audit, 'floor')}",
                _n(r.lib_us),
                _n(r.floor_us),
                _ratio(r),
                _spread(r),
                _n(1e6 / r.lib_us),
                _n(1e6 / r.floor_us),
                r.target.text if r.target else "(none)",
                _met(r.met),
            ]
        )
    if scaling is not None:
        for op in cases.Scaling.ops:
            big, small = scaling.big_rows, scaling.small_rows
            rows.append(
                [
                    f"{op} at {big:,} rows vs {small:,}",
                    f"{_commits(scaling.audit, 'library')} / {_commits(scaling.audit, 'floor')}",
                    f"{_n(scaling.us(op, 'library', big))} (vs {_n(scaling.us(op, 'library', small))})",
                    f"{_n(scaling.us(op, 'floor', big))} (vs {_n(scaling.us(op, 'floor', small))})",
                    f"{scaling.growth(op, 'library'):.2f}x time vs {small:,} rows",
                    _scaling_spread(scaling, op),
                    _n(1e6 / scaling.us(op, "library", big)),
                    _n(1e6 / scaling.us(op, "floor", big)),
                    scaling.target.text,
                    _met(scaling.met(op)),
                ]
            )
    if memory is not None:
        rows.append(memory_row(memory))
    return _md(header, rows)


def _scaling_spread(s: ScalingResult, op: str) -> str:
    big, small = s.samples[(op, "library", s.big_rows)], s.samples[(op, "library", s.small_rows)]
    values = [b.us_per_event / a.us_per_event for b, a in zip(big, small)]
    return f"{min(values):.2f}..{max(values):.2f}"


# -- memory (benchmarks/memory.py saves memory.json; shown as it was measured) --------------


def memory_row(m: dict[str, Any]) -> list[str]:
    return [
        f"worker resident size over {m['events']:,} events (memory.py, {m['date']})",
        "—",
        "—",
        "—",
        f"{m['min_ratio']:.2f}..{m['max_ratio']:.2f}x of the RSS after {m['base_events']:,} events",
        "—",
        _n(m["events_per_second"]),
        "—",
        f"flat within ±{m['tolerance']:.0%} after warm-up",
        _met(m["met"]),
    ]


def memory_md(m: dict[str, Any]) -> str:
    samples = m["samples"]
    lines = [
        (
            f"Measured by `python benchmarks/memory.py` ({m['command']}) on {m['date']}, in a child "
            f"process: {m['how']} Resident set size (`VmRSS` of `/proc/self/status`) was sampled every "
            f"{m['every']:,} events; the base is the sample after {m['base_events']:,} events "
            f"({m['base_kib']:,} KiB). Over the run the RSS stayed between {m['min_ratio']:.3f}x and "
            f"{m['max_ratio']:.3f}x of the base (target: within ±{m['tolerance']:.0%}) — "
            f"**{'met' if m['met'] else 'not met'}**. The run took {m['seconds']:.0f} s "
            f"({_n(m['events_per_second'])} events/s end to end, Python {m['python']})."
        ),
        "",
        _md(
            ["events", "RSS KiB", "vs base"],
            [[f"{n:,}", f"{kib:,}", f"{kib / m['base_kib']:.3f}x"] for n, kib in samples],
        ),
    ]
    return "\n".join(lines)


def scaling_table(s: ScalingResult) -> str:
    header = [
        "op (new flows)",
        f"library @ {s.small_rows:,}",
        f"library @ {s.big_rows:,}",
        "library growth",
        f"floor @ {s.small_rows:,}",
        f"floor @ {s.big_rows:,}",
        "floor growth",
        f"library/floor @ {s.small_rows:,}",
        f"library/floor @ {s.big_rows:,}",
    ]
    rows = [
        [
            op,
            _n(s.us(op, "library", s.small_rows)),
            _n(s.us(op, "library", s.big_rows)),
            f"{s.growth(op, 'library'):.2f}x",
            _n(s.us(op, "floor", s.small_rows)),
            _n(s.us(op, "floor", s.big_rows)),
            f"{s.growth(op, 'floor'):.2f}x",
            f"{s.vs_floor(op, s.small_rows):.2f}x",
            f"{s.vs_floor(op, s.big_rows):.2f}x",
        ]
        for op in cases.Scaling.ops
    ]
    return _md(header, rows)


def rounds_table(results: Sequence[Result]) -> str:
    header = [
        "benchmark",
        "events/round",
        "rounds",
        "reference",
        "per-round ratio min..max",
        "library us/event by round",
        "reference us/event by round",
        "CPU us/event library / reference (median)",
    ]
    rows = []
    for r in results:
        if not r.available:
            continue
        low, high = r.spread
        rows.append(
            [
                r.name,
                f"{r.events:,}",
                str(len(r.lib)),
                r.ref_label,
                f"{low:.2f}..{high:.2f}",
                " ".join(_n(s.us_per_event) for s in r.lib),
                " ".join(_n(s.us_per_event) for s in r.floor),
                f"{_n(r.lib_cpu)} / {_n(r.floor_cpu)}",
            ]
        )
    return _md(header, rows)


# -- profiling ------------------------------------------------------------------------


def _category(func: tuple[str, int, str]) -> str:
    filename, _, name = func
    if "sqlite3.Connection" in name or "sqlite3.Cursor" in name:
        return "sqlite"
    if "json" in filename or "_json" in name or "json" in name:
        return "json"
    if "reliable_flow" in filename:
        return "library"
    return "other"


CATEGORY_TEXT = {
    "sqlite": "sqlite3 execute/executemany (all SQL, including COMMIT and its fsync)",
    "json": "json (dumps/loads, including the duplicate-key hook)",
    "library": "reliable_flow's own Python (validation, protocol, results, transactions)",
    "other": "other Python (dataclasses, enum, contextlib, the benchmark loop)",
}


def summarize(profiler: cProfile.Profile, sample: Any) -> dict[str, Any]:
    """Where the library side's measured time went, by category and top functions."""
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())  # own times sum to the profiled time
    by_cat: dict[str, float] = {}
    for func, (_, _, tottime, _, _) in raw.items():
        by_cat[_category(func)] = by_cat.get(_category(func), 0.0) + tottime
    top = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    events = sample.events
    return {
        "events": events,
        "wall_us": sample.us_per_event,
        "profiled_us": total / events * 1e6,
        "categories": {
            k: v / events * 1e6 for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])
        },
        "top": [
            (_label(func), v[1] / events, v[2] / events * 1e6, v[3] / events * 1e6)
            for func, v in top
        ],
    }


def _label(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    parts = filename.replace(os.sep, "/").split("/")
    short = "/".join(parts[-2:]) if "reliable_flow" in parts else parts[-1]
    return f"{short}:{line} {name}"


def profile_md(prof: dict[str, Any]) -> str:
    lines = [
        (
            f"cProfile of the library side's measured section ({prof['events']:,} events; profiling "
            f"inflates Python-heavy code, so use the shares, not the absolute numbers): "
            f"{_n(prof['profiled_us'])} us/event profiled."
        ),
        "",
        _md(
            ["where", "us/event", "share"],
            [
                [CATEGORY_TEXT.get(k, k), _n(v), f"{v / prof['profiled_us']:.0%}"]
                for k, v in prof["categories"].items()
            ],
        ),
        "",
        "Top functions by own time:",
        "",
        _md(
            ["function", "calls/event", "own us/event", "cumulative us/event"],
            [
                [f"`{name}`", f"{calls:.2f}", _n(own), _n(cum)]
                for name, calls, own, cum in prof["top"]
            ],
        ),
    ]
    return "\n".join(lines)


# -- RESULTS.md -------------------------------------------------------------------------


def markdown(
    info: dict[str, str],
    results: Sequence[Result],
    scaling: ScalingResult | None,
    load: Load,
    elapsed: float,
    rounds: int,
    *,
    quick: bool,
    argv: Sequence[str],
    profiles: dict[str, dict[str, Any] | None],
    memory: dict[str, Any] | None = None,
    postgres: str | None = None,
) -> str:
    cmd = "python benchmarks/run.py " + " ".join(argv)
    out = [
        "# Benchmark results",
        "",
        "Generated by `" + cmd.strip() + "` — do not edit by hand; re-run to refresh.",
        "",
        (
            f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}; "
            f"filesystem {info['filesystem']}."
        ),
        "",
        (
            f"**Date:** {info['date']}. Total run time {elapsed:.0f} s, {rounds} interleaved rounds per benchmark "
            f"(process_all with batch_size=1: at most {cases.Sizes().heavy_rounds})."
        ),
        "",
    ]
    cpus = os.cpu_count() or 1
    start = load.samples[0][0] if load.samples else 0.0
    others = load.others_cpus
    busy_text = (
        f"The 1-minute load average was {start:.2f} when the run started, {load.mean1:.2f} on average and "
        f"up to {load.max1:.2f} during the run, on {cpus} CPUs (this run itself accounts for about 1)"
    )
    if others is None:
        shared = start >= 1.0 or load.max1 >= 2.0
        busy_text += "."
    else:
        shared = others >= 0.2
        busy_text += (
            f"; other processes kept {others:.2f} CPUs busy on average "
            f"(all busy CPU time in /proc/stat minus this run's own)."
        )
    if shared:
        out += [
            (
                f"**Shared machine:** {busy_text} Other work was running (and possibly fsyncing) at the "
                "same time, so absolute figures are noisier, and commits slower, than on an idle machine; "
                "library and floor are interleaved in small blocks within each round so that both see the "
                "same load, and the ratios are medians of per-round ratios."
            ),
            "",
        ]
    else:
        out += [f"**Load:** {busy_text} The machine was otherwise idle for this run.", ""]
    if quick:
        out += ["**This is a `--quick` smoke run** (small sizes): not the figures to quote.", ""]
    out += [
        "## Summary",
        "",
        table(results, scaling, memory),
        "",
        (
            "Ratios are medians over rounds of the per-round ratio (library vs its reference measured back "
            "to back in the same round), so they can differ slightly from the ratio of the two median "
            "columns; the spread is the smallest and largest per-round ratio. The reference is the floor "
            "(the library's own schema and commits, raw SQL) unless the row names a minimal raw pipeline "
            "(`benchmarks/raw.py`). `commits/event` was counted in a separate audit run (SQL trace of "
            "BEGIN/COMMIT with row changes and of `PRAGMA synchronous`): `no fsync` commits ran at "
            "`synchronous=NORMAL` (a WAL append made durable by the next durable commit), `empty` "
            "commits changed no row and cost no fsync."
        ),
        "",
    ]
    if memory is not None:
        out += ["## Memory", "", memory_md(memory), ""]
    if postgres is not None:
        out += ["## PostgreSQL beside SQLite", "", postgres, ""]
    if scaling is not None:
        out += [
            "## Scaling",
            "",
            (
                f"Per-event cost (us) of each operation on {scaling.events} new flows per round, with "
                f"{scaling.small_rows:,} vs {scaling.big_rows:,} events already in both files "
                f"(the {scaling.big_rows:,}-event pair was built in {scaling.build_seconds:.0f} s and is "
                "excluded from the timings)."
            ),
            "",
            scaling_table(scaling),
            "",
        ]
    if results:
        out += ["## Rounds", "", rounds_table(results), ""]
    missed = [r for r in results if r.met is False]
    unmeasured = [r for r in results if not r.available and r.target is not None]
    missed_ops = [op for op in cases.Scaling.ops if scaling is not None and not scaling.met(op)]
    out += ["## Targets missed", ""]
    memory_missed = memory is not None and not memory["met"]
    if not missed and not missed_ops and not memory_missed:
        out += [
            "None: every target measured was met in this run."
            + (
                " Not measured: " + ", ".join(r.title for r in unmeasured) + "."
                if unmeasured
                else ""
            ),
            "",
        ]
    elif unmeasured:
        out += [
            "Not measured in this run: "
            + "; ".join(f"{r.title} ({r.missing})" for r in unmeasured)
            + ".",
            "",
        ]
    if memory_missed:
        assert memory is not None
        out += [
            (
                f"### worker resident size: {memory['min_ratio']:.3f}..{memory['max_ratio']:.3f}x "
                f"of the base (target within ±{memory['tolerance']:.0%})"
            ),
            "",
            "See the Memory section above for the samples.",
            "",
        ]
    for r in missed:
        out += [f"### {r.title}: {_ratio(r)} (target {r.target.text if r.target else ''})", ""]
        out += [explain.why(r.name, r, profiles.get(r.name), {x.name: x for x in results}), ""]
        if r.name.startswith("e2e_batched"):
            out += [explain.micro_md(explain.micro()), ""]
        if profiles.get(r.name):
            out += [profile_md(profiles[r.name]), ""]  # type: ignore[arg-type]
    for op in missed_ops:
        assert scaling is not None
        out += [
            (
                f"### {op} at {scaling.big_rows:,} rows: {scaling.growth(op, 'library'):.2f}x "
                f"(target {scaling.target.text})"
            ),
            "",
            explain.why_scaling(op, scaling),
            "",
        ]
    out += ["## Notes", "", explain.NOTES, ""]
    return "\n".join(out)

"""Copy the measured summary table from benchmarks/RESULTS.md into docs/performance.md.

    python benchmarks/sync_docs.py

RESULTS.md is written by `python benchmarks/run.py --write-results`; the
performance page shows the same table between two marker comments, so the
documentation never carries numbers that no run produced.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PAGE = ROOT / "docs" / "performance.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def measured_block(results: str) -> str:
    """The machine line, the date and the summary table of RESULTS.md."""
    lines = results.splitlines()
    keep = [line for line in lines if line.startswith(("**Machine:**", "**Date:**"))]
    start = lines.index("## Summary") + 1
    table = []
    for line in lines[start:]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(keep + [""] + table)


def main() -> int:
    page = PAGE.read_text(encoding="utf-8")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    block = measured_block(RESULTS.read_text(encoding="utf-8"))
    PAGE.write_text(f"{head}{START}\n{block}\n{END}{tail}", encoding="utf-8")
    print(f"updated {PAGE.relative_to(ROOT)} from {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

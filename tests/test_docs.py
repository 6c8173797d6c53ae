"""The code blocks in docs/ are run, so the documentation cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_concepts_example_prints_what_its_comments_say(tmp_path: Path) -> None:
    (block,) = _python_blocks(DOCS / "concepts.md")
    script = tmp_path / "three_ledgers.py"
    script.write_text(block, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "{'state': 'released', 'seq': 3, 'amount': 3}"
    assert lines[1:3] == ["accepted", "accepted"]
    assert lines[3] == "None"
    assert "applied=1" in lines[4] and "stop=<DrainStop.GAP: 'gap'>" in lines[4]
    assert lines[5:7] == ["accepted", "idle"]
    assert lines[7] == "{'state': 'released', 'last_seq': 3, 'held': 0}"
    assert lines[8] == "['reserved', 'confirmed', 'released']"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_every_docs_page_links_only_to_existing_pages(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text(encoding="utf-8")):
        assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


@pytest.mark.parametrize("page", ["guarantees.md", "storage-faults.md"])
def test_every_test_a_guarantee_cites_exists(page: str) -> None:
    text = (DOCS / page).read_text(encoding="utf-8")
    defined = set()
    tests = DOCS.parent / "tests"
    sources = list(tests.glob("*.py")) + list(tests.glob("*/*.py"))  # tests/sqlite/, tests/postgres/
    for source in sources:
        defined |= set(re.findall(r"^def (test_\w+)", source.read_text(encoding="utf-8"), flags=re.MULTILINE))
    cited = set(re.findall(r"\b(test_\w+?)(?:\[|`|\b)", text)) - {"test_"}
    cited = {name for name in cited if not name.endswith("_")}
    assert cited, f"{page} cites no tests"
    files = {source.stem for source in sources}
    missing = sorted(name for name in cited if name not in defined and name not in files)
    assert not missing, f"{page} cites tests that do not exist: {missing}"


def test_the_performance_page_shows_the_generated_results() -> None:
    sys.path.insert(0, str(DOCS.parent / "benchmarks"))
    try:
        import sync_docs
    finally:
        sys.path.pop(0)
    page = (DOCS / "performance.md").read_text(encoding="utf-8")
    shown = page.split(sync_docs.START, 1)[1].split(sync_docs.END, 1)[0].strip()
    generated = sync_docs.measured_block(sync_docs.RESULTS.read_text(encoding="utf-8")).strip()
    assert shown == generated, "run python benchmarks/sync_docs.py after --write-results"
    assert "| end to end, batched (100) |" in shown

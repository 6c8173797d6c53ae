"""docs/api.md is the API reference, generated from the code; it must match it.

Regenerate after an API change with::

    python -m reliable_flow._tools.apidoc > docs/api.md
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reliable_flow
from reliable_flow._tools.apidoc import render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_the_page_is_what_the_code_generates() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/api.md is out of date: python -m reliable_flow._tools.apidoc > docs/api.md"
    )


@pytest.mark.parametrize("name", [n for n in reliable_flow.__all__ if n != "__version__"])
def test_every_public_name_has_a_heading(name: str) -> None:
    assert re.search(rf"^### `{re.escape(name)}\b", render(), flags=re.MULTILINE), name


def bare(page: str) -> list[str]:
    """The headings of the page with nothing under them (a call without a docstring)."""
    blocks = re.split(r"\n(?=#{3,4} )", page)
    return [block.splitlines()[0] for block in blocks
            if block.startswith("#") and len([line for line in block.splitlines() if line.strip()]) == 1]


def test_every_documented_call_says_what_it_does() -> None:
    assert bare(render()) == [], f"public calls without a docstring: {bare(render())}"


def test_the_check_catches_a_missing_docstring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reliable_flow.Consumer.flows, "__doc__", None)
    assert [heading for heading in bare(render()) if heading.startswith("#### `Consumer.flows")]

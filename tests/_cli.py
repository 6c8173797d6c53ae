"""Run ``python -m reliable_flow ...`` in a child process, the way a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def clean_env() -> dict[str, str]:
    """This environment without any RELIABLE_FLOW_* variable (no crash point armed)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RELIABLE_FLOW_")}


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reliable_flow", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env=clean_env() if env is None else env, check=False,
    )

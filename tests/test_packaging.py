"""The package as a user gets it: ``python -m build`` makes an sdist and,
from it, a wheel; ``twine check`` accepts both; the wheel holds the package
with its data files and no tests or benchmarks, installs in a fresh virtual
environment outside the source tree, and runs the demo from there.

Offline: the build runs without isolation (``--no-isolation``: setuptools
from the test extra, nothing downloaded) in a copy of the source tree (the
build writes its ``egg-info`` next to the sources), and the wheel installs
with ``--no-index --no-deps`` (the core has no dependencies).  A few
seconds: part of the normal run; ``-m "not packaging"`` leaves it out.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import reliable_flow

ROOT = Path(__file__).resolve().parents[1]
#: Not part of a source tree as committed (caches, builds, local stores).
_NOT_SOURCES = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".*_cache", "build", "dist",
                                      ".venv", "*.db", "*.db-wal", "*.db-shm")
#: The demo's last row once everything is applied (tests/test_demo.py reads it whole).
_DEMO_DONE = re.compile(r"^\s*C1\s+C\s+1\s+yes\s+yes\s+yes\s+applied\s*$", re.MULTILINE)


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is missing: pip install -e \".[test]\" (or .[dev]) brings it", pytrace=False)


@pytest.mark.packaging
def test_the_wheel_builds_passes_twine_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    for module in ("build", "twine", "setuptools"):
        _need(module)
    source, dist, elsewhere = tmp_path / "source", tmp_path / "dist", tmp_path / "elsewhere"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    elsewhere.mkdir()

    # Without --sdist / --wheel: the sdist first, then the wheel built from it
    # (so the sdist is shown to hold everything the wheel needs).
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)], cwd=source)
    version = reliable_flow.__version__
    wheel = dist / f"reliable_flow-{version}-py3-none-any.whl"
    sdist = dist / f"reliable_flow-{version}.tar.gz"
    assert sorted(p.name for p in dist.iterdir()) == sorted([wheel.name, sdist.name])
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], cwd=tmp_path)
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert {"reliable_flow/py.typed", "reliable_flow/_tools/experiment/results.json",
            "reliable_flow/__main__.py"} <= set(names)
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"reliable_flow", f"reliable_flow-{version}.dist-info"}, tops  # no tests, no benchmarks

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=elsewhere)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
          "--no-deps", str(wheel)], cwd=elsewhere)

    where = _run([str(python), "-c", "import reliable_flow; print(reliable_flow.__file__, reliable_flow.__version__)"],
                 cwd=elsewhere).stdout.split()
    assert Path(where[0]).is_relative_to(venv) and where[1] == version, where
    demo = _run([str(python), "-m", "reliable_flow", "demo"], cwd=elsewhere)
    assert _DEMO_DONE.search(demo.stdout), demo.stdout
    assert list(elsewhere.iterdir()) == []  # the demo left nothing behind
    _run([str(venv / "bin" / "reliable-flow"), "--help"], cwd=elsewhere)  # the console script

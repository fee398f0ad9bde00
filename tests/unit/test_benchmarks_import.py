"""Every benchmark script still imports: a rename in the package must move its benchmarks too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_every_benchmark_script_imports_against_the_package_as_it_is():
    names = sorted(path.stem for path in BENCHMARKS.glob("bench_*.py"))
    assert names, "no benchmark found"
    importing = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", importing, *names], cwd=BENCHMARKS, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]

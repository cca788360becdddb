"""The suite's own isolation: what `tests/conftest.py` does to the processes a test starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_a_process_that_imports_the_tests_keeps_its_tests_cache_folder_and_makes_none(tmp_path):
    # A committer killed mid-commit (test_capture) imports a test module, and so this conftest: it must go on using
    # the cache folder its test gave it, not make (and leave behind) a session folder of its own.
    given = tmp_path / "cache"
    code = (
        "import os, tempfile; import tests.conftest; print(os.environ['XDG_CACHE_HOME']); print(tempfile.gettempdir())"
    )
    env = os.environ | {"XDG_CACHE_HOME": str(given), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-2000:]
    cache, tmp = child.stdout.split()
    assert cache == str(given) and tmp == str(tmp_path / "tmp")
    assert not list((tmp_path / "tmp").iterdir())  # no robotloop-tests-* folder made there

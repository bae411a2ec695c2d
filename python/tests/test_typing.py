"""The package is typed: mypy --strict, for the oldest Python it supports (3.9), finds nothing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "dsec"))
REASON = "" if importlib.util.find_spec("mypy") else f"the typing check needs mypy for {sys.executable} (Debian: python3-mypy, which scripts/setup installs)"


@unittest.skipIf(REASON, REASON)
class TypingTest(unittest.TestCase):
    def test_mypy_strict_finds_nothing(self) -> None:
        with tempfile.TemporaryDirectory(prefix="dsec-py-mypy-") as cache:
            r = subprocess.run(
                [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.9", "--cache-dir", cache, PACKAGE], capture_output=True, text=True
            )
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()

"""The package as a trainer installs it: pip builds it from pyproject.toml (offline, with the
installed setuptools) into a scratch directory, and what lands there imports and carries
py.typed and every module, with no third-party dependency."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def skip_reason() -> str:
    for mod in ("pip", "setuptools", "wheel"):
        if importlib.util.find_spec(mod) is None:
            return f"packaging test needs {mod} for {sys.executable} (Debian: python3-{mod}); the SDK itself does not"
    return ""


@unittest.skipIf(skip_reason(), skip_reason())
class PackagingTest(unittest.TestCase):
    def test_pip_installs_the_package_with_py_typed_and_every_module(self) -> None:
        target = tempfile.mkdtemp(prefix="dsec-py-pkg-")
        build = tempfile.mkdtemp(prefix="dsec-py-build-")
        try:
            src = os.path.join(build, "python")
            shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests", "bench", "examples"))
            r = subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "--quiet", "--target", target, src],
                capture_output=True, text=True,
            )  # fmt: skip
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            shipped = set(os.listdir(os.path.join(target, "dsec")))
            wanted = {f for f in os.listdir(os.path.join(PYTHON_DIR, "dsec")) if f.endswith(".py") or f == "py.typed"}
            self.assertTrue(wanted <= shipped, f"missing: {wanted - shipped}")
            # -I: no PYTHONPATH, no user site, no cwd, so only the installed copy can be found.
            probe = f"import sys; sys.path.insert(0, {target!r}); import dsec, dsec.gym; print(dsec.__file__)"
            out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=target)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(out.stdout.startswith(os.path.join(target, "dsec")), out.stdout)
        finally:
            shutil.rmtree(target)
            shutil.rmtree(build)


if __name__ == "__main__":
    unittest.main()

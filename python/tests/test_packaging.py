"""The package as a trainer installs it, offline (docs/python.md): a fresh venv of Debian's
python3, ``pip install --no-index ./python`` (build isolation on, nothing from an index, no
setuptools or wheel needed: pyproject.toml names the in-tree wheel_backend.py), and what lands
there imports and carries py.typed and every module. The checkout gains no file (no ``build/``,
no ``*.egg-info``); an editable install (``-e``) runs the checkout's code."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Set

PYTHON_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def skip_reason() -> str:
    if importlib.util.find_spec("venv") is None or importlib.util.find_spec("ensurepip") is None:
        return f"the packaging test makes a venv with pip: {sys.executable} lacks venv/ensurepip (Debian: python3-venv, which scripts/setup --tests installs)"
    return ""


def tree(root: str) -> Set[str]:
    """Every file and directory under ``root`` but byte-code caches (importing makes those anyway)."""
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in ("__pycache__", ".mypy_cache")]
        out.update(os.path.relpath(os.path.join(d, x), root) for x in dirs + files)
    return out


@unittest.skipIf(skip_reason(), skip_reason())
class PackagingTest(unittest.TestCase):
    venv = ""

    @classmethod
    def setUpClass(cls) -> None:
        cls.venv = tempfile.mkdtemp(prefix="dsec-py-venv-")
        r = subprocess.run([sys.executable, "-m", "venv", cls.venv], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.venv, ignore_errors=True)

    def pip(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # no find-links or index of the caller's
        r = subprocess.run([os.path.join(self.venv, "bin", "pip"), *args], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def probe(self, code: str) -> str:
        # -I: no PYTHONPATH, no user site, no cwd, so only what the venv holds can be imported.
        r = subprocess.run([os.path.join(self.venv, "bin", "python"), "-I", "-c", code], capture_output=True, text=True, cwd=self.venv)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_pip_installs_it_offline_in_a_fresh_venv_and_writes_nothing_into_the_checkout(self) -> None:
        before = tree(PYTHON_DIR)
        self.pip("install", "--no-index", "--quiet", PYTHON_DIR)
        self.assertEqual(tree(PYTHON_DIR) - before, set(), "pip wrote these into the checkout")
        where = self.probe("import dsec, dsec.gym, os; print(os.path.dirname(dsec.__file__))")
        self.assertTrue(where.startswith(self.venv), where)
        shipped = set(os.listdir(where))
        wanted = {f for f in os.listdir(os.path.join(PYTHON_DIR, "dsec")) if f.endswith(".py") or f == "py.typed"}
        self.assertTrue(wanted <= shipped, f"missing: {wanted - shipped}")
        self.assertEqual(self.probe("import importlib.metadata as m; print(m.version('dsec'), m.metadata('dsec')['Requires-Python'])"), "0.1.0 >=3.9")
        self.pip("uninstall", "--yes", "--quiet", "dsec")
        self.assertNotIn("dsec", self.probe("import importlib.util; print(importlib.util.find_spec('dsec'))"))

    def test_an_editable_install_runs_the_checkouts_code(self) -> None:
        self.pip("install", "--no-index", "--quiet", "--editable", PYTHON_DIR)
        try:
            self.assertEqual(self.probe("import dsec; print(dsec.__file__)"), os.path.join(PYTHON_DIR, "dsec", "__init__.py"))
        finally:
            self.pip("uninstall", "--yes", "--quiet", "dsec")


if __name__ == "__main__":
    unittest.main()

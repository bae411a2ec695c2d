"""The build backend of the ``dsec`` package (PEP 517, in-tree: ``backend-path`` in pyproject.toml).

Why our own: the package is pure Python with no dependency, and it must install offline on
Debian's python3 in a fresh venv (``pip install --no-index ./python``). setuptools cannot do
that there: with build isolation pip would fetch setuptools from an index, and without it a venv
lacks the ``wheel`` package setuptools needs for ``bdist_wheel``; it also writes ``build/`` and
``*.egg-info`` into the checkout. A wheel of a pure-Python package is a zip with three metadata
files (PEP 427, core metadata 2.1), so this backend needs only the standard library, builds
nothing in the source tree, and asks pip for no build requirement.

Hooks: ``build_wheel``, ``build_sdist``, ``build_editable`` (PEP 660: a ``.pth`` naming this
directory) and the ``get_requires_for_*`` ones, which need nothing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "dsec"
#: A fixed date for every entry (zip needs one ≥ 1980): the same sources make the same wheel.
EPOCH = (1980, 1, 1, 0, 0, 0)


def _project() -> Dict[str, Any]:
    """The [project] table of pyproject.toml (tomllib from Python 3.11; before it, the flat
    ``key = "value"`` lines this file uses)."""
    path = os.path.join(HERE, "pyproject.toml")
    try:
        import tomllib
    except ImportError:
        text = open(path, encoding="utf-8").read()
        table = text.split("[project]", 1)[1].split("\n[", 1)[0]
        return {k: v for k, v in re.findall(r'^([a-z-]+)\s*=\s*"([^"]*)"', table, re.M)}
    with open(path, "rb") as f:
        project: Dict[str, Any] = tomllib.load(f)["project"]
    return project


def _metadata() -> Tuple[str, str, str]:
    """(name, version, METADATA text)."""
    p = _project()
    name, version = p["name"], p["version"]
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.9')}",
    ]
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append(f"License: {lic['text']}")
    for c in p.get("classifiers", []) if isinstance(p.get("classifiers"), list) else []:
        lines.append(f"Classifier: {c}")
    return name, version, "\n".join(lines) + "\n"


def _sources() -> List[str]:
    """The package's files, relative to this directory: its modules and py.typed."""
    out = []
    for entry in sorted(os.listdir(os.path.join(HERE, PACKAGE))):
        if entry.endswith(".py") or entry == "py.typed":
            out.append(f"{PACKAGE}/{entry}")
    return out


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return f"{path},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    name, version, metadata = _metadata()
    dist_info = f"{name}-{version}.dist-info"
    wheel_meta = "Wheel-Version: 1.0\nGenerator: dsec wheel_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = files + [
        (f"{dist_info}/METADATA", metadata.encode("utf-8")),
        (f"{dist_info}/WHEEL", wheel_meta.encode("utf-8")),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode("utf-8")),
    ]
    record = "\n".join([_record_line(p, d) for p, d in entries] + [f"{dist_info}/RECORD,,"]) + "\n"
    entries.append((f"{dist_info}/RECORD", record.encode("utf-8")))
    filename = f"{name}-{version}-py3-none-any.whl"
    # Written under a temporary name and renamed: a reader never sees half a wheel.
    target = os.path.join(wheel_directory, filename)
    with zipfile.ZipFile(target + ".part", "w", compression=zipfile.ZIP_DEFLATED) as z:
        for path, data in entries:
            info = zipfile.ZipInfo(path, date_time=EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(target + ".part", target)
    return filename


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None, metadata_directory: Optional[str] = None) -> str:
    files = []
    for rel in _sources():
        with open(os.path.join(HERE, rel), "rb") as f:
            files.append((rel, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None, metadata_directory: Optional[str] = None) -> str:
    # A .pth file puts this directory on sys.path: edits to dsec/ take effect without reinstalling.
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (HERE + "\n").encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    name, version, metadata = _metadata()
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    members = ["pyproject.toml", "wheel_backend.py"] + _sources()
    target = os.path.join(sdist_directory, filename)
    with tarfile.open(target + ".part", "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel in members + ["PKG-INFO"]:
            data = metadata.encode("utf-8") if rel == "PKG-INFO" else open(os.path.join(HERE, rel), "rb").read()
            info = tarfile.TarInfo(f"{base}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tar.addfile(info, io.BytesIO(data))
    os.replace(target + ".part", target)
    return filename

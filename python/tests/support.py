"""Shared pieces of the integration tests: the skip reason, the connection to the shared server,
and polling for processes inside a sandbox."""

from __future__ import annotations

import os
import re
from typing import Any, Dict

import dsec
import harness

SKIP = harness.integration_skip_reason()


def conn() -> Dict[str, Any]:
    s = harness.server()
    return {"url": s.url, "api_key": s.api_key}


def live(sb: dsec.Sandbox, pattern: str) -> bool:
    """Whether a process whose command line matches ``pattern`` runs in the sandbox (busybox ps)."""
    out = sb.commands.run(["ps", "-o", "args"]).stdout
    return any(re.search(pattern, line) for line in out.splitlines()[1:] if "ps -o" not in line)


def cgroup_exists(sandbox_id: str) -> bool:
    return any(os.path.isdir(os.path.join("/sys/fs/cgroup", c, "dsec", sandbox_id)) for c in ("memory", "pids", "cpu", "unified"))


def mounts_of(sandbox_id: str) -> list:
    return [mp for mp in harness._mounts_below(harness.server().data_dir) if f"/sandboxes/{sandbox_id}" in mp]

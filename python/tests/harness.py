"""Starts a real dsec (``dsec up``: control plane + local edge on crun) for the Python tests, on a
fresh data dir under /var/tmp with its own edge id and a free port, and stops it with a leak
check, as packages/dsec/test/helpers/server.ts does for the TypeScript tests. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import List, Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MAIN_JS = os.path.join(REPO, "packages", "dsec", "dist", "src", "cli", "main.js")
DATA_DIR_PREFIX = "/var/tmp/dsec-test-"


def integration_skip_reason() -> Optional[str]:
    """Why a real dsec cannot run here, or None when it can (tests skip with this reason)."""
    if not sys.platform.startswith("linux"):
        return "integration tests need Linux"
    if os.geteuid() != 0:
        return "integration tests need root (mounts, namespaces, cgroups); run the suite as root"
    for tool in ("node", "crun", "mkfs.erofs", "catatonit", "busybox"):
        if shutil.which(tool) is None:
            return f"integration tests need {tool} on PATH"
    if not os.path.exists(MAIN_JS):
        return f"{MAIN_JS} is missing: build first (npx tsc -b packages/sdk packages/dsec)"
    return None


def _mounts_below(path: str) -> List[str]:
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            mp = line.split(" ")[4].encode("latin-1").decode("unicode_escape")
            if mp == path or mp.startswith(path + "/"):
                out.append(mp)
    return out


def _cgroups_of(edge_id: str) -> List[str]:
    out = []
    for controller in os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else []:
        d = os.path.join("/sys/fs/cgroup", controller, "dsec")
        if os.path.isdir(d):
            out += [f"{controller}/dsec/{c}" for c in os.listdir(d) if c.startswith(f"sb-{edge_id}-")]
    return out


class DsecServer:
    """One ``dsec up`` child process. ``start()`` returns when it serves and busybox is built."""

    def __init__(self) -> None:
        self.data_dir = ""
        self.edge_id = "t" + secrets.token_hex(5)  # the run-tests leak check counts sb-t<hex> cgroups
        self.url = ""
        self.api_key = ""
        self.proc: Optional[subprocess.Popen] = None
        self._log: List[str] = []

    def start(self, timeout: float = 180.0) -> "DsecServer":
        self.data_dir = tempfile.mkdtemp(prefix=os.path.basename(DATA_DIR_PREFIX), dir=os.path.dirname(DATA_DIR_PREFIX))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSEC_")}
        self.proc = subprocess.Popen(
            ["node", MAIN_JS, "up", "--data-dir", self.data_dir, "--listen", "127.0.0.1:0", "--edge-id", self.edge_id, "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
        )  # fmt: skip
        found = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self._log.append(line.rstrip("\n"))
                m = re.match(r"dsec is up at (\S+)", line)
                if m:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=pump, name="dsec-up-log", daemon=True).start()
        if not found.wait(timeout) or not self.url:
            self.stop()
            raise RuntimeError("dsec up did not start:\n" + "\n".join(self._log[-40:]))
        with open(os.path.join(self.data_dir, "client.json"), encoding="utf-8") as f:
            self.api_key = json.load(f)["apiKey"]
        self.request("POST", "/v1/images", {"builder": "busybox"}, timeout=timeout)
        return self

    def request(self, method: str, path: str, body: Optional[object] = None, key: Optional[str] = "", timeout: float = 60.0) -> object:
        """A raw call (no SDK), for set-up and wire-level checks."""
        assert self.url.startswith("http://127.0.0.1:"), "tests only talk to 127.0.0.1"
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if key is not None:
            headers["Authorization"] = f"Bearer {key or self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as res:  # noqa: S310 - loopback only
            raw = res.read()
        return json.loads(raw) if raw else None

    def leaks(self) -> List[str]:
        node = os.path.join(self.data_dir, "node")
        found = [f"mount {mp}" for mp in _mounts_below(self.data_dir) if mp != self.data_dir]
        found += [f"cgroup {c}" for c in _cgroups_of(self.edge_id)]
        crun_root = os.path.join(node, "crun")
        if os.path.isdir(crun_root):
            r = subprocess.run(["crun", "--root", crun_root, "list", "--quiet"], capture_output=True, text=True, check=False)
            found += [f"crun container {c}" for c in r.stdout.split()]
        sb_dir = os.path.join(node, "sandboxes")
        if os.path.isdir(sb_dir):
            found += [f"directory {os.path.join(sb_dir, d)}" for d in os.listdir(sb_dir)]
        return found

    def stop(self) -> List[str]:
        """Kills every sandbox, stops the server, and returns what it left behind (nothing, or
        the leaks, in which case the data dir is kept for a look). Idempotent."""
        if self.proc is None:
            return []
        try:
            if self.url and self.proc.poll() is None:
                for sb in self.request("GET", "/v1/sandboxes")["sandboxes"]:  # type: ignore[index]
                    try:
                        self.request("DELETE", f"/v1/sandboxes/{sb['id']}", timeout=120)
                    except Exception:
                        pass
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        leaks = self.leaks()
        if leaks:
            return leaks
        mounts = _mounts_below(self.data_dir)
        if mounts == [self.data_dir]:  # dsec doctor's tmpfs on a data dir that sits on overlayfs
            subprocess.run(["umount", self.data_dir], check=False)
            mounts = _mounts_below(self.data_dir)
        if mounts:
            return [f"mount {mp}" for mp in mounts]
        assert self.data_dir.startswith(DATA_DIR_PREFIX)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        return []

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self._log[-n:])


_server: Optional[DsecServer] = None


def server() -> DsecServer:
    """The run's shared server (started by tests/run.py, or on first use when a module runs alone)."""
    global _server
    if _server is None:
        _server = DsecServer().start()
        import atexit

        atexit.register(_stop_at_exit)
    return _server


def _stop_at_exit() -> None:
    if _server is not None:
        leaks = _server.stop()
        if leaks:
            print("dsec leaked:\n  " + "\n  ".join(leaks), file=sys.stderr)


def shared_server_stop() -> List[str]:
    global _server
    if _server is None:
        return []
    s, _server = _server, None
    return s.stop()


def wait_until(pred, timeout: float = 30.0, interval: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    """Polls ``pred`` until it is true (returns True) or ``timeout`` passes (returns False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())

"""Typed views of the wire schemas (packages/sdk/src/schema), with Python names.

Each class is built from the server's JSON by ``from_wire``; ``raw`` keeps the JSON as received,
so a field the server adds later is readable before this package learns its name.

One file for one concept, the wire's shapes: each class is a few lines of fields mirroring one
schema, and they share ``_build``. What calls the server with them is in calls.py.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, Generic, List, Optional, Type, TypeVar, Union

if TYPE_CHECKING:
    from .errors import DsecError

T = TypeVar("T")

_CAMEL = re.compile(r"_([a-z])")


def camel(name: str) -> str:
    """``memory_mib`` → ``memoryMiB``; ``exit_code`` → ``exitCode``."""
    special = {"memory_mib": "memoryMiB", "disk_mib": "diskMiB", "layer_cache_mib": "layerCacheMiB", "image_id": "imageId"}
    return special.get(name) or _CAMEL.sub(lambda m: m.group(1).upper(), name)


def _build(cls: Type[T], data: Any, **overrides: Any) -> T:
    """Fills a dataclass from camelCase JSON; missing optional fields take their defaults."""
    if not isinstance(data, dict):
        data = {}
    kwargs: Dict[str, Any] = {}
    for f in fields(cls):
        if f.name == "raw":
            kwargs["raw"] = data
        elif f.name in overrides:
            kwargs[f.name] = overrides[f.name]
        else:
            key = camel(f.name)
            if key in data:
                kwargs[f.name] = data[key]
    return cls(**kwargs)


@dataclass
class Resources:
    cpu: float = 1.0
    memory_mib: int = 512
    pids: int = 512
    disk_mib: Optional[int] = None


@dataclass
class SandboxInfo:
    id: str
    edge: str = ""
    backend: str = "container"
    status: str = ""
    image: str = ""
    image_id: str = ""
    resources: Resources = field(default_factory=Resources)
    labels: Dict[str, str] = field(default_factory=dict)
    layers: List[str] = field(default_factory=list)
    created_at: str = ""
    reason: Optional[str] = None
    ttl_seconds: Optional[int] = None
    idle_timeout_seconds: Optional[int] = None
    on_expiry: str = "stop"
    expires_at: Optional[str] = None
    last_activity_at: str = ""
    #: Live usage on inspect: {"oomKills", "memoryBytes", "pids", and where known "peakMemoryBytes",
    #: "cpuMs", "diskBytes", "netRxBytes", "netTxBytes"}.
    usage: Optional[Dict[str, float]] = None
    #: While it moves to another edge: {"to": edge, "since": time}; calls wait for the move.
    migration: Optional[Dict[str, str]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "SandboxInfo":
        return _build(cls, d, resources=_build(Resources, (d or {}).get("resources")))


@dataclass
class ExecResult:
    """The outcome of a command. ``stdout``/``stderr`` are ``str`` (UTF-8), or ``bytes`` when the
    call asked for ``binary=True``; ``stdout_total``/``stderr_total`` count every byte written,
    kept or not (``truncated`` says some were not kept)."""

    exit_code: int
    stdout: Any = ""
    stderr: Any = ""
    truncated: bool = False
    stdout_total: int = 0
    stderr_total: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: float = 0.0
    #: Before the command started: dsec's lookup and the edge's start of it (None from an older edge).
    queued_ms: Optional[float] = None
    #: CPU time of the command and everything it started while it ran (None where the host cannot tell).
    cpu_ms: Optional[float] = None
    #: The sandbox's memory peak while the command ran, in bytes (None where the host cannot tell).
    peak_memory_bytes: Optional[int] = None
    #: Only for session commands: whether the session's shell is still alive.
    session_alive: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_wire(cls, d: Any) -> "ExecResult":
        d = d or {}
        binary = d.get("encoding") == "base64"
        out: Any = d.get("stdout", "")
        err: Any = d.get("stderr", "")
        if binary:
            out, err = base64.b64decode(out), base64.b64decode(err)
        return _build(cls, d, stdout=out, stderr=err, stdout_total=d.get("stdoutBytes", 0), stderr_total=d.get("stderrBytes", 0))


@dataclass
class OutputEvent:
    """A chunk of live output from ``commands.stream``; ``stream`` is "stdout" or "stderr"."""

    stream: str
    data: bytes


@dataclass
class ExitEvent:
    """The last event of ``commands.stream``: the command's status (its output came before)."""

    exit_code: int
    truncated: bool = False
    stdout_total: int = 0
    stderr_total: int = 0
    timed_out: bool = False
    oom_killed: bool = False
    duration_ms: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "ExitEvent":
        return _build(cls, d, stdout_total=d.get("stdoutBytes", 0), stderr_total=d.get("stderrBytes", 0))


StreamEvent = Union[OutputEvent, ExitEvent]


@dataclass
class ProcessInfo:
    id: str
    cmd: Union[str, List[str]] = ""
    status: str = "running"
    exit_code: Optional[int] = None
    timed_out: bool = False
    started_at: str = ""
    duration_ms: Optional[float] = None
    stdout_total: int = 0
    stderr_total: int = 0
    truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "ProcessInfo":
        d = d or {}
        return _build(cls, d, stdout_total=d.get("stdoutBytes", 0), stderr_total=d.get("stderrBytes", 0))


@dataclass
class ProcessOutput:
    """Output of a background process kept so far, from the offsets asked for (bytes)."""

    process: ProcessInfo
    stdout: bytes
    stderr: bytes

    @classmethod
    def from_wire(cls, d: Any) -> "ProcessOutput":
        def dec(s: str) -> bytes:
            return base64.b64decode(s) if d.get("encoding") == "base64" else s.encode("utf-8")

        return cls(process=ProcessInfo.from_wire(d.get("process")), stdout=dec(d.get("stdout", "")), stderr=dec(d.get("stderr", "")))


@dataclass
class SessionInfo:
    id: str
    shell: str = ""
    alive: bool = True
    busy: bool = False
    commands: int = 0
    created_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "SessionInfo":
        return _build(cls, d)


@dataclass
class FileStat:
    path: str
    name: str = ""
    #: "file", "dir", "symlink" or "other".
    type: str = "file"
    size: int = 0
    #: Octal permission bits as a string, e.g. "0644".
    mode: str = ""
    uid: int = 0
    gid: int = 0
    mtime: str = ""
    link_target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "FileStat":
        return _build(cls, d)


@dataclass
class DirListing:
    path: str
    entries: List[FileStat]
    truncated: bool = False

    @classmethod
    def from_wire(cls, d: Any) -> "DirListing":
        return cls(path=d.get("path", ""), entries=[FileStat.from_wire(e) for e in d.get("entries", [])], truncated=bool(d.get("truncated")))


@dataclass
class WriteResult:
    path: str
    bytes: int

    @classmethod
    def from_wire(cls, d: Any) -> "WriteResult":
        return cls(path=d.get("path", ""), bytes=int(d.get("bytes", 0)))


@dataclass
class SnapshotResult:
    """``Sandbox.create(image=snap.image_id)`` restores the snapshot."""

    image_id: str
    layers: List[str] = field(default_factory=list)
    layer_added: bool = False
    frozen_ms: float = 0.0
    entries: int = 0
    bytes: int = 0
    whiteouts: int = 0
    opaque_dirs: int = 0
    sparse_files: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "SnapshotResult":
        return _build(cls, d)


@dataclass
class MigrateResult:
    """A sandbox's move to another edge: ``sandbox`` as it is now, on ``to``."""

    sandbox: "SandboxInfo"
    from_edge: str = ""
    to: str = ""
    ms: float = 0.0
    held_ms: float = 0.0
    bytes: int = 0
    #: Processes a ``restart_processes`` move ended: ``{"pid": …, "cmd": …}``.
    ended_processes: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "MigrateResult":
        d = d if isinstance(d, dict) else {}
        return cls(
            sandbox=SandboxInfo.from_wire(d.get("sandbox")),
            from_edge=str(d.get("from", "")),
            to=str(d.get("to", "")),
            ms=float(d.get("ms", 0)),
            held_ms=float(d.get("heldMs", 0)),
            bytes=int(d.get("bytes", 0)),
            ended_processes=list(d.get("endedProcesses", [])),
            raw=d,
        )


@dataclass
class NetworkState:
    #: "none", "allow" or "open".
    mode: str
    allow: List[Dict[str, Any]] = field(default_factory=list)
    address: Optional[str] = None
    gateway: Optional[str] = None
    #: Set by ``set_network``: milliseconds from request to the rules being in force.
    applied_ms: Optional[float] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "NetworkState":
        return _build(cls, d)


@dataclass
class TrajectoryEntry:
    seq: int
    at: str = ""
    #: "exec", "session.exec", "files.write", "pty", "process.start", ..., "edge.gap" (its node was unreachable for a while)
    kind: str = ""
    request: Dict[str, Any] = field(default_factory=dict)
    result: Optional[Dict[str, Any]] = None
    duration_ms: Optional[float] = None
    #: A command's wait before it started, its CPU time and the sandbox's memory peak while it ran.
    queued_ms: Optional[float] = None
    cpu_ms: Optional[float] = None
    peak_memory_bytes: Optional[int] = None
    exit_code: Optional[int] = None
    replayable: bool = True
    #: The sandbox the step ran in: set in a lineage (``trajectory(lineage=True)``) and by ``Sandbox.trajectories``.
    sandbox_id: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Any) -> "TrajectoryEntry":
        return _build(cls, d)


@dataclass
class Trajectory:
    sandbox_id: str
    entries: List[TrajectoryEntry]
    #: Entries not kept because the log reached its bound.
    dropped: int = 0
    #: With ``lineage=True``: ancestors whose steps are missing (their log is no longer kept); the lineage stops there.
    lineage_missing: List[str] = field(default_factory=list)

    @classmethod
    def from_wire(cls, d: Any) -> "Trajectory":
        return cls(
            sandbox_id=d.get("sandboxId", ""),
            entries=[TrajectoryEntry.from_wire(e) for e in d.get("entries", [])],
            dropped=int(d.get("dropped", 0)),
            lineage_missing=[str(i) for i in d.get("lineageMissing") or []],
        )


@dataclass
class ReplayStep:
    seq: int
    kind: str = ""
    logged_exit_code: Optional[int] = None
    replayed_exit_code: Optional[int] = None
    diverged: bool = False
    #: Not re-run: it cannot be (a terminal, a payload too large to keep) or need not be (a pause).
    skipped: bool = False
    skip_reason: Optional[str] = None
    error: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Any) -> "ReplayStep":
        return _build(cls, d)


@dataclass
class ReplayReport:
    """What ``replay`` did: the steps re-run and which diverged from the log."""

    replayed: int
    diverged: int
    steps: List[ReplayStep]
    skipped: int = 0

    @classmethod
    def from_wire(cls, d: Any) -> "ReplayReport":
        steps = [ReplayStep.from_wire(s) for s in d.get("steps", [])]
        return cls(replayed=int(d.get("replayed", 0)), diverged=int(d.get("diverged", 0)), steps=steps, skipped=int(d.get("skipped", 0)))


@dataclass
class ForkFailure:
    code: str
    message: str


@dataclass
class NodeInfo:
    id: str
    sandboxes: int = 0
    max_sandboxes: int = 0
    layer_cache: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "NodeInfo":
        return _build(cls, d)


S = TypeVar("S")


@dataclass
class Fork(Generic[S]):
    """What ``fork`` made: the sandboxes started from one snapshot, and those that failed."""

    sandboxes: List[S]
    snapshot: SnapshotResult
    failures: List[ForkFailure]


@dataclass
class Batch(Generic[S]):
    """What ``create_many`` made: the sandboxes that run, and one error per item that failed
    (``details`` holds its ``index`` and ``batchId``)."""

    batch_id: str
    sandboxes: List[S]
    failures: List["DsecError"]


@dataclass
class BatchInfo:
    """A batch on the server: ``state`` is "running", "done" or "cancelled"."""

    id: str
    count: int = 0
    state: str = "running"
    placed: int = 0
    running: int = 0
    failed: int = 0
    created_at: str = ""
    finished_at: Optional[str] = None
    last_seq: int = -1
    #: Creates in flight the batch runs with (what was asked, or the server's default, bounded by the project's create rate).
    concurrency: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "BatchInfo":
        return _build(cls, d)


@dataclass
class BatchProgress(Generic[S]):
    """One event of ``iter_create_many``, with the batch's counts so far. ``event`` is
    "accepted", "placed", "running" (``sandbox`` is set), "failed" (``error`` is set), "done"
    or "cancelled"; ``index`` is the item (0..total-1) the event is about."""

    batch_id: str
    event: str
    total: int
    placed: int = 0
    running: int = 0
    failed: int = 0
    index: Optional[int] = None
    sandbox: Optional[S] = None
    error: Optional["DsecError"] = None
    seq: int = -1

    @property
    def done(self) -> bool:
        return self.event in ("done", "cancelled")


@dataclass
class VolumeInfo:
    """A named volume: a directory on one node, mounted into sandboxes at create."""

    name: str
    project: str = ""
    #: The node whose disk holds it; sandboxes that mount it run there.
    edge: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    #: Sandboxes (creating, running, paused or lost) that mount it.
    mounted_by: List[str] = field(default_factory=list)
    #: Apparent size of its files, on ``Volume.get`` / ``refresh``.
    bytes: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "VolumeInfo":
        return _build(cls, d)


@dataclass
class ImageInfo:
    """An image: layers plus the config processes start with."""

    #: sha256:… of the image's manifest.
    id: str
    names: List[str] = field(default_factory=list)
    layers: List[str] = field(default_factory=list)
    #: {"env", "cwd", "user", "entrypoint", "cmd", "labels"} as the server sends it.
    config: Dict[str, Any] = field(default_factory=dict)
    size_bytes: int = 0
    created_at: str = ""
    #: An unnamed snapshot of this sandbox (deleted with it and what started from it).
    snapshot_of: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "ImageInfo":
        return _build(cls, d)


@dataclass
class GcResult:
    """What ``Image.gc()`` removed and what it kept, and why."""

    removed_layers: List[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept_layers: int = 0
    kept_in_use: int = 0
    kept_young: int = 0
    kept_young_bytes: int = 0
    grace_seconds: int = 0
    removed_temp: List[str] = field(default_factory=list)
    kept_by_registry: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "GcResult":
        return _build(cls, d)


@dataclass
class PoolInfo:
    """A warm pool's spec, sizes, claims, misses and refill times."""

    name: str
    size: int = 0
    #: The create spec every ready sandbox is made from, as the server sends it.
    spec: Dict[str, Any] = field(default_factory=dict)
    ready: int = 0
    creating: int = 0
    claims: int = 0
    misses: int = 0
    refill_failures: int = 0
    last_refill_error: Optional[str] = None
    refill_ms_p50: Optional[float] = None
    refill_ms_last: Optional[float] = None
    claim_ms_p50: Optional[float] = None
    created_at: str = ""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "PoolInfo":
        return _build(cls, d)


@dataclass
class BulkResult:
    """A bulk kill/pause/resume by label: the sandboxes it was applied to, and those it failed on."""

    ids: List[str] = field(default_factory=list)
    #: ``{"id", "code", "message"}`` per sandbox it failed on.
    failures: List[Dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_wire(cls, d: Any) -> "BulkResult":
        return _build(cls, d)


@dataclass
class PortLink:
    """A signed URL that opens one port without an API key, until ``expires_at``."""

    url: str
    port: int = 0
    expires_at: str = ""

    @classmethod
    def from_wire(cls, d: Any) -> "PortLink":
        return _build(cls, d)


@dataclass
class PortWait:
    """What ``ports.wait`` answers once something accepts connections on the port: the port, and
    how long the wait took (milliseconds, as the server measured it)."""

    port: int
    waited_ms: float = 0.0

    @classmethod
    def from_wire(cls, d: Any) -> "PortWait":
        return _build(cls, d)


@dataclass
class PortResponse:
    """The answer of a server in the sandbox to ``ports.fetch``: its own status, headers and body."""

    status: int
    headers: Dict[str, str]
    body: bytes

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding, errors="replace")

    def json(self) -> Any:
        import json

        return json.loads(self.body)


@dataclass
class PulledImage:
    """What ``Image.pull`` brought in: the image, the digest it was pulled by, what was fetched."""

    image: ImageInfo
    digest: str = ""
    fetched_layers: int = 0
    bytes: int = 0
    #: Times a layer download broke off and resumed with a Range request.
    resumes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "PulledImage":
        return _build(cls, d, image=ImageInfo.from_wire((d or {}).get("image")))


@dataclass
class PushedImage:
    """What ``Image.push`` sent: the reference, the manifest digest, the layers uploaded."""

    ref: str
    digest: str = ""
    layers: int = 0
    uploaded_layers: int = 0
    bytes: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_wire(cls, d: Any) -> "PushedImage":
        return _build(cls, d)

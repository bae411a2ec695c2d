"""libdsec for Python: sync and asyncio clients for dsec sandboxes, standard library only.

    import dsec
    with dsec.Sandbox.create("busybox", memory_mib=64) as sb:
        print(sb.commands.run("echo hi").stdout)

The connection comes from ``url=``/``api_key=``, else DSEC_URL/DSEC_API_KEY, else the data
dir's client.json (DSEC_DATA_DIR, default /var/lib/dsec). See docs/python.md.
"""

from .aio import AsyncCommands, AsyncFiles, AsyncProcess, AsyncSandbox, AsyncSession, AsyncSessions
from .config import DEFAULT_DATA_DIR, ConnectionConfig, resolve_connection
from .errors import (
    AuthError,
    CapacityError,
    CommandExitError,
    ConflictError,
    DsecError,
    InvalidRequestError,
    NotConfiguredError,
    NotFoundError,
    QuotaError,
    RateLimitError,
    ServerError,
    TimeoutError,
    UnavailableError,
    UnreachableError,
    error_from_wire,
)
from .models import (
    Batch,
    BatchInfo,
    BatchProgress,
    DirListing,
    ExecResult,
    ExitEvent,
    FileStat,
    Fork,
    ForkFailure,
    NetworkState,
    NodeInfo,
    OutputEvent,
    ProcessInfo,
    ProcessOutput,
    ReplayReport,
    SandboxInfo,
    SessionInfo,
    SnapshotResult,
    StreamEvent,
    Trajectory,
    TrajectoryEntry,
    WriteResult,
)
from .sandbox import Commands, Files, Process, Sandbox, Session, Sessions, nodes
from .terminal import AsyncTerminal, Terminal
from . import fn

__version__ = "0.1.0"

__all__ = [
    "AsyncCommands", "AsyncFiles", "AsyncProcess", "AsyncSandbox", "AsyncSession", "AsyncSessions", "AsyncTerminal",
    "AuthError", "Batch", "BatchInfo", "BatchProgress", "CapacityError", "CommandExitError", "Commands", "ConflictError", "ConnectionConfig",
    "DEFAULT_DATA_DIR", "DirListing", "DsecError", "ExecResult", "ExitEvent", "FileStat", "Files", "Fork", "ForkFailure",
    "InvalidRequestError", "NetworkState", "NodeInfo", "NotConfiguredError", "NotFoundError", "OutputEvent", "Process",
    "ProcessInfo", "ProcessOutput", "QuotaError", "RateLimitError", "ReplayReport", "Sandbox", "SandboxInfo", "ServerError",
    "Session", "SessionInfo", "Sessions", "SnapshotResult", "StreamEvent", "Terminal", "TimeoutError", "Trajectory",
    "TrajectoryEntry", "UnavailableError", "UnreachableError", "WriteResult", "error_from_wire", "fn", "nodes", "resolve_connection",
]  # fmt: skip

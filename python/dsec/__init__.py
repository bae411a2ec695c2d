"""libdsec for Python: sync and asyncio clients for dsec sandboxes, standard library only.

    import dsec
    with dsec.Sandbox.create("busybox", memory_mib=64) as sb:
        print(sb.commands.run("echo hi").stdout)

The connection comes from ``url=``/``api_key=``, else DSEC_URL/DSEC_API_KEY, else the data
dir's client.json (DSEC_DATA_DIR, default /var/lib/dsec). See docs/python.md.
"""

from .aio import AsyncCommands, AsyncFiles, AsyncPorts, AsyncProcess, AsyncSandbox, AsyncSession, AsyncSessions
from .aio_resources import AsyncImage, AsyncPool, AsyncVolume
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
    BulkResult,
    DirListing,
    ExecResult,
    ExitEvent,
    FileStat,
    Fork,
    ForkFailure,
    GcResult,
    ImageInfo,
    NetworkState,
    NodeInfo,
    OutputEvent,
    PoolInfo,
    PortLink,
    PortResponse,
    PortWait,
    ProcessInfo,
    ProcessOutput,
    PulledImage,
    PushedImage,
    ReplayReport,
    SandboxInfo,
    SessionInfo,
    SnapshotResult,
    StreamEvent,
    Trajectory,
    TrajectoryEntry,
    VolumeInfo,
    WriteResult,
)
from .resources import Image, Pool, Volume
from .sandbox import Commands, Files, Ports, Process, Sandbox, Session, Sessions, nodes
from .terminal import AsyncTerminal, Terminal
from . import fn

__version__ = "0.1.0"

__all__ = [
    "AsyncCommands", "AsyncFiles", "AsyncImage", "AsyncPool", "AsyncPorts", "AsyncProcess", "AsyncSandbox", "AsyncSession", "AsyncSessions",
    "AsyncTerminal", "AsyncVolume", "AuthError", "Batch", "BatchInfo", "BatchProgress", "BulkResult", "CapacityError", "CommandExitError", "Commands", "ConflictError", "ConnectionConfig",
    "DEFAULT_DATA_DIR", "DirListing", "DsecError", "ExecResult", "ExitEvent", "FileStat", "Files", "Fork", "ForkFailure",
    "GcResult", "Image", "ImageInfo", "InvalidRequestError", "NetworkState", "NodeInfo", "NotConfiguredError", "NotFoundError", "OutputEvent",
    "Pool", "PoolInfo", "PortLink", "PortResponse", "PortWait", "Ports", "Process", "ProcessInfo", "ProcessOutput", "PulledImage", "PushedImage", "QuotaError", "RateLimitError", "ReplayReport", "Sandbox", "SandboxInfo", "ServerError",
    "Session", "SessionInfo", "Sessions", "SnapshotResult", "StreamEvent", "Terminal", "TimeoutError", "Trajectory",
    "TrajectoryEntry", "UnavailableError", "UnreachableError", "Volume", "VolumeInfo", "WriteResult", "error_from_wire", "fn", "nodes", "resolve_connection",
]  # fmt: skip

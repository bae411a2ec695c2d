"""The asyncio client: ``AsyncSandbox`` and its namespaces, the same surface as ``Sandbox`` with
``await`` (``async for`` for streams, ``async with`` to kill on exit). Cancelling the task that
awaits a call closes its connection, which the server takes as a hang-up: a running command is
killed. Both clients are faces over ``client.py``, which holds what each call does; this module
runs it over the asyncio transport.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Coroutine, Dict, List, Mapping, Optional, Sequence, TypeVar, Union

from . import calls, client, listing
from .errors import UnreachableError
from . import models as m
from .aio_transport import AsyncTransport
from .client import AsyncIO
from .client_resources import PortsCore
from .config import ConnectionConfig, resolve_connection
from .terminal import AsyncTerminal

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

S = TypeVar("S")
T = TypeVar("T")

_transports: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[ConnectionConfig, AsyncTransport]]" = weakref.WeakKeyDictionary()


def transport_for(url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None) -> AsyncTransport:
    """One transport (one pool of kept-alive connections) per event loop, server and key."""
    config = resolve_connection(url, api_key, request_timeout)
    per_loop = _transports.setdefault(asyncio.get_running_loop(), {})
    t = per_loop.get(config)
    if t is None:
        t = per_loop[config] = AsyncTransport(config)
    return t


def awaiting(method: "Callable[Concatenate[S, P], Coroutine[Any, Any, T]]") -> "Callable[Concatenate[S, P], Coroutine[Any, Any, T]]":
    """``client``'s ``async def _name`` as the asyncio face's ``name``, signature and docstring kept."""

    @functools.wraps(method)
    async def call(self: S, /, *args: "P.args", **kwargs: "P.kwargs") -> T:
        return await method(self, *args, **kwargs)

    call.__name__ = call.__qualname__ = method.__name__.lstrip("_")
    return call


def awaiting_iter(method: "Callable[Concatenate[S, P], AsyncIterator[T]]") -> "Callable[Concatenate[S, P], AsyncIterator[T]]":
    """``client``'s async generator ``_name`` as the asyncio face's ``name``."""

    @functools.wraps(method)
    def call(self: S, /, *args: "P.args", **kwargs: "P.kwargs") -> AsyncIterator[T]:
        return method(self, *args, **kwargs)

    call.__name__ = call.__qualname__ = method.__name__.lstrip("_")
    return call


class AsyncProcess(client.ProcessCore):
    """A background process: read its output, wait, signal, feed stdin."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str, info: m.ProcessInfo) -> None:
        super().__init__(transport, sandbox_id, info)

    output = awaiting(client.ProcessCore._output)
    follow = awaiting_iter(client.ProcessCore._follow)
    wait = awaiting(client.ProcessCore._wait)
    signal = awaiting(client.ProcessCore._signal)
    kill = awaiting(client.ProcessCore._kill)
    write_stdin = awaiting(client.ProcessCore._write_stdin)
    close_stdin = awaiting(client.ProcessCore._close_stdin)


class AsyncCommands(client.CommandsCore[AsyncProcess]):
    """Runs commands in a sandbox: to completion, streamed, or in the background."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    def _process(self, info: m.ProcessInfo) -> AsyncProcess:
        return AsyncProcess(self._t, self.sandbox_id, info)

    run = awaiting(client.CommandsCore._run)
    stream = awaiting_iter(client.CommandsCore._stream)
    start = awaiting(client.CommandsCore._start)
    list = awaiting(client.CommandsCore._list)
    connect = awaiting(client.CommandsCore._connect)


class AsyncSession(client.SessionCore):
    """A persistent shell: ``cd``, ``export`` and variables carry over between commands."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str, info: m.SessionInfo) -> None:
        super().__init__(transport, sandbox_id, info)

    run = awaiting(client.SessionCore._run)
    close = awaiting(client.SessionCore._close)

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._close_unless_gone()


class AsyncSessions(client.SessionsCore[AsyncSession]):
    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    def _session(self, info: m.SessionInfo) -> AsyncSession:
        return AsyncSession(self._t, self.sandbox_id, info)

    create = awaiting(client.SessionsCore._create)
    list = awaiting(client.SessionsCore._list)


class AsyncFiles(client.FilesCore):
    """Files inside a sandbox; every path resolves inside its root."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    read = awaiting(client.FilesCore._read)
    read_text = awaiting(client.FilesCore._read_text)
    write = awaiting(client.FilesCore._write)
    stat = awaiting(client.FilesCore._stat)
    exists = awaiting(client.FilesCore._exists)
    list = awaiting(client.FilesCore._list)
    mkdir = awaiting(client.FilesCore._mkdir)
    remove = awaiting(client.FilesCore._remove)
    rename = awaiting(client.FilesCore._rename)
    upload_tar = awaiting(client.FilesCore._upload_tar)
    download_tar = awaiting(client.FilesCore._download_tar)
    upload_dir = awaiting(client.FilesCore._upload_dir)
    download_dir = awaiting(client.FilesCore._download_dir)


class AsyncPorts(PortsCore):
    """``sb.ports``: see ``Ports``."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    fetch = awaiting(PortsCore._fetch)
    wait = awaiting(PortsCore._wait)
    link = awaiting(PortsCore._link)


class AsyncSandbox(client.SandboxCore["AsyncSandbox"]):
    """A handle on one sandbox. ``async with await AsyncSandbox.create(...) as sb:`` kills it on exit."""

    _io_type = AsyncIO

    def __init__(self, transport: AsyncTransport, info: m.SandboxInfo) -> None:
        super().__init__(transport, info)
        self.commands = AsyncCommands(transport, info.id)
        self.files = AsyncFiles(transport, info.id)
        self.sessions = AsyncSessions(transport, info.id)
        self.ports = AsyncPorts(transport, info.id)

    def _sandbox(self, info: m.SandboxInfo) -> "AsyncSandbox":
        return AsyncSandbox(self._t, info)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._kill_unless_gone()

    # -- making and finding sandboxes: see ``Sandbox`` for what each does ---------------------

    @classmethod
    async def create(
        cls,
        image: str = "busybox",
        *,
        cpu: Optional[float] = None,
        memory_mib: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mib: Optional[int] = None,
        layers: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        network: Union[None, str, Mapping[str, Any]] = None,
        ttl_seconds: Optional[int] = None,
        idle_timeout_seconds: Optional[int] = None,
        on_expiry: Optional[str] = None,
        backend: Optional[str] = None,
        pool: Optional[str] = None,
        volumes: Optional[Sequence[Mapping[str, Any]]] = None,
        placement: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "AsyncSandbox":
        """See ``Sandbox.create``."""
        t = transport_for(url, api_key, request_timeout)
        spec = calls.create_body(
            image=image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, labels=labels, network=network,
            ttl_seconds=ttl_seconds, idle_timeout_seconds=idle_timeout_seconds, on_expiry=on_expiry, backend=backend, pool=pool, volumes=volumes,
            placement=placement,
        )  # fmt: skip
        return cls(t, await t.run(calls.create(spec, timeout)))

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> "AsyncSandbox":
        """See ``Sandbox.connect``."""
        t = transport_for(url, api_key, request_timeout)
        return cls(t, await t.run(calls.get(sandbox_id, timeout)))

    @classmethod
    async def list(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> List[m.SandboxInfo]:
        """See ``Sandbox.list``."""
        return await transport_for(url, api_key, request_timeout).run(calls.list_sandboxes(labels, status, timeout))

    @classmethod
    async def iter_create_many(
        cls,
        count: int,
        *,
        concurrency: Optional[int] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
        **spec: Any,
    ) -> AsyncIterator[m.BatchProgress["AsyncSandbox"]]:
        """See ``Sandbox.iter_create_many``: ``async for step in AsyncSandbox.iter_create_many(8)``.
        Leaving the loop early cancels the batch once the generator is closed (``aclose()``, or
        when it is collected)."""
        t = transport_for(url, api_key, request_timeout)
        steps = client.iter_create_many(AsyncIO(t), lambda info: cls(t, info), count, concurrency, timeout, spec)
        try:
            async for step in steps:
                yield step
        finally:
            await steps.aclose()  # type: ignore[attr-defined]

    @classmethod
    async def create_many(
        cls,
        count: int,
        *,
        concurrency: Optional[int] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
        **spec: Any,
    ) -> m.Batch["AsyncSandbox"]:
        """See ``Sandbox.create_many``; cancelling the awaiting task cancels the batch."""
        t = transport_for(url, api_key, request_timeout)
        return await client.create_many(AsyncIO(t), lambda info: cls(t, info), count, concurrency, timeout, spec)

    @classmethod
    async def batch_info(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """See ``Sandbox.batch_info``."""
        return await transport_for(url, api_key).run(calls.batch_info(batch_id, timeout))

    @classmethod
    async def cancel_batch(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """See ``Sandbox.cancel_batch``."""
        return await transport_for(url, api_key).run(calls.cancel_batch(batch_id, timeout))

    @classmethod
    async def kill_by_id(cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """See ``Sandbox.kill_by_id``."""
        await transport_for(url, api_key).run(calls.kill(sandbox_id, timeout))

    @classmethod
    async def trajectory_by_id(
        cls,
        sandbox_id: str,
        *,
        after_seq: Optional[int] = None,
        limit: Optional[int] = None,
        lineage: bool = False,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> m.Trajectory:
        """See ``Sandbox.trajectory_by_id``."""
        return await transport_for(url, api_key).run(calls.trajectory(sandbox_id, after_seq, limit, timeout, lineage))

    @classmethod
    async def trajectories(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        batch: Optional[str] = None,
        project: Optional[str] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> AsyncIterator[m.TrajectoryEntry]:
        """See ``Sandbox.trajectories``: ``async for step in AsyncSandbox.trajectories(labels={"run": "7"})``."""
        steps = client.trajectories(AsyncIO(transport_for(url, api_key)), labels, batch, project, timeout)
        try:
            async for step in steps:
                yield step
        finally:
            await steps.aclose()  # type: ignore[attr-defined]

    @classmethod
    async def list_page(
        cls,
        *,
        limit: int,
        after: Optional[str] = None,
        labels: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        order: Optional[str] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> listing.SandboxPage:
        """See ``Sandbox.list_page``."""
        return await transport_for(url, api_key).run(listing.list_page(labels, status, limit, after, timeout, order))

    @classmethod
    async def iterate(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        page_size: int = 1000,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> AsyncIterator[m.SandboxInfo]:
        """See ``Sandbox.iterate``: ``async for s in AsyncSandbox.iterate(labels={"run": "r7"})``."""
        t = transport_for(url, api_key)
        after: Optional[str] = None
        while True:
            page = await t.run(listing.list_page(labels, status, page_size, after, timeout))
            for s in page.sandboxes:
                yield s
            if not page.next:
                return
            after = page.next

    @classmethod
    async def counts(cls, *, project: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> listing.SandboxCounts:
        """See ``Sandbox.counts``."""
        return await transport_for(url, api_key).run(listing.counts(project, timeout))

    @classmethod
    async def _bulk(
        cls, action: str, labels: Mapping[str, str], timeout: Optional[float], url: Optional[str], api_key: Optional[str], on_progress: Optional[Callable[[Dict[str, Any]], None]]
    ) -> m.BulkResult:
        t = transport_for(url, api_key)
        if on_progress is None:
            return await t.run(calls.bulk(action, labels, timeout))
        async for line in t.lines(listing.bulk_progress(action, labels, timeout)):
            on_progress(line)
            if line.get("type") == "done":
                return listing.bulk_result(line)
        raise UnreachableError(f"the {action}_all stream ended before its result", "STREAM_BROKEN")

    @classmethod
    async def kill_all(
        cls, *, labels: Mapping[str, str], timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, on_progress: Optional[Callable[[Dict[str, Any]], None]] = None
    ) -> m.BulkResult:
        """See ``Sandbox.kill_all``."""
        return await cls._bulk("kill", labels, timeout, url, api_key, on_progress)

    @classmethod
    async def pause_all(
        cls, *, labels: Mapping[str, str], timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, on_progress: Optional[Callable[[Dict[str, Any]], None]] = None
    ) -> m.BulkResult:
        """See ``Sandbox.pause_all``."""
        return await cls._bulk("pause", labels, timeout, url, api_key, on_progress)

    @classmethod
    async def resume_all(
        cls, *, labels: Mapping[str, str], timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, on_progress: Optional[Callable[[Dict[str, Any]], None]] = None
    ) -> m.BulkResult:
        """See ``Sandbox.resume_all``."""
        return await cls._bulk("resume", labels, timeout, url, api_key, on_progress)

    # -- this sandbox ---------------------------------------------------------------------------

    refresh = awaiting(client.SandboxCore._refresh)
    kill = awaiting(client.SandboxCore._kill)
    pause = awaiting(client.SandboxCore._pause)
    resume = awaiting(client.SandboxCore._resume)
    snapshot = awaiting(client.SandboxCore._snapshot)
    migrate = awaiting(client.SandboxCore._migrate)
    fork = awaiting(client.SandboxCore._fork)
    set_network = awaiting(client.SandboxCore._set_network)
    network = awaiting(client.SandboxCore._network)
    trajectory = awaiting(client.SandboxCore._trajectory)
    replay = awaiting(client.SandboxCore._replay)

    async def terminal(
        self, *, cmd: Optional[Sequence[str]] = None, cols: Optional[int] = None, rows: Optional[int] = None, cwd: Optional[str] = None, timeout: Optional[float] = None
    ) -> AsyncTerminal:
        """Opens an interactive terminal (a pseudo-terminal in the sandbox)."""
        return await AsyncTerminal.open(self._t, self.id, cmd=cmd, cols=cols, rows=rows, cwd=cwd, timeout=timeout)


async def nodes(*, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List[m.NodeInfo]:
    """The server's edges: sandboxes, admission limits, layer caches."""
    return await transport_for(url, api_key).run(calls.nodes(timeout))

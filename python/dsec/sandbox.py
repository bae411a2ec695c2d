"""The sync client: ``Sandbox`` and its namespaces (commands, sessions, files).

Every method takes a keyword ``timeout`` in seconds: the deadline of the HTTP call (for
commands it is the command's own timeout, and ``request_timeout`` bounds the call). The asyncio
client (``aio.py``) has the same surface with ``await``. Both are faces over ``client.py``,
which holds what each call does; this module runs it over the blocking transport. It is one
file because it is one surface: each method is a few lines handing a ``client.py`` call to the
transport, in the order the TypeScript SDK's ``Sandbox`` has them.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Coroutine, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union, cast

from . import calls, client, listing
from .errors import UnreachableError
from . import models as m
from .client import BATCH_STREAM_RETRIES, SyncIO, tar_directory, untar_into
from .client_resources import PortsCore
from .config import ConnectionConfig, resolve_connection
from .terminal import Terminal
from .transport import SyncTransport

if TYPE_CHECKING:
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")

S = TypeVar("S")
T = TypeVar("T")

__all__ = ["BATCH_STREAM_RETRIES", "Commands", "Files", "Ports", "Process", "Sandbox", "Session", "Sessions", "nodes", "tar_directory", "transport_for", "untar_into"]

_transports: Dict[ConnectionConfig, SyncTransport] = {}
_transports_lock = threading.Lock()


def transport_for(url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None) -> SyncTransport:
    """One transport (and so one kept-alive connection per thread) per server and key."""
    config = resolve_connection(url, api_key, request_timeout)
    with _transports_lock:
        t = _transports.get(config)
        if t is None:
            t = _transports[config] = SyncTransport(config)
        return t


def run_sync(step: Awaitable[T]) -> T:
    """Runs a coroutine of ``client`` over ``SyncIO`` to its end. Nothing in it suspends (every
    I/O step blocks and returns), so one ``send`` finishes it."""
    it = step.__await__()
    try:
        it.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    it.close()
    raise RuntimeError("a sync call suspended: something awaited outside SyncIO")


def iterate_sync(agen: AsyncIterator[T]) -> Iterator[T]:
    """An async iterator of ``client`` over ``SyncIO``, as a plain iterator. Leaving the loop
    early closes it, which runs its clean-up (closing a stream, cancelling a batch)."""
    try:
        while True:
            try:
                item = run_sync(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        close = getattr(agen, "aclose", None)
        if close is not None:
            run_sync(close())


def blocking(method: "Callable[Concatenate[S, P], Coroutine[Any, Any, T]]") -> "Callable[Concatenate[S, P], T]":
    """``client``'s ``async def _name`` as the sync face's ``name``, signature and docstring kept."""

    @functools.wraps(method)
    def call(self: S, /, *args: "P.args", **kwargs: "P.kwargs") -> T:
        return run_sync(method(self, *args, **kwargs))

    call.__name__ = call.__qualname__ = method.__name__.lstrip("_")
    return call


def blocking_iter(method: "Callable[Concatenate[S, P], AsyncIterator[T]]") -> "Callable[Concatenate[S, P], Iterator[T]]":
    """``client``'s async generator ``_name`` as the sync face's generator ``name``."""

    @functools.wraps(method)
    def call(self: S, /, *args: "P.args", **kwargs: "P.kwargs") -> Iterator[T]:
        return iterate_sync(method(self, *args, **kwargs))

    call.__name__ = call.__qualname__ = method.__name__.lstrip("_")
    return call


class Process(client.ProcessCore):
    """A background process: read its output, wait, signal, feed stdin."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str, info: m.ProcessInfo) -> None:
        super().__init__(transport, sandbox_id, info)

    output = blocking(client.ProcessCore._output)
    follow = blocking_iter(client.ProcessCore._follow)
    wait = blocking(client.ProcessCore._wait)
    signal = blocking(client.ProcessCore._signal)
    kill = blocking(client.ProcessCore._kill)
    write_stdin = blocking(client.ProcessCore._write_stdin)
    close_stdin = blocking(client.ProcessCore._close_stdin)


class Commands(client.CommandsCore[Process]):
    """Runs commands in a sandbox: to completion, streamed, or in the background."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    def _process(self, info: m.ProcessInfo) -> Process:
        return Process(self._t, self.sandbox_id, info)

    run = blocking(client.CommandsCore._run)
    stream = blocking_iter(client.CommandsCore._stream)
    start = blocking(client.CommandsCore._start)
    list = blocking(client.CommandsCore._list)
    connect = blocking(client.CommandsCore._connect)


class Session(client.SessionCore):
    """A persistent shell: ``cd``, ``export`` and variables carry over between commands."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str, info: m.SessionInfo) -> None:
        super().__init__(transport, sandbox_id, info)

    run = blocking(client.SessionCore._run)
    close = blocking(client.SessionCore._close)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        run_sync(self._close_unless_gone())


class Sessions(client.SessionsCore[Session]):
    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    def _session(self, info: m.SessionInfo) -> Session:
        return Session(self._t, self.sandbox_id, info)

    create = blocking(client.SessionsCore._create)
    list = blocking(client.SessionsCore._list)


class Files(client.FilesCore):
    """Files inside a sandbox; every path resolves inside its root."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    read = blocking(client.FilesCore._read)
    read_text = blocking(client.FilesCore._read_text)
    write = blocking(client.FilesCore._write)
    stat = blocking(client.FilesCore._stat)
    exists = blocking(client.FilesCore._exists)
    list = blocking(client.FilesCore._list)
    mkdir = blocking(client.FilesCore._mkdir)
    remove = blocking(client.FilesCore._remove)
    rename = blocking(client.FilesCore._rename)
    upload_tar = blocking(client.FilesCore._upload_tar)
    download_tar = blocking(client.FilesCore._download_tar)
    upload_dir = blocking(client.FilesCore._upload_dir)
    download_dir = blocking(client.FilesCore._download_dir)


class Ports(PortsCore):
    """``sb.ports``: servers in the sandbox through the control plane's proxy (``url``, ``fetch``,
    ``wait``, ``link``)."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        super().__init__(transport, sandbox_id)

    fetch = blocking(PortsCore._fetch)
    wait = blocking(PortsCore._wait)
    link = blocking(PortsCore._link)


class Sandbox(client.SandboxCore["Sandbox"]):
    """A handle on one sandbox. ``with Sandbox.create(...) as sb:`` kills it on exit."""

    _io_type = SyncIO

    def __init__(self, transport: SyncTransport, info: m.SandboxInfo) -> None:
        super().__init__(transport, info)
        self.commands = Commands(transport, info.id)
        self.files = Files(transport, info.id)
        self.sessions = Sessions(transport, info.id)
        self.ports = Ports(transport, info.id)

    def _sandbox(self, info: m.SandboxInfo) -> "Sandbox":
        return Sandbox(self._t, info)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        run_sync(self._kill_unless_gone())

    # -- making and finding sandboxes ------------------------------------------------------------

    @classmethod
    def create(
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
    ) -> "Sandbox":
        """Creates a sandbox and returns when it is running. ``pool`` claims a ready sandbox of
        that warm pool (``Pool.create``); ``volumes`` mounts named volumes
        (``[{"name": "data", "path": "/data", "read_only": True}]``); ``placement`` is
        ``{"pool", "labels", "burst"}`` of the edges it may run on.

        Example: ``sb = dsec.Sandbox.create("busybox", memory_mib=64, labels={"task": "t1"})``
        """
        t = transport_for(url, api_key, request_timeout)
        spec = calls.create_body(
            image=image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, labels=labels, network=network,
            ttl_seconds=ttl_seconds, idle_timeout_seconds=idle_timeout_seconds, on_expiry=on_expiry, backend=backend, pool=pool, volumes=volumes,
            placement=placement,
        )  # fmt: skip
        return cls(t, t.run(calls.create(spec, timeout)))

    @classmethod
    def connect(cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None) -> "Sandbox":
        """Attaches to an existing sandbox by id."""
        t = transport_for(url, api_key, request_timeout)
        return cls(t, t.run(calls.get(sandbox_id, timeout)))

    @classmethod
    def list(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> List[m.SandboxInfo]:
        """Sandboxes whose labels match all of ``labels`` (and ``status`` if given)."""
        return transport_for(url, api_key, request_timeout).run(calls.list_sandboxes(labels, status, timeout))

    @classmethod
    def iter_create_many(
        cls,
        count: int,
        *,
        concurrency: Optional[int] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
        **spec: Any,
    ) -> Iterator[m.BatchProgress["Sandbox"]]:
        """Creates ``count`` sandboxes of one spec (the keywords of ``create``) as one batch on the
        server (``POST /v1/batches``, up to 32,000), and yields its progress as it happens: each
        event with the counts so far, a ``Sandbox`` as each one runs, an error as each one fails.
        ``concurrency`` bounds the creates in flight across the cluster (server default: 64 per edge). A
        dropped progress stream is resumed after the last event seen. Stopping before the batch
        is done cancels it, which kills every sandbox it made.

        Example::

            for step in dsec.Sandbox.iter_create_many(32, image="busybox", memory_mib=64):
                if step.sandbox: pool.submit(rollout, step.sandbox)
        """
        t = transport_for(url, api_key, request_timeout)
        yield from iterate_sync(client.iter_create_many(SyncIO(t), lambda info: cls(t, info), count, concurrency, timeout, spec))

    @classmethod
    def create_many(
        cls,
        count: int,
        *,
        concurrency: Optional[int] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
        **spec: Any,
    ) -> m.Batch["Sandbox"]:
        """Creates ``count`` sandboxes of one spec as one batch and returns when every one runs
        or failed: ``Batch(batch_id, sandboxes, failures)``, one error per failed item (a
        ``CapacityError`` among them is ``retryable``). Interrupted before the batch is done
        (an exception, Ctrl-C), it cancels the batch, which kills what it made.

        Example: ``batch = dsec.Sandbox.create_many(32, image="busybox", memory_mib=64)``
        """
        t = transport_for(url, api_key, request_timeout)
        return run_sync(client.create_many(SyncIO(t), lambda info: cls(t, info), count, concurrency, timeout, spec))

    @classmethod
    def batch_info(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """A batch's state and counts."""
        return transport_for(url, api_key).run(calls.batch_info(batch_id, timeout))

    @classmethod
    def cancel_batch(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """Cancels a batch: no more creates, and the sandboxes it made are killed."""
        return transport_for(url, api_key).run(calls.cancel_batch(batch_id, timeout))

    @classmethod
    def kill_by_id(cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Kills a sandbox by id without connecting first; idempotent like ``kill()``."""
        transport_for(url, api_key).run(calls.kill(sandbox_id, timeout))

    @classmethod
    def trajectory_by_id(
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
        """A sandbox's trajectory by id, without connecting first: also of a sandbox that was
        killed (its log is kept for a while after). ``lineage=True``: see ``trajectory``."""
        return transport_for(url, api_key).run(calls.trajectory(sandbox_id, after_seq, limit, timeout, lineage))

    @classmethod
    def trajectories(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        batch: Optional[str] = None,
        project: Optional[str] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> Iterator[m.TrajectoryEntry]:
        """Every step of many sandboxes, as it streams from the server: those whose labels match
        all of ``labels`` and/or the items of ``batch`` (at least one), live or killed within the
        retention time; sandboxes in id order, each one's steps by seq, each entry with its
        ``sandbox_id``. A 32,000-sandbox batch streams in constant memory. ``project``: an admin
        key's filter. ``timeout`` bounds the whole stream (default a day).

        Example::

            for step in dsec.Sandbox.trajectories(labels={"run": "7"}):
                rewards[step.sandbox_id].append((step.seq, step.kind, step.exit_code))
        """
        t = transport_for(url, api_key)
        yield from iterate_sync(client.trajectories(SyncIO(t), labels, batch, project, timeout))

    @classmethod
    def list_page(
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
        """One page of a listing, oldest first (``order="newest"``: newest first), and the cursor of the next (``next``, None on the last).

        Example: ``page = dsec.Sandbox.list_page(labels={"run": "r7"}, limit=1000); page = dsec.Sandbox.list_page(labels={"run": "r7"}, limit=1000, after=page.next)``
        """
        return transport_for(url, api_key).run(listing.list_page(labels, status, limit, after, timeout, order))

    @classmethod
    def iterate(
        cls,
        *,
        labels: Optional[Mapping[str, str]] = None,
        status: Optional[str] = None,
        page_size: int = 1000,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> Iterator[m.SandboxInfo]:
        """Every sandbox a listing selects, a page of ``page_size`` at a time (each page its own call).

        Example: ``for s in dsec.Sandbox.iterate(labels={"run": "r7"}): print(s.id, s.status)``
        """
        t = transport_for(url, api_key)
        after: Optional[str] = None
        while True:
            page = t.run(listing.list_page(labels, status, page_size, after, timeout))
            yield from page.sandboxes
            if not page.next:
                return
            after = page.next

    @classmethod
    def counts(cls, *, project: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> listing.SandboxCounts:
        """Sandboxes by status, counted by the server: ``counts`` and ``total``."""
        return transport_for(url, api_key).run(listing.counts(project, timeout))

    @classmethod
    def _bulk(
        cls, action: str, labels: Mapping[str, str], timeout: Optional[float], url: Optional[str], api_key: Optional[str], on_progress: Optional[Callable[[Dict[str, Any]], None]]
    ) -> m.BulkResult:
        t = transport_for(url, api_key)
        if on_progress is None:
            return t.run(calls.bulk(action, labels, timeout))
        for line in t.lines(listing.bulk_progress(action, labels, timeout)):
            on_progress(line)
            if line.get("type") == "done":
                return listing.bulk_result(line)
        raise UnreachableError(f"the {action}_all stream ended before its result", "STREAM_BROKEN")

    @classmethod
    def kill_all(
        cls,
        *,
        labels: Mapping[str, str],
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        on_progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> m.BulkResult:
        """Kills every sandbox whose labels match all of ``labels`` (at least one: never "all"),
        a few at a time on the server; sandboxes already gone count as killed. ``on_progress``
        hears ``{type, total, done, failed}`` about every 500 ms while it runs.

        Example: ``dsec.Sandbox.kill_all(labels={"run": "r7"}, on_progress=lambda p: print(p["done"], "/", p["total"])).ids``
        """
        return cls._bulk("kill", labels, timeout, url, api_key, on_progress)

    @classmethod
    def pause_all(
        cls,
        *,
        labels: Mapping[str, str],
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        on_progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> m.BulkResult:
        """Pauses every running sandbox whose labels match all of ``labels``."""
        return cls._bulk("pause", labels, timeout, url, api_key, on_progress)

    @classmethod
    def resume_all(
        cls,
        *,
        labels: Mapping[str, str],
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        on_progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> m.BulkResult:
        """Resumes every paused sandbox whose labels match all of ``labels``."""
        return cls._bulk("resume", labels, timeout, url, api_key, on_progress)

    # -- this sandbox ---------------------------------------------------------------------------

    refresh = blocking(client.SandboxCore._refresh)
    kill = blocking(client.SandboxCore._kill)
    pause = blocking(client.SandboxCore._pause)
    resume = blocking(client.SandboxCore._resume)
    snapshot = blocking(client.SandboxCore._snapshot)
    migrate = blocking(client.SandboxCore._migrate)
    fork = blocking(client.SandboxCore._fork)
    set_network = blocking(client.SandboxCore._set_network)
    network = blocking(client.SandboxCore._network)
    trajectory = blocking(client.SandboxCore._trajectory)
    replay = blocking(client.SandboxCore._replay)

    def terminal(
        self, *, cmd: Optional[Sequence[str]] = None, cols: Optional[int] = None, rows: Optional[int] = None, cwd: Optional[str] = None, timeout: Optional[float] = None
    ) -> Terminal:
        """Opens an interactive terminal (a pseudo-terminal in the sandbox)."""
        return Terminal.open(self._t, self.id, cmd=cmd, cols=cols, rows=rows, cwd=cwd, timeout=timeout)


def nodes(*, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List[m.NodeInfo]:
    """The server's edges: sandboxes, admission limits, layer caches."""
    return transport_for(url, api_key).run(calls.nodes(timeout))

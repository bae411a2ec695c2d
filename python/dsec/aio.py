"""The asyncio client: ``AsyncSandbox`` and its namespaces, the same surface as ``Sandbox`` with
``await`` (``async for`` for streams, ``async with`` to kill on exit). Cancelling the task that
awaits a call closes its connection, which the server takes as a hang-up: a running command is
killed.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import calls
from . import models as m
from .aio_transport import AsyncTransport
from .calls import Cmd
from .config import ConnectionConfig, resolve_connection
from .errors import DsecError, NotFoundError, UnreachableError
from .sandbox import BATCH_STREAM_RETRIES, _check, tar_directory, untar_into
from .terminal import AsyncTerminal

_transports: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[ConnectionConfig, AsyncTransport]]" = weakref.WeakKeyDictionary()


def transport_for(url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None) -> AsyncTransport:
    """One transport (one pool of kept-alive connections) per event loop, server and key."""
    config = resolve_connection(url, api_key, request_timeout)
    per_loop = _transports.setdefault(asyncio.get_running_loop(), {})
    t = per_loop.get(config)
    if t is None:
        t = per_loop[config] = AsyncTransport(config)
    return t


async def _batch_events(t: AsyncTransport, batch_id: str, after: int = -1) -> AsyncIterator[Dict[str, Any]]:
    """See ``sandbox._batch_events``: progress events until the batch ends, resumed after breaks."""
    breaks = 0
    while True:
        lines = t.lines(calls.batch_events(batch_id, after))
        try:
            async for e in lines:
                after, breaks = int(e.get("seq", after)), 0
                yield e
                if e.get("type") in ("done", "cancelled"):
                    return
        except DsecError as err:
            if err.status is not None and 400 <= err.status < 500:
                raise
        finally:
            await lines.aclose()  # type: ignore[attr-defined]
        breaks += 1
        if breaks > BATCH_STREAM_RETRIES:
            raise UnreachableError(f"the progress stream of batch {batch_id} broke {breaks} times in a row", "STREAM_BROKEN")
        await asyncio.sleep(min(0.2 * breaks, 2.0))


async def _cancel_quietly(t: AsyncTransport, batch_id: str) -> None:
    try:
        await t.run(calls.cancel_batch(batch_id, None))
    except DsecError:
        pass  # already ended, or the server is gone: nothing more to stop


class AsyncProcess:
    """A background process: read its output, wait, signal, feed stdin."""

    def __init__(self, transport: AsyncTransport, sandbox_id: str, info: m.ProcessInfo) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def output(self, *, stdout_offset: int = 0, stderr_offset: int = 0, timeout: Optional[float] = None) -> m.ProcessOutput:
        out = await self._t.run(calls.process_output(self.sandbox_id, self.id, stdout_offset, stderr_offset, timeout))
        self.info = out.process
        return out

    async def follow(self, *, poll: float = 0.2) -> AsyncIterator[m.OutputEvent]:
        """Output as it is produced (polled), until the process exits."""
        offsets = {"stdout": 0, "stderr": 0}
        while True:
            out = await self.output(stdout_offset=offsets["stdout"], stderr_offset=offsets["stderr"])
            for stream, data in (("stdout", out.stdout), ("stderr", out.stderr)):
                if data:
                    offsets[stream] += len(data)
                    yield m.OutputEvent(stream, data)
            if out.process.status == "exited":
                return
            await self.wait(wait=poll)

    async def wait(self, *, wait: float = 30.0, timeout: Optional[float] = None) -> m.ProcessInfo:
        self.info = await self._t.run(calls.wait_process(self.sandbox_id, self.id, wait, timeout))
        return self.info

    async def signal(self, signal: str = "SIGTERM", *, timeout: Optional[float] = None) -> m.ProcessInfo:
        self.info = await self._t.run(calls.signal_process(self.sandbox_id, self.id, signal, timeout))
        return self.info

    async def kill(self, *, timeout: Optional[float] = None) -> m.ProcessInfo:
        self.info = await self._t.run(calls.kill_process(self.sandbox_id, self.id, timeout))
        return self.info

    async def write_stdin(self, data: Union[str, bytes], *, eof: bool = False, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.write_stdin(self.sandbox_id, self.id, data, eof, timeout))

    async def close_stdin(self, *, timeout: Optional[float] = None) -> None:
        await self.write_stdin(b"", eof=True, timeout=timeout)


class AsyncCommands:
    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    async def run(
        self,
        cmd: Cmd,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        stdin: Union[None, str, bytes] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        binary: bool = False,
        check: bool = False,
        request_timeout: Optional[float] = None,
    ) -> m.ExecResult:
        """See ``Commands.run``."""
        body = calls.exec_body(cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, binary=binary)
        return _check(await self._t.run(calls.exec_(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout))), check)

    async def stream(
        self,
        cmd: Cmd,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        stdin: Union[None, str, bytes] = None,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        uncapped: bool = False,
        request_timeout: Optional[float] = None,
    ) -> AsyncIterator[m.StreamEvent]:
        """See ``Commands.stream``: ``async for ev in sb.commands.stream("make")``."""
        body = calls.exec_body(cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, uncapped=uncapped)
        lines = self._t.lines(calls.exec_stream(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout)))
        try:
            async for line in lines:
                ev = calls.stream_event(line)
                if ev is not None:
                    yield ev
        finally:
            await lines.aclose()  # type: ignore[attr-defined]

    async def start(
        self,
        cmd: Cmd,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        stdin: bool = False,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        request_timeout: Optional[float] = None,
    ) -> AsyncProcess:
        op = calls.start_process(
            self.sandbox_id, cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, request_timeout=request_timeout
        )
        return AsyncProcess(self._t, self.sandbox_id, await self._t.run(op))

    async def list(self, *, timeout: Optional[float] = None) -> List[AsyncProcess]:
        return [AsyncProcess(self._t, self.sandbox_id, p) for p in await self._t.run(calls.list_processes(self.sandbox_id, timeout))]

    async def connect(self, process_id: str, *, timeout: Optional[float] = None) -> AsyncProcess:
        out = await self._t.run(calls.process_output(self.sandbox_id, process_id, 0, 0, timeout))
        return AsyncProcess(self._t, self.sandbox_id, out.process)


class AsyncSession:
    def __init__(self, transport: AsyncTransport, sandbox_id: str, info: m.SessionInfo) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def run(
        self,
        cmd: str,
        *,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        binary: bool = False,
        check: bool = False,
        request_timeout: Optional[float] = None,
    ) -> m.ExecResult:
        op = calls.session_exec(self.sandbox_id, self.id, cmd, timeout, max_output_bytes, binary, request_timeout)
        return _check(await self._t.run(op), check)

    async def close(self, *, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.close_session(self.sandbox_id, self.id, timeout))

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.close()
        except NotFoundError:
            pass


class AsyncSessions:
    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    async def create(
        self,
        *,
        shell: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> AsyncSession:
        return AsyncSession(self._t, self.sandbox_id, await self._t.run(calls.open_session(self.sandbox_id, shell, cwd, env, writable_paths, timeout)))

    async def list(self, *, timeout: Optional[float] = None) -> List[AsyncSession]:
        return [AsyncSession(self._t, self.sandbox_id, s) for s in await self._t.run(calls.list_sessions(self.sandbox_id, timeout))]


class AsyncFiles:
    def __init__(self, transport: AsyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    async def read(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        return await self._t.run(calls.read_file(self.sandbox_id, path, timeout))

    async def read_text(self, path: str, *, encoding: str = "utf-8", timeout: Optional[float] = None) -> str:
        return (await self.read(path, timeout=timeout)).decode(encoding)

    async def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None, timeout: Optional[float] = None) -> m.WriteResult:
        return await self._t.run(calls.write_file(self.sandbox_id, path, data, mode, timeout))

    async def stat(self, path: str, *, timeout: Optional[float] = None) -> m.FileStat:
        return await self._t.run(calls.stat(self.sandbox_id, path, timeout))

    async def exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        try:
            await self.stat(path, timeout=timeout)
            return True
        except NotFoundError:
            return False

    async def list(self, path: str, *, timeout: Optional[float] = None) -> m.DirListing:
        return await self._t.run(calls.list_dir(self.sandbox_id, path, timeout))

    async def mkdir(self, path: str, *, parents: bool = True, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.mkdir(self.sandbox_id, path, parents, timeout))

    async def remove(self, path: str, *, recursive: bool = False, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.remove(self.sandbox_id, path, recursive, timeout))

    async def rename(self, src: str, dst: str, *, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.rename(self.sandbox_id, src, dst, timeout))

    async def upload_tar(self, directory: str, archive: bytes, *, timeout: Optional[float] = None) -> m.WriteResult:
        return await self._t.run(calls.upload_tar(self.sandbox_id, directory, archive, timeout))

    async def download_tar(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        return await self._t.run(calls.download_tar(self.sandbox_id, path, timeout))

    async def upload_dir(self, local_dir: str, directory: str, *, timeout: Optional[float] = None) -> m.WriteResult:
        return await self.upload_tar(directory, tar_directory(local_dir), timeout=timeout)

    async def download_dir(self, path: str, local_dir: str, *, timeout: Optional[float] = None) -> None:
        untar_into(await self.download_tar(path, timeout=timeout), local_dir)


class AsyncSandbox:
    """A handle on one sandbox. ``async with await AsyncSandbox.create(...) as sb:`` kills it on exit."""

    def __init__(self, transport: AsyncTransport, info: m.SandboxInfo) -> None:
        self._t = transport
        self.info = info
        self.commands = AsyncCommands(transport, info.id)
        self.files = AsyncFiles(transport, info.id)
        self.sessions = AsyncSessions(transport, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, status={self.info.status!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except NotFoundError:
            pass

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
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "AsyncSandbox":
        """See ``Sandbox.create``."""
        t = transport_for(url, api_key, request_timeout)
        spec = calls.create_body(
            image=image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, labels=labels, network=network,
            ttl_seconds=ttl_seconds, idle_timeout_seconds=idle_timeout_seconds, on_expiry=on_expiry, backend=backend,
        )  # fmt: skip
        return cls(t, await t.run(calls.create(spec, timeout)))

    @classmethod
    async def connect(
        cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None
    ) -> "AsyncSandbox":
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
        info = await t.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
        tally = calls.BatchTally(info.id, count)
        finished = False
        try:
            async for e in _batch_events(t, info.id):
                tally.add(e)
                kind = str(e.get("type", ""))
                sandbox: Optional[AsyncSandbox] = None
                error: Optional[DsecError] = None
                if kind == "running" and e.get("sandboxId"):
                    sandbox = cls(t, await t.run(calls.get(str(e["sandboxId"]), timeout)))
                elif kind == "failed":
                    error = calls.batch_failure(info.id, e)
                finished = kind in ("done", "cancelled")
                yield m.BatchProgress(info.id, kind, count, tally.placed, tally.running, tally.failed, e.get("index"), sandbox, error, int(e.get("seq", -1)))
        finally:
            if not finished:
                await _cancel_quietly(t, info.id)

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
        info = await t.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
        failures: List[DsecError] = []
        finished = False
        try:
            async for e in _batch_events(t, info.id):
                if e.get("type") == "failed":
                    failures.append(calls.batch_failure(info.id, e))
                finished = e.get("type") in ("done", "cancelled")
        finally:
            if not finished:
                await asyncio.shield(_cancel_quietly(t, info.id))
        running = await t.run(calls.list_sandboxes({calls.BATCH_LABEL: info.id}, "running", timeout))
        return m.Batch(info.id, [cls(t, i) for i in running], failures)

    @classmethod
    async def batch_info(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        return await transport_for(url, api_key).run(calls.batch_info(batch_id, timeout))

    @classmethod
    async def cancel_batch(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        return await transport_for(url, api_key).run(calls.cancel_batch(batch_id, timeout))

    async def refresh(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        self.info = await self._t.run(calls.get(self.id, timeout))
        return self.info

    async def kill(self, *, timeout: Optional[float] = None) -> None:
        await self._t.run(calls.kill(self.id, timeout))

    @classmethod
    async def kill_by_id(cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        await transport_for(url, api_key).run(calls.kill(sandbox_id, timeout))

    async def pause(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        self.info = await self._t.run(calls.pause(self.id, timeout))
        return self.info

    async def resume(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        self.info = await self._t.run(calls.resume(self.id, timeout))
        return self.info

    async def snapshot(self, *, name: Optional[str] = None, scrub: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.SnapshotResult:
        return await self._t.run(calls.snapshot(self.id, name, scrub, timeout))

    async def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> m.Fork["AsyncSandbox"]:
        d = await self._t.run(calls.fork(self.id, count, labels, timeout))
        return m.Fork(
            sandboxes=[AsyncSandbox(self._t, m.SandboxInfo.from_wire(s)) for s in d.get("sandboxes", [])],
            snapshot=m.SnapshotResult.from_wire(d.get("snapshot")),
            failures=[m.ForkFailure(f.get("code", ""), f.get("message", "")) for f in d.get("failures", [])],
        )

    async def set_network(self, mode: str, *, allow: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.NetworkState:
        return await self._t.run(calls.set_network(self.id, mode, allow, timeout))

    async def network(self, *, timeout: Optional[float] = None) -> m.NetworkState:
        return await self._t.run(calls.network(self.id, timeout))

    async def trajectory(self, *, after_seq: Optional[int] = None, limit: Optional[int] = None, timeout: Optional[float] = None) -> m.Trajectory:
        return await self._t.run(calls.trajectory(self.id, after_seq, limit, timeout))

    async def replay(self, *, timeout: Optional[float] = None) -> Tuple["AsyncSandbox", m.ReplayReport]:
        d = await self._t.run(calls.replay(self.id, timeout))
        return AsyncSandbox(self._t, m.SandboxInfo.from_wire(d.get("sandbox"))), m.ReplayReport.from_wire(d)

    async def terminal(
        self, *, cmd: Optional[Sequence[str]] = None, cols: Optional[int] = None, rows: Optional[int] = None, cwd: Optional[str] = None, timeout: Optional[float] = None
    ) -> AsyncTerminal:
        return await AsyncTerminal.open(self._t, self.id, cmd=cmd, cols=cols, rows=rows, cwd=cwd, timeout=timeout)


async def nodes(*, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List[m.NodeInfo]:
    return await transport_for(url, api_key).run(calls.nodes(timeout))

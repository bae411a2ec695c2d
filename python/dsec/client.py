"""The client, written once: what every call of ``Sandbox`` and ``AsyncSandbox`` does.

``sandbox.py`` (sync) and ``aio.py`` (asyncio) are thin faces over this module. Why this shape:

* Every method is written here once, as asyncio code over a small I/O interface (``IO``: run an
  ``Op``, read an NDJSON answer line by line, sleep, shield a clean-up from cancellation).
  ``calls.py`` stays the sans-I/O layer under it: each request as data, each answer parsed.
* The asyncio face gives it ``AsyncIO`` (the asyncio transport) and exposes the methods as they
  are. The sync face gives it ``SyncIO``, whose coroutines never suspend: each does its blocking
  call and returns, so a coroutine of this module runs to its end on one ``send(None)``, with no
  event loop and no thread (``sandbox.blocking``). Behaviour cannot drift between the two
  clients, because there is only one copy of it.
* Rejected: generating ``aio.py`` from ``sandbox.py`` (a second 500-line file to keep in step);
  running the sync client in a thread for the async one (a cancelled task could not close its
  connection, and that hang-up is how cancelling a call kills its command); a plain sans-I/O
  core alone (it was there already, in ``calls.py``; the copies were the methods above it).
* The implementations are the ``_``-named methods; each face assigns its public name through a
  wrapper (``blocking`` / ``awaiting``) that keeps the signature, docstring and types (ParamSpec),
  so mypy and ``help()`` see the same API as before. Handle types differ by face (``Process`` or
  ``AsyncProcess``): the classes here are generic in them, and each face says how to make one.
  Classmethods keep their signatures in the faces (mypy cannot carry a ParamSpec'd classmethod
  over to a subclass), with one-line bodies that call in here.
"""

from __future__ import annotations

from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from . import calls
from . import models as m
from .calls import Cmd, Op

# Re-exported: the faces take every shared piece from this module.
from .client_files import FilesCore as FilesCore
from .client_files import tar_directory as tar_directory
from .client_files import untar_into as untar_into
from .client_io import IO as IO
from .client_io import AsyncIO as AsyncIO
from .client_io import SyncIO as SyncIO
from .client_io import _check as _check
from .client_io import _Handle as _Handle
from .client_io import _aclose as _aclose
from .errors import CommandExitError, DsecError, NotFoundError, UnreachableError

T = TypeVar("T")
PR = TypeVar("PR")  # the face's process handle
SE = TypeVar("SE")  # the face's session handle
SB = TypeVar("SB")  # the face's sandbox handle

#: Breaks in a row (no event between) after which a batch progress stream gives up.
BATCH_STREAM_RETRIES = 30


# -- processes, commands, sessions ----------------------------------------------------------------


class ProcessCore(_Handle):
    def __init__(self, transport: Any, sandbox_id: str, info: m.ProcessInfo) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def _output(self, *, stdout_offset: int = 0, stderr_offset: int = 0, timeout: Optional[float] = None) -> m.ProcessOutput:
        """Output kept so far (bytes), from these byte offsets on."""
        out = await self._io.run(calls.process_output(self.sandbox_id, self.id, stdout_offset, stderr_offset, timeout))
        self.info = out.process
        return out

    async def _follow(self, *, poll: float = 0.2) -> AsyncIterator[m.OutputEvent]:
        """Output as it is produced (polled), until the process exits."""
        offsets = {"stdout": 0, "stderr": 0}
        while True:
            out = await self._output(stdout_offset=offsets["stdout"], stderr_offset=offsets["stderr"])
            for stream, data in (("stdout", out.stdout), ("stderr", out.stderr)):
                if data:
                    offsets[stream] += len(data)
                    yield m.OutputEvent(stream, data)
            if out.process.status == "exited":
                return
            await self._wait(wait=poll)

    async def _wait(self, *, wait: float = 30.0, timeout: Optional[float] = None) -> m.ProcessInfo:
        """Waits until the process exits or ``wait`` seconds pass; its state either way."""
        self.info = await self._io.run(calls.wait_process(self.sandbox_id, self.id, wait, timeout))
        return self.info

    async def _signal(self, signal: str = "SIGTERM", *, timeout: Optional[float] = None) -> m.ProcessInfo:
        """Sends a signal ("SIGTERM", "SIGINT", "SIGKILL", …) to the process."""
        self.info = await self._io.run(calls.signal_process(self.sandbox_id, self.id, signal, timeout))
        return self.info

    async def _kill(self, *, timeout: Optional[float] = None) -> m.ProcessInfo:
        """Kills the process and everything it started."""
        self.info = await self._io.run(calls.kill_process(self.sandbox_id, self.id, timeout))
        return self.info

    async def _write_stdin(self, data: Union[str, bytes], *, eof: bool = False, timeout: Optional[float] = None) -> None:
        """Writes to the stdin of a process started with ``stdin=True``."""
        await self._io.run(calls.write_stdin(self.sandbox_id, self.id, data, eof, timeout))

    async def _close_stdin(self, *, timeout: Optional[float] = None) -> None:
        """Closes the process's stdin (it reads end of file)."""
        await self._write_stdin(b"", eof=True, timeout=timeout)


class CommandsCore(_Handle, Generic[PR]):
    """Runs commands in a sandbox: to completion, streamed, or in the background."""

    def __init__(self, transport: Any, sandbox_id: str) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id

    def _process(self, info: m.ProcessInfo) -> PR:
        raise NotImplementedError

    async def _run(
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
        """Runs a command (a shell string, or an argv list) to completion.

        ``timeout`` kills it (its whole tree) after that many seconds, and the result says
        ``timed_out``. ``binary=True`` returns stdout/stderr as bytes. ``check=True`` raises
        ``CommandExitError`` on a non-zero exit. ``writable_paths`` confines its writes (Landlock).

        Example: ``sb.commands.run("echo hi").stdout == "hi\\n"``
        """
        body = calls.exec_body(cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, binary=binary)
        return _check(await self._io.run(calls.exec_(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout))), check)

    async def _stream(
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
        """Runs a command and yields its output as it is produced (``OutputEvent``, bytes), then
        its status (``ExitEvent``). Leaving the loop early disconnects, which kills the command.
        ``uncapped=True`` sends every byte, not only the first ``max_output_bytes`` per stream.

        Example (sync; ``async for`` with ``AsyncSandbox``)::

            for ev in sb.commands.stream("make"):
                if isinstance(ev, dsec.OutputEvent): sys.stdout.buffer.write(ev.data)
        """
        body = calls.exec_body(cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, uncapped=uncapped)
        lines = self._io.lines(calls.exec_stream(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout)))
        try:
            async for line in lines:
                ev = calls.stream_event(line)
                if ev is not None:
                    yield ev
        finally:
            await _aclose(lines)

    async def _start(
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
    ) -> PR:
        """Starts a background process that outlives this call; ``stdin=True`` keeps its stdin open."""
        op = calls.start_process(
            self.sandbox_id, cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, request_timeout=request_timeout
        )
        return self._process(await self._io.run(op))

    async def _list(self, *, timeout: Optional[float] = None) -> List[PR]:
        """Background processes (running, and recently exited)."""
        return [self._process(p) for p in await self._io.run(calls.list_processes(self.sandbox_id, timeout))]

    async def _connect(self, process_id: str, *, timeout: Optional[float] = None) -> PR:
        """A handle on a background process by id."""
        out = await self._io.run(calls.process_output(self.sandbox_id, process_id, 0, 0, timeout))
        return self._process(out.process)


class SessionCore(_Handle):
    """A persistent shell: ``cd``, ``export`` and variables carry over between commands."""

    def __init__(self, transport: Any, sandbox_id: str, info: m.SessionInfo) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    async def _run(
        self,
        cmd: str,
        *,
        timeout: Optional[float] = None,
        max_output_bytes: Optional[int] = None,
        binary: bool = False,
        check: bool = False,
        request_timeout: Optional[float] = None,
    ) -> m.ExecResult:
        """Runs one command in the session; ``timeout`` interrupts it (the session survives)."""
        op = calls.session_exec(self.sandbox_id, self.id, cmd, timeout, max_output_bytes, binary, request_timeout)
        return _check(await self._io.run(op), check)

    async def _close(self, *, timeout: Optional[float] = None) -> None:
        """Ends the session's shell."""
        await self._io.run(calls.close_session(self.sandbox_id, self.id, timeout))

    async def _close_unless_gone(self) -> None:
        try:
            await self._close()
        except NotFoundError:
            pass


class SessionsCore(_Handle, Generic[SE]):
    def __init__(self, transport: Any, sandbox_id: str) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id

    def _session(self, info: m.SessionInfo) -> SE:
        raise NotImplementedError

    async def _create(
        self,
        *,
        shell: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> SE:
        """Opens a shell session (``shell``: "auto", "bash" or "sh")."""
        return self._session(await self._io.run(calls.open_session(self.sandbox_id, shell, cwd, env, writable_paths, timeout)))

    async def _list(self, *, timeout: Optional[float] = None) -> List[SE]:
        """The sandbox's open sessions."""
        return [self._session(s) for s in await self._io.run(calls.list_sessions(self.sandbox_id, timeout))]




# -- sandboxes ------------------------------------------------------------------------------------


class SandboxCore(_Handle, Generic[SB]):
    """A handle on one sandbox."""

    def __init__(self, transport: Any, info: m.SandboxInfo) -> None:
        super().__init__(transport)
        self.info = info

    def _sandbox(self, info: m.SandboxInfo) -> SB:
        raise NotImplementedError

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, status={self.info.status!r})"

    async def _refresh(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        """The sandbox's state now (also kept in ``info``)."""
        self.info = await self._io.run(calls.get(self.id, timeout))
        return self.info

    async def _kill(self, *, timeout: Optional[float] = None) -> None:
        """Kills the sandbox and removes everything it had. Idempotent: a sandbox already killed
        or gone is no error, so ``finally: sb.kill()`` is safe."""
        await self._io.run(calls.kill(self.id, timeout))

    async def _kill_unless_gone(self) -> None:
        try:
            await self._kill()
        except NotFoundError:
            pass

    async def _pause(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        """Freezes the sandbox; memory stays resident. Commands raise ConflictError until resume()."""
        self.info = await self._io.run(calls.pause(self.id, timeout))
        return self.info

    async def _resume(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        """Thaws a paused sandbox."""
        self.info = await self._io.run(calls.resume(self.id, timeout))
        return self.info

    async def _snapshot(self, *, name: Optional[str] = None, scrub: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.SnapshotResult:
        """Captures the sandbox's changes (pack_diff) as an image; ``Sandbox.create(snap.image_id)`` restores it."""
        return await self._io.run(calls.snapshot(self.id, name, scrub, timeout))

    async def _migrate(self, *, edge: Optional[str] = None, pool: Optional[str] = None, restart_processes: bool = False, timeout: Optional[float] = None) -> m.MigrateResult:
        """Moves the sandbox to another edge (an admin key's call), keeping its id, files, labels,
        policy and trajectory; calls on it meanwhile wait or are retried. A container running
        processes is refused (ConflictError, SANDBOX_NOT_MIGRATABLE) unless ``restart_processes``."""
        r = await self._io.run(calls.migrate(self.id, edge, pool, restart_processes, timeout))
        self.info = r.sandbox
        return r

    async def _fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> m.Fork[SB]:
        """One snapshot, then ``count`` new sandboxes from it: rollouts from the same state."""
        d = await self._io.run(calls.fork(self.id, count, labels, timeout))
        return m.Fork(
            sandboxes=[self._sandbox(m.SandboxInfo.from_wire(s)) for s in d.get("sandboxes", [])],
            snapshot=m.SnapshotResult.from_wire(d.get("snapshot")),
            failures=[m.ForkFailure(f.get("code", ""), f.get("message", "")) for f in d.get("failures", [])],
        )

    async def _set_network(self, mode: str, *, allow: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.NetworkState:
        """Switches the egress policy ("none", "allow" with ``allow``, "open"); in force on return."""
        return await self._io.run(calls.set_network(self.id, mode, allow, timeout))

    async def _network(self, *, timeout: Optional[float] = None) -> m.NetworkState:
        """The egress policy in force."""
        return await self._io.run(calls.network(self.id, timeout))

    async def _trajectory(
        self, *, after_seq: Optional[int] = None, limit: Optional[int] = None, lineage: bool = False, timeout: Optional[float] = None
    ) -> m.Trajectory:
        """The logged steps (commands, session commands, file changes) with their results.
        ``lineage=True`` (a fork): its ancestors' steps first, oldest first, each up to where the
        next was forked from it, every entry with its ``sandbox_id``; ``lineage_missing`` names an
        ancestor whose log is no longer kept. ``after_seq`` and ``limit`` page this sandbox's own
        steps; the ancestors' come on the first page."""
        return await self._io.run(calls.trajectory(self.id, after_seq, limit, timeout, lineage))

    async def _replay(self, *, timeout: Optional[float] = None) -> Tuple[SB, m.ReplayReport]:
        """Rebuilds this sandbox as a new one from its image and trajectory."""
        d = await self._io.run(calls.replay(self.id, timeout))
        return self._sandbox(m.SandboxInfo.from_wire(d.get("sandbox"))), m.ReplayReport.from_wire(d)


# -- trajectories in bulk: what the faces' trajectories do -----------------------------------------


async def trajectories(
    io: IO, labels: Optional[Mapping[str, str]], batch: Optional[str], project: Optional[str], timeout: Optional[float]
) -> AsyncIterator[m.TrajectoryEntry]:
    """Every step of many sandboxes as it streams (``Sandbox.trajectories``); leaving the loop
    early closes the stream."""
    lines = io.lines(calls.trajectories(labels, batch, project, timeout))
    try:
        async for line in lines:
            yield m.TrajectoryEntry.from_wire(line)
    finally:
        await _aclose(lines)


# -- batches: what the faces' create_many / iter_create_many do -----------------------------------


async def batch_events(io: IO, batch_id: str, after: int = -1) -> AsyncIterator[Dict[str, Any]]:
    """A batch's progress events until it ends; a broken stream (a dropped connection, a
    restarted control plane) is picked up again after the last event seen, so none is lost or
    repeated."""
    breaks = 0
    while True:
        lines = io.lines(calls.batch_events(batch_id, after))
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
            await _aclose(lines)
        breaks += 1
        if breaks > BATCH_STREAM_RETRIES:
            raise UnreachableError(f"the progress stream of batch {batch_id} broke {breaks} times in a row", "STREAM_BROKEN")
        await io.sleep(min(0.2 * breaks, 2.0))


async def _cancel_quietly(io: IO, batch_id: str) -> None:
    try:
        await io.run(calls.cancel_batch(batch_id, None))
    except DsecError:
        pass  # already ended, or the server is gone: nothing more to stop


async def iter_create_many(
    io: IO, wrap: Callable[[m.SandboxInfo], SB], count: int, concurrency: Optional[int], timeout: Optional[float], spec: Dict[str, Any]
) -> AsyncIterator[m.BatchProgress[SB]]:
    """Starts a batch and yields its progress (``Sandbox.iter_create_many``); stopping before it is
    done cancels it, which kills every sandbox it made."""
    info = await io.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
    tally = calls.BatchTally(info.id, count)
    finished = False
    events = batch_events(io, info.id)
    try:
        async for e in events:
            tally.add(e)
            kind = str(e.get("type", ""))
            sandbox: Optional[SB] = None
            error: Optional[DsecError] = None
            if kind == "running" and e.get("sandboxId"):
                sandbox = wrap(await io.run(calls.get(str(e["sandboxId"]), timeout)))
            elif kind == "failed":
                error = calls.batch_failure(info.id, e)
            finished = kind in ("done", "cancelled")
            yield m.BatchProgress(info.id, kind, count, tally.placed, tally.running, tally.failed, e.get("index"), sandbox, error, int(e.get("seq", -1)))
    finally:
        await _aclose(events)
        if not finished:
            await io.shield(_cancel_quietly(io, info.id))


async def create_many(
    io: IO, wrap: Callable[[m.SandboxInfo], SB], count: int, concurrency: Optional[int], timeout: Optional[float], spec: Dict[str, Any]
) -> m.Batch[SB]:
    """Runs a batch to its end and returns what runs and what failed (``Sandbox.create_many``)."""
    info = await io.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
    failures: List[DsecError] = []
    finished = False
    events = batch_events(io, info.id)
    try:
        async for e in events:
            if e.get("type") == "failed":
                failures.append(calls.batch_failure(info.id, e))
            finished = e.get("type") in ("done", "cancelled")
    finally:
        await _aclose(events)
        if not finished:
            await io.shield(_cancel_quietly(io, info.id))
    running = await io.run(calls.list_sandboxes({calls.BATCH_LABEL: info.id}, "running", timeout))
    return m.Batch(info.id, [wrap(i) for i in running], failures)

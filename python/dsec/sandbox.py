"""The sync client: ``Sandbox`` and its namespaces (commands, sessions, files).

Every method takes a keyword ``timeout`` in seconds: the deadline of the HTTP call (for
commands it is the command's own timeout, and ``request_timeout`` bounds the call). The asyncio
client (``aio.py``) has the same surface with ``await``.
"""

from __future__ import annotations

import io
import tarfile
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, cast

from . import calls
from . import models as m
from .calls import Cmd
from .config import ConnectionConfig, resolve_connection
from .errors import CommandExitError, DsecError, NotFoundError, UnreachableError
from .terminal import Terminal
from .transport import SyncTransport

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


#: Breaks in a row (no event between) after which a batch progress stream gives up.
BATCH_STREAM_RETRIES = 30


def _batch_events(t: SyncTransport, batch_id: str, after: int = -1) -> Iterator[Dict[str, Any]]:
    """A batch's progress events until it ends; a broken stream (a dropped connection, a
    restarted control plane) is picked up again after the last event seen, so none is lost or
    repeated."""
    breaks = 0
    while True:
        try:
            for e in t.lines(calls.batch_events(batch_id, after)):
                after, breaks = int(e.get("seq", after)), 0
                yield e
                if e.get("type") in ("done", "cancelled"):
                    return
        except DsecError as err:
            if err.status is not None and 400 <= err.status < 500:
                raise
        breaks += 1
        if breaks > BATCH_STREAM_RETRIES:
            raise UnreachableError(f"the progress stream of batch {batch_id} broke {breaks} times in a row", "STREAM_BROKEN")
        time.sleep(min(0.2 * breaks, 2.0))


def _cancel_quietly(t: SyncTransport, batch_id: str) -> None:
    try:
        t.run(calls.cancel_batch(batch_id, None))
    except DsecError:
        pass  # already ended, or the server is gone: nothing more to stop


def _check(result: m.ExecResult, check: bool) -> m.ExecResult:
    if check and result.exit_code != 0:
        raise CommandExitError(result.exit_code, result.stdout, result.stderr)
    return result


class Process:
    """A background process: read its output, wait, signal, feed stdin."""

    def __init__(self, transport: SyncTransport, sandbox_id: str, info: m.ProcessInfo) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def output(self, *, stdout_offset: int = 0, stderr_offset: int = 0, timeout: Optional[float] = None) -> m.ProcessOutput:
        """Output kept so far (bytes), from these byte offsets on."""
        out = self._t.run(calls.process_output(self.sandbox_id, self.id, stdout_offset, stderr_offset, timeout))
        self.info = out.process
        return out

    def follow(self, *, poll: float = 0.2) -> Iterator[m.OutputEvent]:
        """Output as it is produced (polled), until the process exits."""
        offsets = {"stdout": 0, "stderr": 0}
        while True:
            out = self.output(stdout_offset=offsets["stdout"], stderr_offset=offsets["stderr"])
            for stream, data in (("stdout", out.stdout), ("stderr", out.stderr)):
                if data:
                    offsets[stream] += len(data)
                    yield m.OutputEvent(stream, data)
            if out.process.status == "exited":
                return
            self.wait(wait=poll)

    def wait(self, *, wait: float = 30.0, timeout: Optional[float] = None) -> m.ProcessInfo:
        """Waits until the process exits or ``wait`` seconds pass; its state either way."""
        self.info = self._t.run(calls.wait_process(self.sandbox_id, self.id, wait, timeout))
        return self.info

    def signal(self, signal: str = "SIGTERM", *, timeout: Optional[float] = None) -> m.ProcessInfo:
        self.info = self._t.run(calls.signal_process(self.sandbox_id, self.id, signal, timeout))
        return self.info

    def kill(self, *, timeout: Optional[float] = None) -> m.ProcessInfo:
        """Kills the process and everything it started."""
        self.info = self._t.run(calls.kill_process(self.sandbox_id, self.id, timeout))
        return self.info

    def write_stdin(self, data: Union[str, bytes], *, eof: bool = False, timeout: Optional[float] = None) -> None:
        """Writes to the stdin of a process started with ``stdin=True``."""
        self._t.run(calls.write_stdin(self.sandbox_id, self.id, data, eof, timeout))

    def close_stdin(self, *, timeout: Optional[float] = None) -> None:
        self.write_stdin(b"", eof=True, timeout=timeout)


class Commands:
    """Runs commands in a sandbox: to completion, streamed, or in the background."""

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    def run(
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
        return _check(self._t.run(calls.exec_(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout))), check)

    def stream(
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
    ) -> Iterator[m.StreamEvent]:
        """Runs a command and yields its output as it is produced (``OutputEvent``, bytes), then
        its status (``ExitEvent``). Leaving the loop early disconnects, which kills the command.
        ``uncapped=True`` sends every byte, not only the first ``max_output_bytes`` per stream.

        Example::

            for ev in sb.commands.stream("make"):
                if isinstance(ev, dsec.OutputEvent): sys.stdout.buffer.write(ev.data)
        """
        body = calls.exec_body(cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, uncapped=uncapped)
        for line in self._t.lines(calls.exec_stream(self.sandbox_id, body, calls.command_deadline(timeout, request_timeout))):
            ev = calls.stream_event(line)
            if ev is not None:
                yield ev

    def start(
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
    ) -> Process:
        """Starts a background process that outlives this call; ``stdin=True`` keeps its stdin open."""
        op = calls.start_process(
            self.sandbox_id, cmd, cwd=cwd, env=env, writable_paths=writable_paths, stdin=stdin, timeout=timeout, max_output_bytes=max_output_bytes, request_timeout=request_timeout
        )
        return Process(self._t, self.sandbox_id, self._t.run(op))

    def list(self, *, timeout: Optional[float] = None) -> List[Process]:
        """Background processes (running, and recently exited)."""
        return [Process(self._t, self.sandbox_id, p) for p in self._t.run(calls.list_processes(self.sandbox_id, timeout))]

    def connect(self, process_id: str, *, timeout: Optional[float] = None) -> Process:
        out = self._t.run(calls.process_output(self.sandbox_id, process_id, 0, 0, timeout))
        return Process(self._t, self.sandbox_id, out.process)


class Session:
    """A persistent shell: ``cd``, ``export`` and variables carry over between commands."""

    def __init__(self, transport: SyncTransport, sandbox_id: str, info: m.SessionInfo) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def run(
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
        return _check(self._t.run(op), check)

    def close(self, *, timeout: Optional[float] = None) -> None:
        self._t.run(calls.close_session(self.sandbox_id, self.id, timeout))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.close()
        except NotFoundError:
            pass


class Sessions:
    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    def create(
        self,
        *,
        shell: Optional[str] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        writable_paths: Optional[Sequence[str]] = None,
        timeout: Optional[float] = None,
    ) -> Session:
        """Opens a shell session (``shell``: "auto", "bash" or "sh")."""
        return Session(self._t, self.sandbox_id, self._t.run(calls.open_session(self.sandbox_id, shell, cwd, env, writable_paths, timeout)))

    def list(self, *, timeout: Optional[float] = None) -> List[Session]:
        return [Session(self._t, self.sandbox_id, s) for s in self._t.run(calls.list_sessions(self.sandbox_id, timeout))]


def tar_directory(local_dir: str) -> bytes:
    """A tar archive of a local directory's contents (entries relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(local_dir, arcname=".")
    return buf.getvalue()


def untar_into(archive: bytes, local_dir: str) -> None:
    """Unpacks an archive from ``download_tar`` into a local directory, refusing unsafe entries."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        for member in tar.getmembers():
            name = member.name
            if name.startswith("/") or ".." in name.split("/") or member.isdev():
                raise DsecError(f"refusing to unpack {name!r}: it would leave {local_dir}", "UNSAFE_ARCHIVE")
            if (member.issym() or member.islnk()) and (member.linkname.startswith("/") or ".." in member.linkname.split("/")):
                raise DsecError(f"refusing to unpack link {name!r} -> {member.linkname!r}", "UNSAFE_ARCHIVE")
        if hasattr(tarfile, "data_filter"):  # 3.12, and security releases of 3.9-3.11
            tar.extractall(local_dir, **cast(Dict[str, Any], {"filter": "data"}))  # older typeshed lacks filter=
        else:
            tar.extractall(local_dir)  # noqa: S202 - every member checked above


class Files:
    """Files inside a sandbox; every path resolves inside its root."""

    def __init__(self, transport: SyncTransport, sandbox_id: str) -> None:
        self._t = transport
        self.sandbox_id = sandbox_id

    def read(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        return self._t.run(calls.read_file(self.sandbox_id, path, timeout))

    def read_text(self, path: str, *, encoding: str = "utf-8", timeout: Optional[float] = None) -> str:
        return self.read(path, timeout=timeout).decode(encoding)

    def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None, timeout: Optional[float] = None) -> m.WriteResult:
        """Creates or replaces a file (parents created); ``str`` is written as UTF-8."""
        return self._t.run(calls.write_file(self.sandbox_id, path, data, mode, timeout))

    def stat(self, path: str, *, timeout: Optional[float] = None) -> m.FileStat:
        return self._t.run(calls.stat(self.sandbox_id, path, timeout))

    def exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        try:
            self.stat(path, timeout=timeout)
            return True
        except NotFoundError:
            return False

    def list(self, path: str, *, timeout: Optional[float] = None) -> m.DirListing:
        return self._t.run(calls.list_dir(self.sandbox_id, path, timeout))

    def mkdir(self, path: str, *, parents: bool = True, timeout: Optional[float] = None) -> None:
        self._t.run(calls.mkdir(self.sandbox_id, path, parents, timeout))

    def remove(self, path: str, *, recursive: bool = False, timeout: Optional[float] = None) -> None:
        self._t.run(calls.remove(self.sandbox_id, path, recursive, timeout))

    def rename(self, src: str, dst: str, *, timeout: Optional[float] = None) -> None:
        self._t.run(calls.rename(self.sandbox_id, src, dst, timeout))

    def upload_tar(self, directory: str, archive: bytes, *, timeout: Optional[float] = None) -> m.WriteResult:
        """Unpacks a tar archive into ``directory`` (created if missing), inside the sandbox."""
        return self._t.run(calls.upload_tar(self.sandbox_id, directory, archive, timeout))

    def download_tar(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        """A file or directory as a tar archive (one top-level entry: its name)."""
        return self._t.run(calls.download_tar(self.sandbox_id, path, timeout))

    def upload_dir(self, local_dir: str, directory: str, *, timeout: Optional[float] = None) -> m.WriteResult:
        """Copies a local directory's contents into ``directory`` in the sandbox (as one tar)."""
        return self.upload_tar(directory, tar_directory(local_dir), timeout=timeout)

    def download_dir(self, path: str, local_dir: str, *, timeout: Optional[float] = None) -> None:
        """Copies a sandbox file or directory into ``local_dir`` (as ``local_dir/<name>``)."""
        untar_into(self.download_tar(path, timeout=timeout), local_dir)


class Sandbox:
    """A handle on one sandbox. ``with Sandbox.create(...) as sb:`` kills it on exit."""

    def __init__(self, transport: SyncTransport, info: m.SandboxInfo) -> None:
        self._t = transport
        self.info = info
        self.commands = Commands(transport, info.id)
        self.files = Files(transport, info.id)
        self.sessions = Sessions(transport, info.id)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, status={self.info.status!r})"

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except NotFoundError:
            pass

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
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        request_timeout: Optional[float] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns when it is running.

        Example: ``sb = dsec.Sandbox.create("busybox", memory_mib=64, labels={"task": "t1"})``
        """
        t = transport_for(url, api_key, request_timeout)
        spec = calls.create_body(
            image=image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, labels=labels, network=network,
            ttl_seconds=ttl_seconds, idle_timeout_seconds=idle_timeout_seconds, on_expiry=on_expiry, backend=backend,
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
        ``concurrency`` bounds the creates in flight across the cluster (server default 64). A
        dropped progress stream is resumed after the last event seen. Stopping before the batch
        is done cancels it, which kills every sandbox it made.

        Example::

            for step in dsec.Sandbox.iter_create_many(32, image="busybox", memory_mib=64):
                if step.sandbox: pool.submit(rollout, step.sandbox)
        """
        t = transport_for(url, api_key, request_timeout)
        info = t.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
        tally = calls.BatchTally(info.id, count)
        finished = False
        try:
            for e in _batch_events(t, info.id):
                tally.add(e)
                kind = str(e.get("type", ""))
                sandbox: Optional[Sandbox] = None
                error: Optional[DsecError] = None
                if kind == "running" and e.get("sandboxId"):
                    sandbox = cls(t, t.run(calls.get(str(e["sandboxId"]), timeout)))
                elif kind == "failed":
                    error = calls.batch_failure(info.id, e)
                finished = kind in ("done", "cancelled")
                yield m.BatchProgress(info.id, kind, count, tally.placed, tally.running, tally.failed, e.get("index"), sandbox, error, int(e.get("seq", -1)))
        finally:
            if not finished:
                _cancel_quietly(t, info.id)

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
        info = t.run(calls.create_batch(count, calls.create_body(**spec), concurrency, timeout))
        failures: List[DsecError] = []
        finished = False
        try:
            for e in _batch_events(t, info.id):
                if e.get("type") == "failed":
                    failures.append(calls.batch_failure(info.id, e))
                finished = e.get("type") in ("done", "cancelled")
        finally:
            if not finished:
                _cancel_quietly(t, info.id)
        running = t.run(calls.list_sandboxes({calls.BATCH_LABEL: info.id}, "running", timeout))
        return m.Batch(info.id, [cls(t, i) for i in running], failures)

    @classmethod
    def batch_info(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """A batch's state and counts."""
        return transport_for(url, api_key).run(calls.batch_info(batch_id, timeout))

    @classmethod
    def cancel_batch(cls, batch_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.BatchInfo:
        """Cancels a batch: no more creates, and the sandboxes it made are killed."""
        return transport_for(url, api_key).run(calls.cancel_batch(batch_id, timeout))

    # -- this sandbox ---------------------------------------------------------------------------

    def refresh(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        self.info = self._t.run(calls.get(self.id, timeout))
        return self.info

    def kill(self, *, timeout: Optional[float] = None) -> None:
        """Kills the sandbox and removes everything it had. Idempotent: a sandbox already killed
        or gone is no error, so ``finally: sb.kill()`` is safe."""
        self._t.run(calls.kill(self.id, timeout))

    @classmethod
    def kill_by_id(cls, sandbox_id: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Kills a sandbox by id without connecting first; idempotent like ``kill()``."""
        transport_for(url, api_key).run(calls.kill(sandbox_id, timeout))

    def pause(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        """Freezes the sandbox; memory stays resident. Commands raise ConflictError until resume()."""
        self.info = self._t.run(calls.pause(self.id, timeout))
        return self.info

    def resume(self, *, timeout: Optional[float] = None) -> m.SandboxInfo:
        self.info = self._t.run(calls.resume(self.id, timeout))
        return self.info

    def snapshot(self, *, name: Optional[str] = None, scrub: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.SnapshotResult:
        """Captures the sandbox's changes (pack_diff) as an image; ``Sandbox.create(snap.image_id)`` restores it."""
        return self._t.run(calls.snapshot(self.id, name, scrub, timeout))

    def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> m.Fork["Sandbox"]:
        """One snapshot, then ``count`` new sandboxes from it: rollouts from the same state."""
        d = self._t.run(calls.fork(self.id, count, labels, timeout))
        return m.Fork(
            sandboxes=[Sandbox(self._t, m.SandboxInfo.from_wire(s)) for s in d.get("sandboxes", [])],
            snapshot=m.SnapshotResult.from_wire(d.get("snapshot")),
            failures=[m.ForkFailure(f.get("code", ""), f.get("message", "")) for f in d.get("failures", [])],
        )

    def set_network(self, mode: str, *, allow: Optional[Sequence[str]] = None, timeout: Optional[float] = None) -> m.NetworkState:
        """Switches the egress policy ("none", "allow" with ``allow``, "open"); in force on return."""
        return self._t.run(calls.set_network(self.id, mode, allow, timeout))

    def network(self, *, timeout: Optional[float] = None) -> m.NetworkState:
        return self._t.run(calls.network(self.id, timeout))

    def trajectory(self, *, after_seq: Optional[int] = None, limit: Optional[int] = None, timeout: Optional[float] = None) -> m.Trajectory:
        """The logged steps (commands, session commands, file changes) with their results."""
        return self._t.run(calls.trajectory(self.id, after_seq, limit, timeout))

    def replay(self, *, timeout: Optional[float] = None) -> Tuple["Sandbox", m.ReplayReport]:
        """Rebuilds this sandbox as a new one from its image and trajectory."""
        d = self._t.run(calls.replay(self.id, timeout))
        return Sandbox(self._t, m.SandboxInfo.from_wire(d.get("sandbox"))), m.ReplayReport.from_wire(d)

    def terminal(
        self, *, cmd: Optional[Sequence[str]] = None, cols: Optional[int] = None, rows: Optional[int] = None, cwd: Optional[str] = None, timeout: Optional[float] = None
    ) -> Terminal:
        """Opens an interactive terminal (a pseudo-terminal in the sandbox)."""
        return Terminal.open(self._t, self.id, cmd=cmd, cols=cols, rows=rows, cwd=cwd, timeout=timeout)


def nodes(*, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List[m.NodeInfo]:
    """The server's edges: sandboxes, admission limits, layer caches."""
    return transport_for(url, api_key).run(calls.nodes(timeout))



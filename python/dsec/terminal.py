"""Interactive terminals: a command under a pseudo-terminal in the sandbox, over a WebSocket to
``/v1/sandboxes/{id}/pty`` (binary frames both ways; text frames ``{"type":"resize"}`` out,
``{"type":"exit","exitCode"}`` or ``{"type":"error"}`` in). Closing the terminal kills it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import ssl
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, Optional, Sequence, Tuple, Union

from . import websocket as ws
from .calls import pty_target
from .errors import DsecError, TimeoutError, UnreachableError, error_from_wire
from .transport import USER_AGENT, Endpoint, parse_error

if TYPE_CHECKING:
    from .aio_transport import AsyncTransport
    from .transport import SyncTransport

_HEAD_LIMIT = 64 << 10


def _content_length(headers: Dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0


class _Messages:
    """What both terminal flavours do with an incoming message."""

    def __init__(self) -> None:
        self.exit_code: Optional[int] = None
        self.error: Optional[DsecError] = None

    def text(self, payload: bytes) -> None:
        try:
            m = json.loads(payload.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return
        if not isinstance(m, dict):
            return
        if m.get("type") == "exit" and isinstance(m.get("exitCode"), int):
            self.exit_code = m["exitCode"]
        elif m.get("type") == "error":
            self.error = error_from_wire(None, m.get("error"))

    def result(self) -> int:
        if self.error is not None:
            raise self.error
        # Closed without an exit message (the server went away): report a failure, as the TS SDK does.
        return self.exit_code if self.exit_code is not None else 1


def _resize(cols: int, rows: int) -> bytes:
    return ws.encode_frame(ws.OP_TEXT, json.dumps({"type": "resize", "cols": cols, "rows": rows}).encode("utf-8"))


def _keys(data: Union[str, bytes]) -> bytes:
    return ws.encode_frame(ws.OP_BINARY, data.encode("utf-8") if isinstance(data, str) else bytes(data))


class Terminal:
    """A sync terminal. Output arrives on a reader thread; iterate to read it.

    Example::

        with sb.terminal(cmd=["/bin/sh"]) as t:
            t.write("echo hi; exit 3\\r")
            out = b"".join(t)          # until the command ends
            assert t.wait() == 3
    """

    def __init__(self, sock: socket.socket, leftover: bytes) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._out: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._msgs = _Messages()
        self._done = threading.Event()
        self._closed_sent = False
        self._parser = ws.FrameParser()
        self._reader = threading.Thread(target=self._read_loop, args=(leftover,), name="dsec-terminal", daemon=True)
        self._reader.start()

    @classmethod
    def open(
        cls,
        transport: "SyncTransport",
        sandbox_id: str,
        *,
        cmd: Optional[Sequence[str]] = None,
        cols: Optional[int] = None,
        rows: Optional[int] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "Terminal":
        e: Endpoint = transport.endpoint
        limit = timeout if timeout is not None else transport.config.request_timeout
        try:
            sock = socket.create_connection((e.host, e.port), timeout=limit)
            if e.https:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=e.host)
        except socket.timeout:
            raise TimeoutError(f"opening a terminal did not finish within {limit:g} s", "TIMEOUT") from None
        except OSError as err:
            raise UnreachableError(f"cannot reach dsec at {transport.config.url}: {err}", "UNREACHABLE") from None
        try:
            key = ws.new_key()
            target = e.prefix + pty_target(sandbox_id, cmd, cols, rows, cwd)
            sock.sendall(ws.handshake_request(e.host_header, target, key, {"Authorization": f"Bearer {transport.config.api_key}", "User-Agent": USER_AGENT}))
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk or len(buf) > _HEAD_LIMIT:
                    raise UnreachableError("the server closed the connection during the terminal handshake", "UNREACHABLE")
                buf += chunk
            head, _, rest = buf.partition(b"\r\n\r\n")
            status, headers = ws.parse_head(head)
            if status != 101:
                want = _content_length(headers)
                while len(rest) < want:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                raise parse_error(status, rest[:want])
            ws.check_upgrade(status, headers, key)
            sock.settimeout(None)
        except socket.timeout:
            sock.close()
            raise TimeoutError(f"opening a terminal did not finish within {limit:g} s", "TIMEOUT") from None
        except ws.ProtocolError as err:
            sock.close()
            raise DsecError(f"terminal handshake failed: {err}", "PROTOCOL_ERROR") from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, rest)

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except OSError:
                pass  # the reader sees the broken socket and ends the terminal

    def _read_loop(self, leftover: bytes) -> None:
        try:
            data = leftover
            while True:
                for frame in self._parser.feed(data):
                    if frame.opcode == ws.OP_BINARY:
                        self._out.put(frame.payload)
                    elif frame.opcode == ws.OP_TEXT:
                        self._msgs.text(frame.payload)
                    elif frame.opcode == ws.OP_PING:
                        self._send(ws.encode_frame(ws.OP_PONG, frame.payload))
                    elif frame.opcode == ws.OP_CLOSE:
                        self._close_frame()
                        return
                data = self._sock.recv(65536)
                if not data:
                    return
        except (OSError, ws.ProtocolError):
            return
        finally:
            self._done.set()
            self._out.put(None)
            try:
                self._sock.close()
            except OSError:
                pass

    def _close_frame(self) -> None:
        if not self._closed_sent:
            self._closed_sent = True
            self._send(ws.encode_frame(ws.OP_CLOSE, ws.close_payload(1000)))

    def write(self, data: Union[str, bytes]) -> None:
        """Sends keystrokes (``\\r`` is Enter; ``\\x03`` is Ctrl-C)."""
        self._send(_keys(data))

    def resize(self, cols: int, rows: int) -> None:
        self._send(_resize(cols, rows))

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next chunk of output; None once the terminal has ended. Raises TimeoutError."""
        try:
            chunk = self._out.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no terminal output within {timeout:g} s", "TIMEOUT") from None
        if chunk is None:
            self._out.put(None)  # later reads see the end too
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.read()
            if chunk is None:
                return
            yield chunk

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the command to end and returns its exit code."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the terminal's command did not end within {timeout:g} s", "TIMEOUT")
        return self._msgs.result()

    @property
    def exit_code(self) -> Optional[int]:
        """The exit code once the command has ended, else None."""
        return self._msgs.exit_code if self._done.is_set() else None

    def kill(self, timeout: float = 10.0) -> None:
        """Ends the command (closing the terminal kills it) and waits for the socket to close."""
        if not self._done.is_set():
            self._close_frame()
            if not self._done.wait(timeout):
                self._sock.close()
        self._reader.join(timeout)

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class AsyncTerminal:
    """An asyncio terminal; ``async for chunk in t`` reads output until the command ends."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, leftover: bytes) -> None:
        self._reader = reader
        self._writer = writer
        self._out: "asyncio.Queue[Optional[bytes]]" = asyncio.Queue()
        self._msgs = _Messages()
        self._done = asyncio.Event()
        self._closed_sent = False
        self._parser = ws.FrameParser()
        self._task = asyncio.ensure_future(self._read_loop(leftover))

    @classmethod
    async def open(
        cls,
        transport: "AsyncTransport",
        sandbox_id: str,
        *,
        cmd: Optional[Sequence[str]] = None,
        cols: Optional[int] = None,
        rows: Optional[int] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> "AsyncTerminal":
        limit = timeout if timeout is not None else transport.config.request_timeout
        try:
            reader, writer, rest = await asyncio.wait_for(cls._handshake(transport, sandbox_id, cmd, cols, rows, cwd), limit)
        except asyncio.TimeoutError:
            raise TimeoutError(f"opening a terminal did not finish within {limit:g} s", "TIMEOUT") from None
        return cls(reader, writer, rest)

    @staticmethod
    async def _handshake(
        transport: "AsyncTransport", sandbox_id: str, cmd: Optional[Sequence[str]], cols: Optional[int], rows: Optional[int], cwd: Optional[str]
    ) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        e = transport.endpoint
        try:
            reader, writer = await asyncio.open_connection(e.host, e.port, ssl=ssl.create_default_context() if e.https else None)
        except OSError as err:
            raise UnreachableError(f"cannot reach dsec at {transport.config.url}: {err}", "UNREACHABLE") from None
        try:
            key = ws.new_key()
            target = e.prefix + pty_target(sandbox_id, cmd, cols, rows, cwd)
            writer.write(ws.handshake_request(e.host_header, target, key, {"Authorization": f"Bearer {transport.config.api_key}", "User-Agent": USER_AGENT}))
            await writer.drain()
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise UnreachableError("the server closed the connection during the terminal handshake", "UNREACHABLE") from None
            status, headers = ws.parse_head(head[:-4])
            if status != 101:
                want = _content_length(headers)
                body = await reader.read(want) if want else b""
                while len(body) < want:
                    more = await reader.read(want - len(body))
                    if not more:
                        break
                    body += more
                raise parse_error(status, body)
            ws.check_upgrade(status, headers, key)
        except ws.ProtocolError as err:
            writer.close()
            raise DsecError(f"terminal handshake failed: {err}", "PROTOCOL_ERROR") from None
        except BaseException:
            writer.close()
            raise
        return reader, writer, b""

    async def _send(self, frame: bytes) -> None:
        try:
            self._writer.write(frame)
            await self._writer.drain()
        except (OSError, RuntimeError):
            pass  # the reader sees the broken socket and ends the terminal

    async def _read_loop(self, leftover: bytes) -> None:
        try:
            data = leftover
            while True:
                for frame in self._parser.feed(data):
                    if frame.opcode == ws.OP_BINARY:
                        self._out.put_nowait(frame.payload)
                    elif frame.opcode == ws.OP_TEXT:
                        self._msgs.text(frame.payload)
                    elif frame.opcode == ws.OP_PING:
                        await self._send(ws.encode_frame(ws.OP_PONG, frame.payload))
                    elif frame.opcode == ws.OP_CLOSE:
                        await self._close_frame()
                        return
                data = await self._reader.read(65536)
                if not data:
                    return
        except (OSError, ws.ProtocolError):
            return
        finally:
            self._done.set()
            self._out.put_nowait(None)
            self._writer.close()

    async def _close_frame(self) -> None:
        if not self._closed_sent:
            self._closed_sent = True
            await self._send(ws.encode_frame(ws.OP_CLOSE, ws.close_payload(1000)))

    async def write(self, data: Union[str, bytes]) -> None:
        await self._send(_keys(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._send(_resize(cols, rows))

    async def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        try:
            chunk = await asyncio.wait_for(self._out.get(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no terminal output within {timeout:g} s", "TIMEOUT") from None
        if chunk is None:
            self._out.put_nowait(None)
        return chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.read()
            if chunk is None:
                return
            yield chunk

    async def wait(self, timeout: Optional[float] = None) -> int:
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the terminal's command did not end within {timeout:g} s", "TIMEOUT") from None
        return self._msgs.result()

    @property
    def exit_code(self) -> Optional[int]:
        return self._msgs.exit_code if self._done.is_set() else None

    async def kill(self, timeout: float = 10.0) -> None:
        if not self._done.is_set():
            await self._close_frame()
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except asyncio.TimeoutError:
                self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def __aenter__(self) -> "AsyncTerminal":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()



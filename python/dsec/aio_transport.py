"""The asyncio HTTP transport: HTTP/1.1 over ``asyncio.open_connection`` (the standard library
has no async HTTP client), with a pool of kept-alive connections.

One call's deadline covers the whole exchange (``asyncio.wait_for``). Cancelling the task that
awaits a call closes its connection, which the server takes as a hang-up: a running command is
killed, as when the TypeScript SDK's AbortSignal fires.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, TypeVar

from .calls import Call, Op
from .config import ConnectionConfig
from .errors import DsecError, TimeoutError, UnreachableError
from .transport import DSEC_ERROR_HEADER, IDLE_REUSE_LIMIT, USER_AGENT, Endpoint, decode_json, parse_error, passthrough_error, retries, retry_pause, split_lines

T = TypeVar("T")

#: Idle connections kept for reuse; more concurrent calls open more, then close the surplus.
MAX_IDLE = 64


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = time.monotonic()

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # the loop may be closing; the socket goes with it
            pass


class _Response:
    def __init__(self, conn: _Conn, status: int, headers: Dict[str, str], head_only: bool = False) -> None:
        self.conn = conn
        self.status = status
        self.headers = headers
        #: The answer to a HEAD request carries no body whatever its headers say.
        self.head_only = head_only
        self.reusable = headers.get("connection", "").lower() != "close"

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked, sized, or up to EOF)."""
        r = self.conn.reader
        if self.status in (204, 304) or self.status < 200 or self.head_only:
            return
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await r.readline()
                if not size_line:
                    raise UnreachableError("the connection closed inside a chunked answer", "STREAM_BROKEN")
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 1 << 20))
                if not data:
                    raise UnreachableError("the connection closed before the whole answer arrived", "STREAM_BROKEN")
                left -= len(data)
                yield data
        else:
            self.reusable = False
            while True:
                data = await r.read(1 << 20)
                if not data:
                    return
                yield data

    async def read(self) -> bytes:
        parts: List[bytes] = []
        async for c in self.chunks():
            parts.append(c)
        return b"".join(parts)


class AsyncTransport:
    def __init__(self, config: ConnectionConfig) -> None:
        self.config = config
        self.endpoint = Endpoint(config.url)
        self._idle: List[_Conn] = []
        self._ssl = ssl.create_default_context() if self.endpoint.https else None

    async def _take(self) -> Tuple[_Conn, bool]:
        while self._idle:
            c = self._idle.pop()
            if time.monotonic() - c.idle_since < IDLE_REUSE_LIMIT and not c.reader.at_eof():
                return c, True
            c.close()
        e = self.endpoint
        try:
            reader, writer = await asyncio.open_connection(e.host, e.port, ssl=self._ssl, limit=1 << 20)
        except OSError as err:
            raise UnreachableError(f"cannot reach dsec at {self.config.url}: {err}", "UNREACHABLE") from None
        return _Conn(reader, writer), False

    def _give_back(self, c: _Conn) -> None:
        if len(self._idle) >= MAX_IDLE:
            c.close()
            return
        c.idle_since = time.monotonic()
        self._idle.append(c)

    async def aclose(self) -> None:
        """Closes the idle connections."""
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def _timeout(self, call: Call) -> float:
        return call.timeout if call.timeout is not None else self.config.request_timeout

    def _timeout_error(self, call: Call) -> TimeoutError:
        return TimeoutError(f"{call.method} {call.path} did not finish within {self._timeout(call):g} s", "TIMEOUT")

    async def _send(self, call: Call) -> _Response:
        body, headers = call.payload()
        e = self.endpoint
        headers.update({"Host": e.host_header, "Authorization": f"Bearer {self.config.api_key}", "User-Agent": USER_AGENT, "Connection": "keep-alive"})
        headers["Content-Length"] = str(len(body) if body is not None else 0)
        head = f"{call.method} {e.prefix}{call.target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        for attempt in (0, 1):
            c, reused = await self._take()
            try:
                c.writer.write(head.encode("latin-1") + (body or b""))
                await c.writer.drain()
                status_line = await c.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed before an answer")
                parts = status_line.decode("latin-1").split(" ", 2)
                status = int(parts[1])
                resp_headers: Dict[str, str] = {}
                while True:
                    line = await c.reader.readline()
                    if line in (b"\r\n", b"\n"):
                        break
                    if not line:
                        raise ConnectionResetError("closed inside the headers")
                    k, _, v = line.decode("latin-1").partition(":")
                    resp_headers[k.strip().lower()] = v.strip()
            except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as err:
                c.close()
                if reused and attempt == 0 and call.idempotent:
                    continue
                raise UnreachableError(f"the connection to dsec at {self.config.url} broke: {err!r}", "UNREACHABLE") from None
            except BaseException:
                c.close()
                raise
            return _Response(c, status, resp_headers, head_only=call.method == "HEAD")
        raise AssertionError("unreachable")

    async def _finish(self, resp: _Response) -> bytes:
        try:
            data = await resp.read()
        except BaseException:
            resp.conn.close()
            raise
        if resp.reusable:
            self._give_back(resp.conn)
        else:
            resp.conn.close()
        return data

    async def _response(self, call: Call) -> Tuple[int, Dict[str, str], bytes]:
        resp = await self._send(call)
        data = await self._finish(resp)
        if call.passthrough:
            err = passthrough_error(resp.status, resp.headers.get(DSEC_ERROR_HEADER), data)
            if err is not None:
                raise err
        elif resp.status >= 400:
            raise parse_error(resp.status, data)
        return resp.status, resp.headers, data

    async def content(self, call: Call) -> Tuple[int, bytes]:
        status, _, data = await self.response(call)
        return status, data

    async def response(self, call: Call) -> Tuple[int, Dict[str, str], bytes]:
        """Status, headers (lower-case names) and body: the whole answer."""
        try:
            return await asyncio.wait_for(self._response(call), self._timeout(call))
        except asyncio.TimeoutError:
            raise self._timeout_error(call) from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as err:
            if isinstance(err, DsecError):
                raise
            raise UnreachableError(f"the call {call.method} {call.path} broke: {err!r}", "STREAM_BROKEN") from None

    async def run(self, op: Op[T]) -> T:
        """The call and its parsed answer, tried again while a stalled edge refuses it
        (``retry_pause``). The retry window is the call's timeout counted from the first try; a
        new try starts only inside it, and each try has the call's whole timeout (a command's
        HTTP deadline must not shrink below its own ``timeoutMs``)."""
        if not retries(op):
            return await self._run_once(op)
        window = self._timeout(op.call)
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return await self._run_once(op)
            except DsecError as err:
                pause = retry_pause(err, attempt, window - (time.monotonic() - start))
                if pause is None:
                    raise
            await asyncio.sleep(pause)
            attempt += 1

    async def _run_once(self, op: Op[T]) -> T:
        if op.response:
            return op.parse(await self.response(op.call))
        status, body = await self.content(op.call)
        if op.raw:
            return op.parse(body)
        return op.parse(None if status == 204 else decode_json(body))

    async def lines(self, call: Call) -> AsyncIterator[Dict[str, Any]]:
        """The answer as NDJSON objects as they arrive; leaving the loop early closes the
        connection (the server then kills what the call started)."""
        import json

        deadline = time.monotonic() + self._timeout(call)

        def left() -> float:
            rest = deadline - time.monotonic()
            if rest <= 0:
                raise self._timeout_error(call)
            return rest

        try:
            resp = await asyncio.wait_for(self._send(call), left())
        except asyncio.TimeoutError:
            raise self._timeout_error(call) from None
        if resp.status >= 400:
            raise parse_error(resp.status, await self._finish(resp))
        finished = False
        buffered = b""
        chunks = resp.chunks().__aiter__()
        try:
            while True:
                try:
                    chunk = await asyncio.wait_for(chunks.__anext__(), left())
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise self._timeout_error(call) from None
                except (OSError, asyncio.IncompleteReadError) as err:
                    raise UnreachableError(f"the stream of {call.method} {call.path} broke: {err!r}", "STREAM_BROKEN") from None
                complete, buffered = split_lines(buffered, chunk)
                for line in complete:
                    if line.strip():
                        yield json.loads(line)
            if buffered.strip():
                yield json.loads(buffered)
            finished = True
        finally:
            if finished and resp.reusable:
                self._give_back(resp.conn)
            else:
                resp.conn.close()

"""The sync HTTP transport: http.client with one kept-alive connection per thread.

Deadlines are per call: before each blocking step the socket's timeout is set to what is left.
A connection idle longer than ``IDLE_REUSE_LIMIT`` is replaced rather than reused (the server
closes idle sockets after 72 s), and an idempotent call whose reused socket turns out closed is
sent once more on a fresh one.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

from .calls import Call, Op
from .config import ConnectionConfig
from .errors import DsecError, TimeoutError, UnreachableError, error_from_wire

T = TypeVar("T")

#: Seconds a kept-alive connection may sit idle and still be reused.
IDLE_REUSE_LIMIT = 30.0
USER_AGENT = "libdsec-python/0.1"

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, http.client.BadStatusLine)


class Endpoint:
    """Scheme, host, port and path prefix of the server URL."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DsecError(f"the dsec URL must be http(s)://host[:port], got {url!r}", "NOT_CONFIGURED")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1]


#: Pauses (seconds) between tries of a call a stalled edge refused: doubling from the first to the cap.
RETRY_FIRST, RETRY_MAX = 0.25, 2.0
#: The refusals a call is tried again after (with ``details.retryable``): nothing was sent to an edge.
RETRIED_CODES = ("EDGE_UNAVAILABLE", "SANDBOX_MIGRATING")


def retry_pause(err: DsecError, attempt: int, left: float) -> Optional[float]:
    """How long to wait before trying a refused call again, or None to raise. Only a retryable
    EDGE_UNAVAILABLE (the sandbox's edge stopped reporting and nothing was sent to it: a GC
    pause or a network blip on that node) or SANDBOX_MIGRATING (it is moving to another edge,
    and nothing was sent to either) is tried again, and only while a new try can start inside
    the retry window: ``left`` is what remains of the window, and the pause must end before it
    does."""
    if err.code not in RETRIED_CODES or err.details.get("retryable") is not True:
        return None
    pause = min(RETRY_FIRST * (2**attempt), RETRY_MAX)
    return pause if left > pause else None


def retries(op: Op[Any]) -> bool:
    """Whether ``run`` may send ``op`` again after a stalled edge refused it. Never a passthrough
    call (ports.fetch): its answer is a sandbox server's, which dsec does not interpret."""
    return not (op.call.passthrough or op.response)


#: Set on every error answer dsec itself makes, so a proxied server's own 4xx/5xx is told apart.
#: A server in a sandbox could send it too, so it counts only alongside a matching body
#: (``passthrough_error``).
DSEC_ERROR_HEADER = "x-dsec-error"


def passthrough_error(status: int, marker: Optional[str], body: bytes) -> Optional[DsecError]:
    """For a passthrough call (ports.fetch): dsec's own error when dsec made this answer, else None
    (the answer is the sandbox server's own, whatever its status). dsec's is a status >= 400 with
    the ``x-dsec-error`` header (``marker``) naming the same code as the JSON body's
    ``error.code``; a body that does not parse, or names another code, is the server's."""
    if status < 400 or marker is None:
        return None
    try:
        wire = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    err = wire.get("error") if isinstance(wire, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str) or err["code"] != marker.strip():
        return None
    return error_from_wire(status, err)


def parse_error(status: int, body: bytes) -> DsecError:
    try:
        wire = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        wire = None
    return error_from_wire(status, wire.get("error") if isinstance(wire, dict) else None)


def decode_json(body: bytes) -> Any:
    return json.loads(body.decode("utf-8")) if body else None


class SyncTransport:
    def __init__(self, config: ConnectionConfig) -> None:
        self.config = config
        self.endpoint = Endpoint(config.url)
        self._local = threading.local()
        self._ssl = ssl.create_default_context() if self.endpoint.https else None

    # -- connections ----------------------------------------------------------------------------

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        e = self.endpoint
        if e.https:
            return http.client.HTTPSConnection(e.host, e.port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(e.host, e.port, timeout=timeout)

    def _take(self, timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        kept: Optional[Tuple[http.client.HTTPConnection, float]] = getattr(self._local, "conn", None)
        self._local.conn = None
        if kept is not None:
            conn, idle_since = kept
            if time.monotonic() - idle_since < IDLE_REUSE_LIMIT and conn.sock is not None:
                conn.sock.settimeout(timeout)
                return conn, True
            conn.close()
        return self._new(timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        old = getattr(self._local, "conn", None)
        if old is not None:
            old[0].close()
        self._local.conn = (conn, time.monotonic())

    def close(self) -> None:
        """Closes this thread's kept-alive connection."""
        kept = getattr(self._local, "conn", None)
        self._local.conn = None
        if kept is not None:
            kept[0].close()

    # -- calls ----------------------------------------------------------------------------------

    def _deadline(self, call: Call) -> float:
        return time.monotonic() + (call.timeout if call.timeout is not None else self.config.request_timeout)

    def _timeout_error(self, call: Call) -> TimeoutError:
        limit = call.timeout if call.timeout is not None else self.config.request_timeout
        return TimeoutError(f"{call.method} {call.path} did not finish within {limit:g} s", "TIMEOUT")

    def send(self, call: Call, deadline: float) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends one request and returns the response once its status line is in; raises the
        mapped error for a status >= 400 (the connection is then reused or closed), except for a
        passthrough call, whose body decides once read (``passthrough_error``)."""
        body, headers = call.payload()
        headers.update({"Authorization": f"Bearer {self.config.api_key}", "User-Agent": USER_AGENT, "Host": self.endpoint.host_header})
        if body is None and call.method in ("POST", "PUT"):
            headers["Content-Length"] = "0"
        for attempt in (0, 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timeout_error(call)
            conn, reused = self._take(left)
            try:
                conn.request(call.method, self.endpoint.prefix + call.target, body=body, headers=headers)
                if conn.sock is not None:
                    conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                resp = conn.getresponse()
            except socket.timeout:
                conn.close()
                raise self._timeout_error(call) from None
            except _STALE as err:
                conn.close()
                if reused and attempt == 0 and call.idempotent:
                    continue
                raise UnreachableError(f"the connection to dsec at {self.config.url} broke: {err!r}", "UNREACHABLE") from None
            except OSError as err:
                conn.close()
                raise UnreachableError(f"cannot reach dsec at {self.config.url}: {err}", "UNREACHABLE") from None
            if resp.status >= 400 and not call.passthrough:
                data = self._read_all(conn, resp, call, deadline)
                raise parse_error(resp.status, data)
            return conn, resp
        raise AssertionError("unreachable")

    def _read_all(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, call: Call, deadline: float) -> bytes:
        try:
            if conn.sock is not None:
                conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = resp.read()
        except socket.timeout:
            conn.close()
            raise self._timeout_error(call) from None
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise UnreachableError(f"the answer to {call.method} {call.path} broke off: {err!r}", "STREAM_BROKEN") from None
        if resp.will_close:
            conn.close()
        else:
            self._give_back(conn)
        return data

    def content(self, call: Call) -> Tuple[int, bytes]:
        status, _, data = self.response(call)
        return status, data

    def response(self, call: Call) -> Tuple[int, Dict[str, str], bytes]:
        """Status, headers (lower-case names) and body: the whole answer."""
        deadline = self._deadline(call)
        conn, resp = self.send(call, deadline)
        headers = {k.lower(): v for k, v in resp.getheaders()}
        data = self._read_all(conn, resp, call, deadline)
        if call.passthrough:
            err = passthrough_error(resp.status, headers.get(DSEC_ERROR_HEADER), data)
            if err is not None:
                raise err
        return resp.status, headers, data

    def run(self, op: Op[T]) -> T:
        """The call and its parsed answer, tried again while a stalled edge refuses it
        (``retry_pause``). The retry window is the call's timeout counted from the first try; a
        new try starts only inside it, and each try has the call's whole timeout (a command's
        HTTP deadline must not shrink below its own ``timeoutMs``)."""
        if not retries(op):
            return self._run_once(op)
        window = op.call.timeout if op.call.timeout is not None else self.config.request_timeout
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return self._run_once(op)
            except DsecError as err:
                pause = retry_pause(err, attempt, window - (time.monotonic() - start))
                if pause is None:
                    raise
            time.sleep(pause)
            attempt += 1

    def _run_once(self, op: Op[T]) -> T:
        if op.response:
            return op.parse(self.response(op.call))
        status, body = self.content(op.call)
        if op.raw:
            return op.parse(body)
        return op.parse(None if status == 204 else decode_json(body))

    def lines(self, call: Call) -> Iterator[Dict[str, Any]]:
        """The answer as NDJSON objects, as they arrive. Closing the iterator early closes the
        connection (the server then kills what the call started)."""
        deadline = self._deadline(call)
        conn, resp = self.send(call, deadline)
        buffered = b""
        finished = False
        try:
            while True:
                if conn.sock is not None:
                    conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    chunk = resp.read1(65536)
                except socket.timeout:
                    raise self._timeout_error(call) from None
                except (OSError, http.client.HTTPException) as err:
                    raise UnreachableError(f"the stream of {call.method} {call.path} broke: {err!r}", "STREAM_BROKEN") from None
                if not chunk:
                    break
                complete, buffered = split_lines(buffered, chunk)
                for line in complete:
                    if line.strip():
                        yield json.loads(line)
            if buffered.strip():
                yield json.loads(buffered)
            # An empty answer comes with Content-Length: 0, and read1 does not mark such a
            # response closed (Python 3.11); a read() does, so the connection can serve the next call.
            resp.read()
            finished = True
        finally:
            if finished and not resp.will_close:
                self._give_back(conn)
            else:
                conn.close()


def split_lines(buffered: bytes, chunk: bytes) -> Tuple[List[bytes], bytes]:
    """Appends ``chunk`` and returns the complete lines and the rest."""
    *complete, rest = (buffered + chunk).split(b"\n")
    return complete, rest

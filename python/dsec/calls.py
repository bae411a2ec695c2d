"""Every API call as data: method, path, query, body, deadline and how to read the answer.

The sync and asyncio clients both build their requests here and differ only in how they send
them (``transport.py`` / ``aio_transport.py``), so the two surfaces cannot drift apart.
Times are seconds on the Python side and milliseconds on the wire.
"""

from __future__ import annotations

import base64
import json as jsonlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import quote, unquote, urlencode

from . import models as m
from .errors import DsecError, InvalidRequestError, error_from_wire

T = TypeVar("T")

#: The server's default command timeout (seconds) when a call gives none.
DEFAULT_COMMAND_TIMEOUT = 60.0
#: What the HTTP call waits beyond a command's own timeout (the server answers after killing it).
COMMAND_MARGIN = 10.0
#: Deadline of calls that pack a layer (snapshot, fork, replay) unless the caller gives one.
SNAPSHOT_TIMEOUT = 600.0

NDJSON = "application/x-ndjson"

Cmd = Union[str, Sequence[str]]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: Sequence[Tuple[str, str]] = ()
    json: Any = None
    has_json: bool = False
    body: Optional[bytes] = None
    content_type: Optional[str] = None
    accept: Optional[str] = None
    #: Deadline of the whole call in seconds; None: the connection's default.
    timeout: Optional[float] = None
    #: The answer is a sandbox server's own (ports.fetch): a status >= 400 raises only when dsec
    #: itself made it (the x-dsec-error header naming the body's error.code), not when the server
    #: in the sandbox did; such a call is never retried.
    passthrough: bool = False
    #: Headers of the caller's own, sent as they are (ports.fetch).
    headers: Tuple[Tuple[str, str], ...] = ()

    @property
    def target(self) -> str:
        return self.path + ("?" + urlencode(list(self.query)) if self.query else "")

    @property
    def idempotent(self) -> bool:
        return self.method in ("GET", "HEAD", "PUT", "DELETE")

    def payload(self) -> Tuple[Optional[bytes], Dict[str, str]]:
        """The body bytes and the headers describing them."""
        headers: Dict[str, str] = dict(self.headers)
        if self.accept:
            headers["Accept"] = self.accept
        if self.has_json:
            headers["Content-Type"] = "application/json"
            return jsonlib.dumps(self.json, separators=(",", ":")).encode("utf-8"), headers
        if self.body is not None:
            headers["Content-Type"] = self.content_type or "application/octet-stream"
            return self.body, headers
        return None, headers


@dataclass(frozen=True)
class Op(Generic[T]):
    """A call and what its answer becomes: parsed JSON (``parse``), raw bytes (``raw``) or the whole answer (``response``)."""

    call: Call
    parse: Callable[[Any], T]
    raw: bool = False
    #: ``parse`` takes ``(status, headers, body)``: the whole answer (ports.fetch).
    response: bool = False


def _invalid(field: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, "INVALID_REQUEST", None, {"field": field})


def _ms(seconds: Optional[float], field: str = "timeout") -> Optional[int]:
    """Seconds → wire milliseconds; a caller's string or bool is refused here, where the message
    can name the Python argument."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise _invalid(field, f"{field} must be a number of seconds, got {type(seconds).__name__} {seconds!r}")
    return int(round(seconds * 1000))


def _query(**kv: Any) -> List[Tuple[str, str]]:
    out: List[Tuple[str, str]] = []
    for k, v in kv.items():
        if v is None or v is False:
            continue
        for one in v if isinstance(v, (list, tuple)) else [v]:
            out.append((k, "true" if one is True else str(one)))
    return out


def _clean(d: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _none(_: Any) -> None:
    return None


def _seg(s: str) -> str:
    return quote(s, safe="")


def _sb(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{_seg(sandbox_id)}{suffix}"


def json_call(method: str, path: str, body: Any = None, *, has_json: bool = True, **kw: Any) -> Call:
    return Call(method, path, json=body, has_json=has_json and body is not None, **kw)


# --- sandboxes ---------------------------------------------------------------------------------


def network_body(network: Union[None, str, Mapping[str, Any]], allow: Optional[Sequence[str]] = None) -> Optional[Dict[str, Any]]:
    """``"none"`` / ``{"mode": "allow", "allow": [...]}`` → the wire policy."""
    if network is None:
        return None
    if isinstance(network, str):
        return _clean({"mode": network, "allow": list(allow) if allow is not None else None})
    return dict(network)


def create_body(
    *,
    image: str = "busybox",
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
) -> Dict[str, Any]:
    """The wire spec of one sandbox (also the ``spec`` of a batch). ``volumes`` items are
    ``{"name", "path", "read_only"}`` (``readOnly`` is taken too)."""
    resources = _clean({"cpu": cpu, "memoryMiB": memory_mib, "pids": pids, "diskMiB": disk_mib})
    return _clean(
        {
            "backend": backend,
            "image": image,
            "resources": resources or None,
            "layers": list(layers) if layers is not None else None,
            "env": dict(env) if env is not None else None,
            "labels": dict(labels) if labels is not None else None,
            "network": network_body(network),
            "ttlSeconds": ttl_seconds,
            "idleTimeoutSeconds": idle_timeout_seconds,
            "onExpiry": on_expiry,
            "pool": pool,
            "volumes": [volume_mount(v) for v in volumes] if volumes is not None else None,
            "placement": dict(placement) if placement is not None else None,
        }
    )


def volume_mount(v: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"name", "path", "read_only"}`` → the wire's ``{"name", "path", "readOnly"}``."""
    if not isinstance(v, Mapping):
        raise _invalid("volumes", f"each of volumes must be a dict with name and path, got {type(v).__name__}")
    out = {("readOnly" if k == "read_only" else k): val for k, val in v.items()}
    return out


def create(spec: Dict[str, Any], timeout: Optional[float]) -> Op[m.SandboxInfo]:
    return Op(json_call("POST", "/v1/sandboxes", spec, timeout=timeout), m.SandboxInfo.from_wire)


def get(sandbox_id: str, timeout: Optional[float]) -> Op[m.SandboxInfo]:
    return Op(Call("GET", _sb(sandbox_id), timeout=timeout), m.SandboxInfo.from_wire)


def list_sandboxes(labels: Optional[Mapping[str, str]], status: Optional[str], timeout: Optional[float]) -> Op[List[m.SandboxInfo]]:
    q = _query(label=[f"{k}={v}" for k, v in (labels or {}).items()] or None, status=status)
    return Op(Call("GET", "/v1/sandboxes", query=q, timeout=timeout), lambda d: [m.SandboxInfo.from_wire(s) for s in d["sandboxes"]])


def kill(sandbox_id: str, timeout: Optional[float]) -> Op[None]:
    return Op(Call("DELETE", _sb(sandbox_id), timeout=timeout), _none)


def pause(sandbox_id: str, timeout: Optional[float]) -> Op[m.SandboxInfo]:
    return Op(Call("POST", _sb(sandbox_id, "/pause"), timeout=timeout), m.SandboxInfo.from_wire)


def resume(sandbox_id: str, timeout: Optional[float]) -> Op[m.SandboxInfo]:
    return Op(Call("POST", _sb(sandbox_id, "/resume"), timeout=timeout), m.SandboxInfo.from_wire)


def snapshot(sandbox_id: str, name: Optional[str], scrub: Optional[Sequence[str]], timeout: Optional[float]) -> Op[m.SnapshotResult]:
    body = _clean({"name": name, "scrub": list(scrub) if scrub is not None else None})
    return Op(json_call("POST", _sb(sandbox_id, "/snapshot"), body, timeout=timeout or SNAPSHOT_TIMEOUT), m.SnapshotResult.from_wire)


def migrate(sandbox_id: str, edge: Optional[str], pool: Optional[str], restart_processes: bool, timeout: Optional[float]) -> Op[m.MigrateResult]:
    body = _clean({"edge": edge, "pool": pool, "restartProcesses": True if restart_processes else None})
    return Op(json_call("POST", _sb(sandbox_id, "/migrate"), body, timeout=timeout or SNAPSHOT_TIMEOUT), m.MigrateResult.from_wire)


def _object(d: Any) -> Dict[str, Any]:
    return d if isinstance(d, dict) else {}


def fork(sandbox_id: str, count: int, labels: Optional[Mapping[str, str]], timeout: Optional[float]) -> Op[Dict[str, Any]]:
    body = _clean({"count": count, "labels": dict(labels) if labels is not None else None})
    return Op(json_call("POST", _sb(sandbox_id, "/fork"), body, timeout=timeout or SNAPSHOT_TIMEOUT), _object)


def set_network(sandbox_id: str, mode: str, allow: Optional[Sequence[str]], timeout: Optional[float]) -> Op[m.NetworkState]:
    return Op(json_call("PUT", _sb(sandbox_id, "/network"), network_body(mode, allow), timeout=timeout), m.NetworkState.from_wire)


def network(sandbox_id: str, timeout: Optional[float]) -> Op[m.NetworkState]:
    return Op(Call("GET", _sb(sandbox_id, "/network"), timeout=timeout), m.NetworkState.from_wire)


def trajectory(sandbox_id: str, after_seq: Optional[int], limit: Optional[int], timeout: Optional[float], lineage: bool = False) -> Op[m.Trajectory]:
    q = _query(afterSeq=after_seq, limit=limit, lineage=True if lineage else None)
    return Op(Call("GET", _sb(sandbox_id, "/trajectory"), query=q, timeout=timeout), m.Trajectory.from_wire)


#: Deadline of a whole bulk trajectory stream unless the caller gives one: a big run takes a while to read.
TRAJECTORIES_TIMEOUT = 24 * 3600.0


def trajectories(labels: Optional[Mapping[str, str]], batch: Optional[str], project: Optional[str], timeout: Optional[float]) -> Call:
    """Every step of the sandboxes whose labels match all of ``labels`` and/or of ``batch`` (at
    least one), as NDJSON: one ``{sandboxId, seq, kind, ...}`` line per step."""
    if labels is not None and not isinstance(labels, Mapping):
        raise _invalid("labels", f"labels must be a mapping of label to value, got {type(labels).__name__} {labels!r}")
    if not labels and batch is None:
        raise _invalid("labels", "trajectories needs labels (all must match) and/or batch; one sandbox: trajectory_by_id(sandbox_id)")
    q = _query(label=[f"{k}={v}" for k, v in (labels or {}).items()] or None, batch=batch, project=project)
    return Call("GET", "/v1/trajectories", query=q, accept=NDJSON, timeout=timeout if timeout is not None else TRAJECTORIES_TIMEOUT)


def replay(sandbox_id: str, timeout: Optional[float]) -> Op[Dict[str, Any]]:
    return Op(Call("POST", _sb(sandbox_id, "/replay"), timeout=timeout or SNAPSHOT_TIMEOUT), _object)


def nodes(timeout: Optional[float]) -> Op[List[m.NodeInfo]]:
    return Op(Call("GET", "/v1/nodes", timeout=timeout), lambda d: [m.NodeInfo.from_wire(n) for n in d["nodes"]])


def bulk(action: str, labels: Mapping[str, str], timeout: Optional[float]) -> Op[m.BulkResult]:
    """Kill, pause or resume every sandbox whose labels match all of ``labels`` (at least one)."""
    if not isinstance(labels, Mapping) or not labels:
        raise _invalid("labels", f"{action}_all needs labels with at least one pair (a bulk call never means all sandboxes), got {labels!r}")
    body = {"labels": dict(labels)}
    return Op(json_call("POST", f"/v1/sandboxes/{action}", body, timeout=timeout or BULK_TIMEOUT), m.BulkResult.from_wire)


#: Deadline of a bulk call unless the caller gives one: it works through many sandboxes.
BULK_TIMEOUT = 600.0


# --- volumes -----------------------------------------------------------------------------------


def create_volume(name: str, labels: Optional[Mapping[str, str]], edge: Optional[str], timeout: Optional[float]) -> Op[m.VolumeInfo]:
    _name(name)
    body = _clean({"name": name, "labels": dict(labels) if labels is not None else None, "edge": edge})
    return Op(json_call("POST", "/v1/volumes", body, timeout=timeout), m.VolumeInfo.from_wire)


def list_volumes(timeout: Optional[float]) -> Op[List[m.VolumeInfo]]:
    return Op(Call("GET", "/v1/volumes", timeout=timeout), lambda d: [m.VolumeInfo.from_wire(v) for v in d["volumes"]])


def get_volume(name: str, timeout: Optional[float]) -> Op[m.VolumeInfo]:
    return Op(Call("GET", f"/v1/volumes/{_seg(_name(name))}", timeout=timeout), m.VolumeInfo.from_wire)


def delete_volume(name: str, timeout: Optional[float]) -> Op[None]:
    return Op(Call("DELETE", f"/v1/volumes/{_seg(_name(name))}", timeout=timeout), _none)


def _name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not name:
        raise _invalid(field, f"{field} must be a non-empty str, got {type(name).__name__} {name!r}")
    return name


# --- images ------------------------------------------------------------------------------------

#: Deadline of builds, pulls and pushes unless the caller gives one (a Debian build takes minutes).
IMAGE_TIMEOUT = 900.0


def list_images(timeout: Optional[float]) -> Op[List[m.ImageInfo]]:
    return Op(Call("GET", "/v1/images", timeout=timeout), lambda d: [m.ImageInfo.from_wire(i) for i in d["images"]])


def get_image(ref: str, timeout: Optional[float]) -> Op[m.ImageInfo]:
    return Op(Call("GET", f"/v1/images/{_seg(_name(ref, 'ref'))}", timeout=timeout), m.ImageInfo.from_wire)


def delete_image(ref: str, timeout: Optional[float]) -> Op[None]:
    return Op(Call("DELETE", f"/v1/images/{_seg(_name(ref, 'ref'))}", timeout=timeout), _none)


def build_image(builder: str, name: Optional[str], packages: Optional[Sequence[str]], timeout: Optional[float]) -> Op[m.ImageInfo]:
    body = _clean({"builder": builder, "name": name, "packages": list(packages) if packages is not None else None})
    return Op(json_call("POST", "/v1/images", body, timeout=timeout or IMAGE_TIMEOUT), m.ImageInfo.from_wire)


def pull_image(ref: str, name: Optional[str], timeout: Optional[float]) -> Op[m.PulledImage]:
    body = _clean({"ref": _name(ref, "ref"), "name": name})
    return Op(json_call("POST", "/v1/images/pull", body, timeout=timeout or IMAGE_TIMEOUT), m.PulledImage.from_wire)


def push_image(image: str, ref: str, timeout: Optional[float]) -> Op[m.PushedImage]:
    body = {"image": _name(image, "image"), "ref": _name(ref, "ref")}
    return Op(json_call("POST", "/v1/images/push", body, timeout=timeout or IMAGE_TIMEOUT), m.PushedImage.from_wire)


def gc_images(timeout: Optional[float]) -> Op[m.GcResult]:
    return Op(Call("POST", "/v1/images/gc", timeout=timeout or SNAPSHOT_TIMEOUT), m.GcResult.from_wire)


# --- pools -------------------------------------------------------------------------------------


def create_pool(name: str, size: int, spec: Dict[str, Any], timeout: Optional[float]) -> Op[m.PoolInfo]:
    # A pool fixes the create spec's sandbox fields; labels, TTLs and volumes belong to each claim.
    body = {"name": _name(name), "size": size, **{k: v for k, v in spec.items() if k in POOL_SPEC_FIELDS}}
    extra = sorted(k for k in spec if k not in POOL_SPEC_FIELDS)
    if extra:
        raise _invalid(extra[0], f"a pool's spec takes {', '.join(sorted(POOL_SPEC_FIELDS))}; {', '.join(extra)} belong to each create that claims from it")
    return Op(json_call("POST", "/v1/pools", body, timeout=timeout), m.PoolInfo.from_wire)


#: The fields of a create spec a pool fixes (schema/pool.ts).
POOL_SPEC_FIELDS = frozenset({"backend", "image", "resources", "layers", "env", "network", "placement"})


def list_pools(timeout: Optional[float]) -> Op[List[m.PoolInfo]]:
    return Op(Call("GET", "/v1/pools", timeout=timeout), lambda d: [m.PoolInfo.from_wire(p) for p in d["pools"]])


def get_pool(name: str, timeout: Optional[float]) -> Op[m.PoolInfo]:
    return Op(Call("GET", f"/v1/pools/{_seg(_name(name))}", timeout=timeout), m.PoolInfo.from_wire)


def delete_pool(name: str, timeout: Optional[float]) -> Op[None]:
    return Op(Call("DELETE", f"/v1/pools/{_seg(_name(name))}", timeout=timeout), _none)


# --- ports -------------------------------------------------------------------------------------


def port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise _invalid("port", f"{where}: port must be an int from 1 to 65535, got {value!r}")
    return value


#: An HTTP method: a token; letters are all any server needs.
_METHOD = re.compile(r"[A-Za-z]{1,20}")
#: An HTTP header name: a token (RFC 9110 section 5.6.2).
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Headers that frame the request: the transport sets them from ``body``; the caller's own would
#: make the body's end ambiguous (a request smuggled inside it).
_FRAMING_HEADERS = ("content-length", "transfer-encoding")


def port_path(sandbox_id: str, number: int, path: str, where: str) -> str:
    """The proxy path of ``path`` on ``number``. ``path`` is sent as given (with its query), so
    what could change the request or leave the port's URL is refused: control characters,
    whitespace, a fragment ('#') and '..' segments."""
    if not isinstance(path, str):
        raise _invalid("path", f"{where}: path must be a str, got {type(path).__name__}")
    bad = next((c for c in path if ord(c) < 0x20 or ord(c) == 0x7F or c.isspace()), None)
    if bad is not None:
        raise _invalid("path", f"{where}: path must not contain control characters or whitespace, got {bad!r} in {path!r}; percent-encode it (urllib.parse.quote)")
    if "#" in path:
        raise _invalid("path", f"{where}: path must not contain '#' (a fragment is never sent to a server), got {path!r}; percent-encode it as %23 if it is part of the path")
    if any(unquote(seg) == ".." for seg in path.split("?", 1)[0].split("/")):
        raise _invalid("path", f"{where}: path must not contain '..' segments (they would leave the port's URL), got {path!r}; give the path the server should see, e.g. '/a/b'")
    return _sb(sandbox_id, f"/ports/{port(number, where)}{path if path.startswith('/') else '/' + path}")


def _method(method: Any) -> str:
    if not isinstance(method, str) or not _METHOD.fullmatch(method):
        raise _invalid("method", f"ports.fetch: method must be an HTTP method of 1 to 20 letters (e.g. 'GET', 'POST'), got {method!r}")
    return method.upper()


def _headers(headers: Optional[Mapping[str, str]]) -> Dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise _invalid("headers", f"ports.fetch: headers must be a dict of str to str, got {type(headers).__name__}")
    for k, v in headers.items():
        if not isinstance(k, str) or not _TOKEN.fullmatch(k):
            raise _invalid("headers", f"ports.fetch: header name {k!r} is not an HTTP token; use letters, digits and !#$%&'*+-.^_`|~ only")
        if not isinstance(v, str):
            raise _invalid("headers", f"ports.fetch: the value of header {k} must be a str, got {type(v).__name__}")
        if any(c in v for c in "\r\n\0"):
            raise _invalid("headers", f"ports.fetch: the value of header {k} must not contain CR, LF or NUL (they would end the header), got {v!r}")
        if k.lower() in _FRAMING_HEADERS:
            raise _invalid("headers", f"ports.fetch: do not set {k}: the client frames the request from body itself")
    return dict(headers)


def port_link(sandbox_id: str, number: int, ttl_seconds: Optional[int], timeout: Optional[float]) -> Op[m.PortLink]:
    body = _clean({"port": port(number, "ports.link"), "ttlSeconds": ttl_seconds})
    return Op(json_call("POST", _sb(sandbox_id, "/port-links"), body, timeout=timeout), m.PortLink.from_wire)


def port_wait(sandbox_id: str, number: int, wait: float, timeout: Optional[float]) -> Op[m.PortWait]:
    body = {"port": port(number, "ports.wait"), "timeoutMs": _ms(wait, "wait")}
    return Op(json_call("POST", _sb(sandbox_id, "/port-waits"), body, timeout=timeout if timeout is not None else wait + COMMAND_MARGIN), m.PortWait.from_wire)


def port_fetch(
    sandbox_id: str, number: int, path: str, method: str, body: Union[None, str, bytes], headers: Optional[Mapping[str, str]], timeout: Optional[float]
) -> Op[m.PortResponse]:
    """A request to the server on ``number``: its answer comes back whatever its status; only the
    proxy's own errors (x-dsec-error with the same code in the body: nothing listens, a broken
    answer) raise. The method, path and headers are checked first, so none can split the request."""
    verb, target, given = _method(method), port_path(sandbox_id, number, path, "ports.fetch"), _headers(headers)
    content_type = next((v for k, v in given.items() if k.lower() == "content-type"), None)
    call = Call(
        verb, target, body=as_bytes(body, "body") if body is not None else None, content_type=content_type, timeout=timeout, passthrough=True,
        headers=tuple((k, v) for k, v in given.items() if k.lower() not in ("content-type", "authorization", "host")),
    )  # fmt: skip
    return Op(call, lambda r: m.PortResponse(status=r[0], headers=r[1], body=r[2]), response=True)


# --- batches -----------------------------------------------------------------------------------

#: Deadline of one batch progress stream (it stays open until the batch ends).
BATCH_STREAM_TIMEOUT = 24 * 3600.0
#: Label the server puts on every sandbox of a batch (value: the batch id).
BATCH_LABEL = "dsec.batch"


def create_batch(count: int, spec: Dict[str, Any], concurrency: Optional[int], timeout: Optional[float]) -> Op[m.BatchInfo]:
    body = _clean({"count": count, "spec": spec, "concurrency": concurrency})
    return Op(json_call("POST", "/v1/batches", body, timeout=timeout), m.BatchInfo.from_wire)


def batch_info(batch_id: str, timeout: Optional[float]) -> Op[m.BatchInfo]:
    return Op(Call("GET", f"/v1/batches/{_seg(batch_id)}", timeout=timeout), m.BatchInfo.from_wire)


def cancel_batch(batch_id: str, timeout: Optional[float]) -> Op[m.BatchInfo]:
    return Op(Call("DELETE", f"/v1/batches/{_seg(batch_id)}", timeout=timeout), m.BatchInfo.from_wire)


def batch_events(batch_id: str, after: int) -> Call:
    """The progress stream from the event after ``after`` on, open until the batch ends."""
    return Call("GET", f"/v1/batches/{_seg(batch_id)}/events", query=_query(after=after), accept=NDJSON, timeout=BATCH_STREAM_TIMEOUT)


def batch_failure(batch_id: str, event: Dict[str, Any]) -> "DsecError":
    """A failed item as the error its code maps to, with its index (and sandbox id if it had one)."""
    details = _clean({"batchId": batch_id, "index": event.get("index"), "sandboxId": event.get("sandboxId")})
    return error_from_wire(None, {"code": event.get("code") or "SANDBOX_CREATE_FAILED", "message": event.get("reason") or "unknown", "details": details})


class BatchTally:
    """The counts of a batch's progress, as its events arrive."""

    def __init__(self, batch_id: str, total: int) -> None:
        self.batch_id, self.total = batch_id, total
        self.placed = self.running = self.failed = 0

    def add(self, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "placed":
            self.placed += 1
        elif kind == "running":
            self.running += 1
        elif kind == "failed":
            self.failed += 1


# --- commands ----------------------------------------------------------------------------------


def _cmd(cmd: Cmd) -> Union[str, List[str]]:
    return cmd if isinstance(cmd, str) else list(cmd)


def _stdin(stdin: Union[None, str, bytes]) -> Dict[str, Any]:
    if stdin is None:
        return {}
    if isinstance(stdin, (bytes, bytearray, memoryview)):
        return {"stdin": base64.b64encode(bytes(stdin)).decode("ascii"), "stdinEncoding": "base64"}
    return {"stdin": stdin}


def command_deadline(timeout: Optional[float], request_timeout: Optional[float]) -> float:
    return request_timeout if request_timeout is not None else (timeout if timeout is not None else DEFAULT_COMMAND_TIMEOUT) + COMMAND_MARGIN


def exec_body(
    cmd: Cmd,
    *,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    writable_paths: Optional[Sequence[str]] = None,
    stdin: Union[None, str, bytes] = None,
    timeout: Optional[float] = None,
    max_output_bytes: Optional[int] = None,
    binary: bool = False,
    uncapped: bool = False,
) -> Dict[str, Any]:
    body = _clean(
        {
            "cmd": _cmd(cmd),
            "cwd": cwd,
            "env": dict(env) if env is not None else None,
            "writablePaths": list(writable_paths) if writable_paths is not None else None,
            "timeoutMs": _ms(timeout),
            "maxOutputBytes": max_output_bytes,
            "encoding": "base64" if binary else None,
            "uncapped": True if uncapped else None,
        }
    )
    body.update(_stdin(stdin))
    return body


def exec_(sandbox_id: str, body: Dict[str, Any], deadline: float) -> Op[m.ExecResult]:
    return Op(json_call("POST", _sb(sandbox_id, "/exec"), body, timeout=deadline), m.ExecResult.from_wire)


def exec_stream(sandbox_id: str, body: Dict[str, Any], deadline: float) -> Call:
    return json_call("POST", _sb(sandbox_id, "/exec"), body, timeout=deadline, accept=NDJSON)


def stream_event(line: Dict[str, Any]) -> Optional[m.StreamEvent]:
    """One NDJSON line of an exec stream → an event (None for lines that carry none, e.g. start)."""
    kind = line.get("type")
    if kind in ("stdout", "stderr"):
        return m.OutputEvent(stream=kind, data=base64.b64decode(line.get("data") or ""))
    if kind == "exit":
        return m.ExitEvent.from_wire(line)
    return None


def start_process(
    sandbox_id: str,
    cmd: Cmd,
    *,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    writable_paths: Optional[Sequence[str]],
    stdin: bool,
    timeout: Optional[float],
    max_output_bytes: Optional[int],
    request_timeout: Optional[float],
) -> Op[m.ProcessInfo]:
    body = _clean(
        {
            "cmd": _cmd(cmd),
            "cwd": cwd,
            "env": dict(env) if env is not None else None,
            "writablePaths": list(writable_paths) if writable_paths is not None else None,
            "stdin": True if stdin else None,
            "timeoutMs": _ms(timeout),
            "maxOutputBytes": max_output_bytes,
        }
    )
    return Op(json_call("POST", _sb(sandbox_id, "/processes"), body, timeout=request_timeout), m.ProcessInfo.from_wire)


def _proc(sandbox_id: str, process_id: str, suffix: str = "") -> str:
    return _sb(sandbox_id, f"/processes/{_seg(process_id)}{suffix}")


def list_processes(sandbox_id: str, timeout: Optional[float]) -> Op[List[m.ProcessInfo]]:
    return Op(Call("GET", _sb(sandbox_id, "/processes"), timeout=timeout), lambda d: [m.ProcessInfo.from_wire(p) for p in d["processes"]])


def process_output(sandbox_id: str, process_id: str, stdout_offset: int, stderr_offset: int, timeout: Optional[float]) -> Op[m.ProcessOutput]:
    q = _query(stdoutOffset=stdout_offset or None, stderrOffset=stderr_offset or None, encoding="base64")
    return Op(Call("GET", _proc(sandbox_id, process_id), query=q, timeout=timeout), m.ProcessOutput.from_wire)


def wait_process(sandbox_id: str, process_id: str, wait: float, timeout: Optional[float]) -> Op[m.ProcessInfo]:
    call = json_call("POST", _proc(sandbox_id, process_id, "/wait"), {"timeoutMs": _ms(wait, "wait")}, timeout=timeout if timeout is not None else wait + COMMAND_MARGIN)
    return Op(call, m.ProcessInfo.from_wire)


def signal_process(sandbox_id: str, process_id: str, signal: str, timeout: Optional[float]) -> Op[m.ProcessInfo]:
    return Op(json_call("POST", _proc(sandbox_id, process_id, "/signal"), {"signal": signal}, timeout=timeout), m.ProcessInfo.from_wire)


def kill_process(sandbox_id: str, process_id: str, timeout: Optional[float]) -> Op[m.ProcessInfo]:
    return Op(Call("DELETE", _proc(sandbox_id, process_id), timeout=timeout), m.ProcessInfo.from_wire)


def write_stdin(sandbox_id: str, process_id: str, data: Union[str, bytes], eof: bool, timeout: Optional[float]) -> Op[None]:
    raw = as_bytes(data, "data")
    return Op(Call("POST", _proc(sandbox_id, process_id, "/stdin"), query=_query(eof=eof), body=raw, timeout=timeout), _none)


# --- sessions ----------------------------------------------------------------------------------


def open_session(
    sandbox_id: str, shell: Optional[str], cwd: Optional[str], env: Optional[Mapping[str, str]], writable_paths: Optional[Sequence[str]], timeout: Optional[float]
) -> Op[m.SessionInfo]:
    body = _clean({"shell": shell, "cwd": cwd, "env": dict(env) if env is not None else None, "writablePaths": list(writable_paths) if writable_paths is not None else None})
    return Op(json_call("POST", _sb(sandbox_id, "/sessions"), body, timeout=timeout), m.SessionInfo.from_wire)


def list_sessions(sandbox_id: str, timeout: Optional[float]) -> Op[List[m.SessionInfo]]:
    return Op(Call("GET", _sb(sandbox_id, "/sessions"), timeout=timeout), lambda d: [m.SessionInfo.from_wire(s) for s in d["sessions"]])


def session_exec(
    sandbox_id: str, session_id: str, cmd: str, timeout: Optional[float], max_output_bytes: Optional[int], binary: bool, request_timeout: Optional[float]
) -> Op[m.ExecResult]:
    body = _clean({"cmd": cmd, "timeoutMs": _ms(timeout), "maxOutputBytes": max_output_bytes, "encoding": "base64" if binary else None})
    call = json_call("POST", _sb(sandbox_id, f"/sessions/{_seg(session_id)}/exec"), body, timeout=command_deadline(timeout, request_timeout))
    return Op(call, m.ExecResult.from_wire)


def close_session(sandbox_id: str, session_id: str, timeout: Optional[float]) -> Op[None]:
    return Op(Call("DELETE", _sb(sandbox_id, f"/sessions/{_seg(session_id)}"), timeout=timeout), _none)


# --- files -------------------------------------------------------------------------------------


def _raw(b: Any) -> bytes:
    return b  # type: ignore[no-any-return]


def _path(path: Any, field: str = "path") -> str:
    if not isinstance(path, str) or not path:
        raise _invalid(field, f"{field} must be a non-empty str (a path in the sandbox), got {type(path).__name__} {path!r}")
    return path


def read_file(sandbox_id: str, path: str, timeout: Optional[float]) -> Op[bytes]:
    _path(path)
    return Op(Call("GET", _sb(sandbox_id, "/files"), query=_query(path=path), timeout=timeout), _raw, raw=True)


def as_bytes(data: Any, field: str) -> bytes:
    """``str`` as UTF-8, bytes-like as is; anything else is the caller's mistake, said plainly."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise _invalid(field, f"{field} must be str or bytes, got {type(data).__name__}")


def write_file(sandbox_id: str, path: str, data: Union[str, bytes], mode: Optional[int], timeout: Optional[float]) -> Op[m.WriteResult]:
    _path(path)
    raw = as_bytes(data, "data")
    q = _query(path=path, mode=format(mode, "o") if mode is not None else None)
    return Op(Call("PUT", _sb(sandbox_id, "/files"), query=q, body=raw, timeout=timeout), m.WriteResult.from_wire)


def stat(sandbox_id: str, path: str, timeout: Optional[float]) -> Op[m.FileStat]:
    _path(path)
    return Op(Call("GET", _sb(sandbox_id, "/files/stat"), query=_query(path=path), timeout=timeout), m.FileStat.from_wire)


def list_dir(sandbox_id: str, path: str, timeout: Optional[float]) -> Op[m.DirListing]:
    _path(path)
    return Op(Call("GET", _sb(sandbox_id, "/files/list"), query=_query(path=path), timeout=timeout), m.DirListing.from_wire)


def mkdir(sandbox_id: str, path: str, parents: bool, timeout: Optional[float]) -> Op[None]:
    _path(path)
    return Op(json_call("POST", _sb(sandbox_id, "/files/mkdir"), {"path": path, "parents": parents}, timeout=timeout), _none)


def remove(sandbox_id: str, path: str, recursive: bool, timeout: Optional[float]) -> Op[None]:
    _path(path)
    return Op(Call("DELETE", _sb(sandbox_id, "/files"), query=_query(path=path, recursive=recursive), timeout=timeout), _none)


def rename(sandbox_id: str, src: str, dst: str, timeout: Optional[float]) -> Op[None]:
    _path(src, "src")
    _path(dst, "dst")
    return Op(json_call("POST", _sb(sandbox_id, "/files/rename"), {"from": src, "to": dst}, timeout=timeout), _none)


def upload_tar(sandbox_id: str, directory: str, archive: bytes, timeout: Optional[float]) -> Op[m.WriteResult]:
    _path(directory, "directory")
    call = Call("PUT", _sb(sandbox_id, "/files/tar"), query=_query(path=directory), body=as_bytes(archive, "archive"), content_type="application/x-tar", timeout=timeout)
    return Op(call, m.WriteResult.from_wire)


def download_tar(sandbox_id: str, path: str, timeout: Optional[float]) -> Op[bytes]:
    _path(path)
    return Op(Call("GET", _sb(sandbox_id, "/files/tar"), query=_query(path=path), timeout=timeout), _raw, raw=True)


# --- terminals ---------------------------------------------------------------------------------


def pty_target(sandbox_id: str, cmd: Optional[Sequence[str]], cols: Optional[int], rows: Optional[int], cwd: Optional[str]) -> str:
    q = _query(cmd=list(cmd) if cmd else None, cols=cols, rows=rows, cwd=cwd)
    return _sb(sandbox_id, "/pty") + ("?" + urlencode(q) if q else "")


__all__ = ["Call", "Op", "field"]

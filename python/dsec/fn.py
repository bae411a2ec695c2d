"""Function calls: short stateless programs (python, node, bash) in warm workers on the server.

    import dsec
    r = dsec.fn.run("python", "print(sum(map(int, input().split())))", stdin="1 2 3")
    rs = dsec.fn.map([{"runtime": "python", "code": code, "stdin": case} for case in cases], concurrency=32)

Each call runs in a fresh process and scratch dir, with nothing kept between calls and no network
unless asked (``network=True``). A non-zero exit is a result (``exit_code``), not an error. Times
are seconds here and milliseconds on the wire. See docs/FNCALL.md.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from .calls import NDJSON, Call, Op, _invalid, _ms
from .errors import DsecError, error_from_wire
from .sandbox import transport_for

__all__ = ["FnResult", "FnOutcome", "run", "map", "map_iter"]

#: What the HTTP call waits beyond a call's own timeout: a cold worker start.
COLD_START_MARGIN = 60.0
#: Deadline of a batch's stream unless the caller gives one.
BATCH_TIMEOUT = 24 * 3600.0

Bytes = Union[str, bytes]


@dataclass(frozen=True)
class FnResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool
    stdout_bytes: int
    stderr_bytes: int
    timed_out: bool
    oom_killed: bool
    #: The call in its worker, seconds.
    duration: float
    #: The program itself, seconds.
    run_time: float
    cold_start: bool
    worker: str
    worker_replaced: bool
    replaced_because: Optional[str]

    @staticmethod
    def from_wire(d: Mapping[str, Any]) -> "FnResult":
        return FnResult(
            exit_code=int(d["exitCode"]),
            stdout=str(d["stdout"]),
            stderr=str(d["stderr"]),
            truncated=bool(d["truncated"]),
            stdout_bytes=int(d["stdoutBytes"]),
            stderr_bytes=int(d["stderrBytes"]),
            timed_out=bool(d["timedOut"]),
            oom_killed=bool(d["oomKilled"]),
            duration=float(d["durationMs"]) / 1000,
            run_time=float(d["runMs"]) / 1000,
            cold_start=bool(d["coldStart"]),
            worker=str(d["worker"]),
            worker_replaced=bool(d["workerReplaced"]),
            replaced_because=d.get("replacedBecause"),
        )


@dataclass(frozen=True)
class FnOutcome:
    """One call of a batch: its result, or the error that kept it from running."""

    index: int
    result: Optional[FnResult]
    error: Optional[DsecError]


def _text(value: Bytes) -> Dict[str, str]:
    """A str goes as utf8, bytes as base64."""
    if isinstance(value, bytes):
        return {"data": base64.b64encode(value).decode("ascii"), "encoding": "base64"}
    return {"data": value, "encoding": "utf8"}


def _wire_call(
    runtime: str,
    code: str,
    stdin: Optional[Bytes] = None,
    files: Optional[Mapping[str, Bytes]] = None,
    args: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    memory_mib: Optional[int] = None,
    disk_mib: Optional[int] = None,
    network: Optional[bool] = None,
    image: Optional[str] = None,
    max_output_bytes: Optional[int] = None,
) -> Dict[str, Any]:
    if runtime not in ("python", "node", "bash"):
        raise _invalid("runtime", f"runtime must be python, node or bash, got {runtime!r}")
    if not isinstance(code, str):
        raise _invalid("code", f"code must be a str, got {type(code).__name__}")
    body: Dict[str, Any] = {"runtime": runtime, "code": code}
    if stdin is not None:
        t = _text(stdin)
        body["stdin"], body["stdinEncoding"] = t["data"], t["encoding"]
    if files:
        encoded = {path: _text(content) for path, content in files.items()}
        # One encoding for every file: base64 as soon as one of them is bytes.
        if any(e["encoding"] == "base64" for e in encoded.values()):
            body["files"] = {p: base64.b64encode(c if isinstance(c, bytes) else c.encode()).decode("ascii") for p, c in files.items()}
            body["filesEncoding"] = "base64"
        else:
            body["files"] = {p: e["data"] for p, e in encoded.items()}
    for key, value in (("args", list(args) if args is not None else None), ("env", dict(env) if env is not None else None),
                       ("timeoutMs", _ms(timeout)), ("memoryMiB", memory_mib), ("diskMiB", disk_mib), ("network", network),
                       ("image", image), ("maxOutputBytes", max_output_bytes)):
        if value is not None:
            body[key] = value
    return body


def run(
    runtime: str,
    code: str,
    *,
    stdin: Optional[Bytes] = None,
    files: Optional[Mapping[str, Bytes]] = None,
    args: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
    memory_mib: Optional[int] = None,
    disk_mib: Optional[int] = None,
    network: Optional[bool] = None,
    image: Optional[str] = None,
    max_output_bytes: Optional[int] = None,
    url: Optional[str] = None,
    api_key: Optional[str] = None,
) -> FnResult:
    """Runs one call; ``timeout`` limits the program (default 10 s on the server)."""
    body = _wire_call(runtime, code, stdin, files, args, env, timeout, memory_mib, disk_mib, network, image, max_output_bytes)
    limit = (timeout if timeout is not None else 10.0) + COLD_START_MARGIN
    return transport_for(url, api_key).run(Op(Call("POST", "/v1/fn/run", json=body, has_json=True, timeout=limit), FnResult.from_wire))


def _batch_body(calls: Sequence[Mapping[str, Any]], concurrency: Optional[int]) -> Dict[str, Any]:
    wire = [_wire_call(**dict(c)) for c in calls]
    body: Dict[str, Any] = {"calls": wire}
    if concurrency is not None:
        body["concurrency"] = concurrency
    return body


def map_iter(
    calls: Sequence[Mapping[str, Any]],
    *,
    concurrency: Optional[int] = None,
    timeout: Optional[float] = None,
    url: Optional[str] = None,
    api_key: Optional[str] = None,
) -> Iterator[FnOutcome]:
    """Runs many calls (each a dict of ``run``'s arguments: runtime, code, stdin, …), ``concurrency``
    at a time on the server, and yields each outcome as it finishes (``index`` says which)."""
    call = Call("POST", "/v1/fn/batch", json=_batch_body(calls, concurrency), has_json=True, accept=NDJSON, timeout=timeout or BATCH_TIMEOUT)
    for line in transport_for(url, api_key).lines(call):
        err = line.get("error")
        if err is not None:
            yield FnOutcome(int(line["index"]), None, error_from_wire(None, {**err, "details": {"index": line["index"]}}))
        else:
            yield FnOutcome(int(line["index"]), FnResult.from_wire(line["result"]), None)


def map(  # noqa: A001 (the SDK's name for it, as in TypeScript's fn.map)
    calls: Sequence[Mapping[str, Any]],
    *,
    concurrency: Optional[int] = None,
    timeout: Optional[float] = None,
    url: Optional[str] = None,
    api_key: Optional[str] = None,
) -> List[FnResult]:
    """Runs many calls and returns their results in the order of ``calls``; a call that could not
    run (no capacity, a bad image) raises its error (use ``map_iter`` to take outcomes one by one)."""
    out: List[Optional[FnResult]] = [None] * len(calls)
    for o in map_iter(calls, concurrency=concurrency, timeout=timeout, url=url, api_key=api_key):
        if o.error is not None:
            raise o.error
        out[o.index] = o.result
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        raise DsecError(f"the batch's stream ended before calls {missing[:10]} answered", "STREAM_BROKEN")
    return [r for r in out if r is not None]

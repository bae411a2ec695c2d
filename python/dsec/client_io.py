"""The two I/O faces the client runs over (``IO``: ``SyncIO`` for ``sandbox.py``, ``AsyncIO`` for
``aio.py``), and the base of every handle that holds one. See ``client.py`` for why."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, ClassVar, Dict, Protocol, TypeVar

from . import models as m
from .calls import Call, Op
from .errors import CommandExitError

if TYPE_CHECKING:
    from .aio_transport import AsyncTransport
    from .transport import SyncTransport

T = TypeVar("T")


class IO(Protocol):
    """What the client needs from a transport."""

    def run(self, op: Op[T]) -> Awaitable[T]: ...

    def lines(self, call: Call) -> AsyncIterator[Dict[str, Any]]: ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def shield(self, clean_up: Awaitable[T]) -> Awaitable[T]: ...


class SyncIO:
    """The blocking transport as ``IO``: every coroutine does its I/O and returns without
    suspending, so the sync face can run them without an event loop."""

    def __init__(self, transport: "SyncTransport") -> None:
        self.transport = transport

    async def run(self, op: Op[T]) -> T:
        return self.transport.run(op)

    async def lines(self, call: Call) -> AsyncIterator[Dict[str, Any]]:
        it = self.transport.lines(call)
        try:
            for line in it:
                yield line
        finally:
            it.close()  # type: ignore[attr-defined]  # a generator: closing it closes the connection

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def shield(self, clean_up: Awaitable[T]) -> T:
        return await clean_up


class AsyncIO:
    """The asyncio transport as ``IO``."""

    def __init__(self, transport: "AsyncTransport") -> None:
        self.transport = transport

    def run(self, op: Op[T]) -> Awaitable[T]:
        return self.transport.run(op)

    def lines(self, call: Call) -> AsyncIterator[Dict[str, Any]]:
        return self.transport.lines(call)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def shield(self, clean_up: Awaitable[T]) -> Awaitable[T]:
        return asyncio.shield(clean_up)


async def _aclose(it: AsyncIterator[Any]) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


def _check(result: m.ExecResult, check: bool) -> m.ExecResult:
    if check and result.exit_code != 0:
        raise CommandExitError(result.exit_code, result.stdout, result.stderr)
    return result


class _Handle:
    """The transport a face object was made with (``_t``) and the ``IO`` over it (``_io``)."""

    #: How the face turns its transport into ``IO`` (``SyncIO`` or ``AsyncIO``).
    _io_type: ClassVar[Callable[[Any], IO]]

    def __init__(self, transport: Any) -> None:
        self._t = transport
        self._io: IO = type(self)._io_type(transport)

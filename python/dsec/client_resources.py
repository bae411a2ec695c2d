"""What the handles besides ``Sandbox`` do, written once for both faces (see ``client.py`` for why
this shape): a sandbox's ports, named volumes, images and warm pools. ``resources.py`` (sync) and
``aio_resources.py`` (asyncio) give each its public names; the class-level calls (create, list,
get) live in the faces, as ``Sandbox.create`` does, because they pick the transport.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

from . import calls
from . import models as m
from .client_io import _Handle


class PortsCore(_Handle):
    """Servers in the sandbox, through the control plane's proxy: they listen on the sandbox's own
    loopback (or 0.0.0.0), under any network policy."""

    def __init__(self, transport: Any, sandbox_id: str) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id

    def url(self, port: int, path: str = "/") -> str:
        """The proxy URL of ``path`` on ``port``; it needs the API key (``Authorization: Bearer``),
        as ``fetch`` sends it. For a browser use ``link``. A path with control characters,
        whitespace, '#' or a '..' segment is refused (``InvalidRequestError``), as in ``fetch``."""
        base: str = self._t.config.url
        return base.rstrip("/") + calls.port_path(self.sandbox_id, port, path, "ports.url")

    async def _fetch(
        self,
        port: int,
        path: str = "/",
        *,
        method: str = "GET",
        body: Union[None, str, bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> m.PortResponse:
        """One HTTP request to the server on ``port``, with the API key added. Its answer comes
        back whatever the status (``PortResponse``); when nothing listens there yet, or the
        server's answer breaks off, dsec's own error is raised (``ServerError`` with code
        PORT_NOT_LISTENING or PORT_BAD_RESPONSE): ``ports.wait(port)`` first. The method must be
        letters, header names HTTP tokens with values free of CR, LF and NUL, and the path free of
        control characters, whitespace, '#' and '..' segments (else ``InvalidRequestError``
        before anything is sent). Never retried: the server may have acted on the request."""
        return await self._io.run(calls.port_fetch(self.sandbox_id, port, path, method, body, headers, timeout))

    async def _wait(self, port: int, *, wait: float = 30.0, timeout: Optional[float] = None) -> m.PortWait:
        """Returns once something in the sandbox accepts connections on ``port`` (any protocol:
        nothing is sent to it): ``PortWait(port, waited_ms)``, how long that took; ``TimeoutError``
        (PORT_WAIT_TIMEOUT) after ``wait`` seconds. For a server started with ``commands.start``
        before the first ``fetch``."""
        return await self._io.run(calls.port_wait(self.sandbox_id, port, wait, timeout))

    async def _link(self, port: int, *, ttl_seconds: Optional[int] = None, timeout: Optional[float] = None) -> m.PortLink:
        """A signed URL that opens ``port`` without an API key (for a browser), until it expires
        (default 1 h, at most 24 h) or the sandbox is killed."""
        return await self._io.run(calls.port_link(self.sandbox_id, port, ttl_seconds, timeout))


class VolumeCore(_Handle):
    """A named volume: a persistent directory kept on one node, mounted into sandboxes at create
    (``Sandbox.create(volumes=[{"name": v.name, "path": "/data"}])``) and kept when they end."""

    def __init__(self, transport: Any, info: m.VolumeInfo) -> None:
        super().__init__(transport)
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.info.edge or '?'}>"

    async def _refresh(self, *, timeout: Optional[float] = None) -> m.VolumeInfo:
        """Reads its state again: who mounts it, the size of its files (``info.bytes``)."""
        self.info = await self._io.run(calls.get_volume(self.name, timeout))
        return self.info

    async def _delete(self, *, timeout: Optional[float] = None) -> None:
        """Deletes it and its files; ``ConflictError`` (VOLUME_IN_USE) while a sandbox mounts it."""
        await self._io.run(calls.delete_volume(self.name, timeout))


class ImageCore(_Handle):
    """An image: layers plus the config processes start with. Sandboxes start from one
    (``Sandbox.create(img.id)``); a snapshot makes one."""

    def __init__(self, transport: Any, info: m.ImageInfo) -> None:
        super().__init__(transport)
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.names[0] if self.info.names else self.id}>"

    async def _refresh(self, *, timeout: Optional[float] = None) -> m.ImageInfo:
        """Names, layers, size and lifetime, fetched anew."""
        self.info = await self._io.run(calls.get_image(self.id, timeout))
        return self.info

    async def _delete(self, *, timeout: Optional[float] = None) -> None:
        """Deletes this image and its names (sandboxes running from it keep running); its
        layers are freed by ``Image.gc()``."""
        await self._io.run(calls.delete_image(self.id, timeout))


class PoolCore(_Handle):
    """A warm pool: ready sandboxes of one spec, refilled in the background. A create naming it
    (``Sandbox.create("py", pool="py")``) claims a ready one."""

    def __init__(self, transport: Any, info: m.PoolInfo) -> None:
        super().__init__(transport)
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ready={self.info.ready}/{self.info.size}>"

    async def _refresh(self, *, timeout: Optional[float] = None) -> m.PoolInfo:
        """Its sizes, claims, misses and refill times, fetched anew."""
        self.info = await self._io.run(calls.get_pool(self.name, timeout))
        return self.info

    async def _delete(self, *, timeout: Optional[float] = None) -> None:
        """Deletes the pool and kills its unclaimed sandboxes; claimed ones stay their callers'."""
        await self._io.run(calls.delete_pool(self.name, timeout))


def pool_spec(
    image: str,
    *,
    cpu: Optional[float] = None,
    memory_mib: Optional[int] = None,
    pids: Optional[int] = None,
    disk_mib: Optional[int] = None,
    layers: Optional[Any] = None,
    env: Optional[Mapping[str, str]] = None,
    network: Union[None, str, Mapping[str, Any]] = None,
    backend: Optional[str] = None,
    placement: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The part of a create spec a pool fixes, in ``Sandbox.create``'s keywords."""
    return calls.create_body(
        image=image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, network=network, backend=backend, placement=placement
    )


__all__ = ["ImageCore", "PoolCore", "PortsCore", "VolumeCore", "pool_spec"]

"""The asyncio face of volumes, images and pools: ``resources.py`` with ``await``
(``AsyncVolume``, ``AsyncImage``, ``AsyncPool``); ``sb.ports`` is in ``aio.py``."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

from . import calls
from . import models as m
from .client_io import AsyncIO
from .client_resources import ImageCore, PoolCore, VolumeCore, pool_spec
from .aio import awaiting, transport_for


class AsyncVolume(VolumeCore):
    """A named volume. ``Volume.create("pip-cache")``, then
    ``Sandbox.create(volumes=[{"name": "pip-cache", "path": "/root/.cache/pip"}])``."""

    _io_type = AsyncIO

    refresh = awaiting(VolumeCore._refresh)
    delete = awaiting(VolumeCore._delete)

    @classmethod
    async def create(
        cls, name: str, *, labels: Optional[Mapping[str, str]] = None, edge: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "AsyncVolume":
        """Creates a volume (``ConflictError`` VOLUME_EXISTS if the name is taken); ``edge`` pins it to a node."""
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.create_volume(name, labels, edge, timeout)))

    @classmethod
    async def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["AsyncVolume"]:
        """Every volume of the caller's project."""
        t = transport_for(url, api_key)
        return [cls(t, v) for v in await t.run(calls.list_volumes(timeout))]

    @classmethod
    async def get(cls, name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "AsyncVolume":
        """One volume with the size of its files; ``NotFoundError`` (VOLUME_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.get_volume(name, timeout)))


class AsyncImage(ImageCore):
    """An image on the server: ``Image.list()``, ``Image.get("busybox")``, ``Image.build(...)``,
    ``Image.delete(ref)`` / ``img.delete()``, ``Image.gc()``."""

    _io_type = AsyncIO

    refresh = awaiting(ImageCore._refresh)

    @classmethod
    async def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["AsyncImage"]:
        """Every image on the server, oldest first."""
        t = transport_for(url, api_key)
        return [cls(t, i) for i in await t.run(calls.list_images(timeout))]

    @classmethod
    async def get(cls, ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "AsyncImage":
        """One image by name (``busybox``, ``py:3.11``) or id; ``NotFoundError`` (IMAGE_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.get_image(ref, timeout)))

    @classmethod
    async def build(
        cls, builder: str, *, name: Optional[str] = None, packages: Optional[Sequence[str]] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "AsyncImage":
        """Builds an image on the server (``busybox``, ``debian`` with ``packages``, ``fn-runtime``),
        cached by its inputs; ``timeout`` defaults to 15 minutes."""
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.build_image(builder, name, packages, timeout)))

    @classmethod
    async def pull(cls, ref: str, *, name: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.PulledImage:
        """Pulls a dsec image from an OCI registry (``HOST[:PORT]/REPO[:TAG]`` or ``@sha256:…``)."""
        return await transport_for(url, api_key).run(calls.pull_image(ref, name, timeout))

    @classmethod
    async def push(cls, image: str, ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.PushedImage:
        """Pushes an image to an OCI registry with the control plane's registry account."""
        return await transport_for(url, api_key).run(calls.push_image(image, ref, timeout))

    @classmethod
    async def gc(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.GcResult:
        """Deletes layer blobs nothing uses; the result says what it kept and why."""
        return await transport_for(url, api_key).run(calls.gc_images(timeout))

    delete = awaiting(ImageCore._delete)

    @staticmethod
    async def delete_by_ref(ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Untags a name, or deletes an image by id with its names, without fetching it first."""
        await transport_for(url, api_key).run(calls.delete_image(ref, timeout))


class AsyncPool(PoolCore):
    """A warm pool: ``Pool.create("py", 16, "py", memory_mib=256)``; a create naming it claims a ready sandbox."""

    _io_type = AsyncIO

    refresh = awaiting(PoolCore._refresh)
    delete = awaiting(PoolCore._delete)

    @classmethod
    async def create(
        cls,
        name: str,
        size: int,
        image: str = "busybox",
        *,
        cpu: Optional[float] = None,
        memory_mib: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mib: Optional[int] = None,
        layers: Optional[Sequence[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        network: Union[None, str, Mapping[str, Any]] = None,
        backend: Optional[str] = None,
        placement: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> "AsyncPool":
        """Creates a pool of ``size`` ready sandboxes of this spec; it fills in the background
        (``refresh().ready`` counts what is there)."""
        spec = pool_spec(image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, network=network, backend=backend, placement=placement)
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.create_pool(name, size, spec, timeout)))

    @classmethod
    async def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["AsyncPool"]:
        """Every pool with its sizes, claims, misses and refill times."""
        t = transport_for(url, api_key)
        return [cls(t, p) for p in await t.run(calls.list_pools(timeout))]

    @classmethod
    async def get(cls, name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "AsyncPool":
        """One pool; ``NotFoundError`` (POOL_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, await t.run(calls.get_pool(name, timeout)))

    @staticmethod
    async def delete_by_name(name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Deletes a pool by name without fetching it first (its unclaimed sandboxes are killed)."""
        await transport_for(url, api_key).run(calls.delete_pool(name, timeout))

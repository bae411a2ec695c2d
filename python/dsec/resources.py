"""The sync face of volumes, images and pools (``client_resources.py`` holds what each
call does; ``sb.ports`` is in ``sandbox.py``). ``aio_resources.py`` is the same with ``await``."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

from . import calls
from . import models as m
from .client_io import SyncIO
from .client_resources import ImageCore, PoolCore, VolumeCore, pool_spec
from .sandbox import blocking, transport_for


class Volume(VolumeCore):
    """A named volume. ``Volume.create("pip-cache")``, then
    ``Sandbox.create(volumes=[{"name": "pip-cache", "path": "/root/.cache/pip"}])``."""

    _io_type = SyncIO

    refresh = blocking(VolumeCore._refresh)
    delete = blocking(VolumeCore._delete)

    @classmethod
    def create(
        cls, name: str, *, labels: Optional[Mapping[str, str]] = None, edge: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "Volume":
        """Creates a volume (``ConflictError`` VOLUME_EXISTS if the name is taken); ``edge`` pins it to a node."""
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.create_volume(name, labels, edge, timeout)))

    @classmethod
    def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["Volume"]:
        """Every volume of the caller's project."""
        t = transport_for(url, api_key)
        return [cls(t, v) for v in t.run(calls.list_volumes(timeout))]

    @classmethod
    def get(cls, name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "Volume":
        """One volume with the size of its files; ``NotFoundError`` (VOLUME_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.get_volume(name, timeout)))


class Image(ImageCore):
    """An image on the server: ``Image.list()``, ``Image.get("busybox")``, ``Image.build(...)``,
    ``Image.delete(ref)`` / ``img.delete()``, ``Image.gc()``."""

    _io_type = SyncIO

    refresh = blocking(ImageCore._refresh)

    @classmethod
    def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["Image"]:
        """Every image on the server, oldest first."""
        t = transport_for(url, api_key)
        return [cls(t, i) for i in t.run(calls.list_images(timeout))]

    @classmethod
    def get(cls, ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "Image":
        """One image by name (``busybox``, ``py:3.11``) or id; ``NotFoundError`` (IMAGE_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.get_image(ref, timeout)))

    @classmethod
    def build(
        cls, builder: str, *, name: Optional[str] = None, packages: Optional[Sequence[str]] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None
    ) -> "Image":
        """Builds an image on the server (``busybox``, ``debian`` with ``packages``, ``fn-runtime``),
        cached by its inputs; ``timeout`` defaults to 15 minutes."""
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.build_image(builder, name, packages, timeout)))

    @classmethod
    def pull(cls, ref: str, *, name: Optional[str] = None, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.PulledImage:
        """Pulls a dsec image from an OCI registry (``HOST[:PORT]/REPO[:TAG]`` or ``@sha256:…``)."""
        return transport_for(url, api_key).run(calls.pull_image(ref, name, timeout))

    @classmethod
    def push(cls, image: str, ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.PushedImage:
        """Pushes an image to an OCI registry with the control plane's registry account."""
        return transport_for(url, api_key).run(calls.push_image(image, ref, timeout))

    @classmethod
    def gc(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> m.GcResult:
        """Deletes layer blobs nothing uses; the result says what it kept and why."""
        return transport_for(url, api_key).run(calls.gc_images(timeout))

    delete = blocking(ImageCore._delete)

    @staticmethod
    def delete_by_ref(ref: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Untags a name, or deletes an image by id with its names, without fetching it first."""
        transport_for(url, api_key).run(calls.delete_image(ref, timeout))


class Pool(PoolCore):
    """A warm pool: ``Pool.create("py", 16, "py", memory_mib=256)``; a create naming it claims a ready sandbox."""

    _io_type = SyncIO

    refresh = blocking(PoolCore._refresh)
    delete = blocking(PoolCore._delete)

    @classmethod
    def create(
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
    ) -> "Pool":
        """Creates a pool of ``size`` ready sandboxes of this spec; it fills in the background
        (``refresh().ready`` counts what is there)."""
        spec = pool_spec(image, cpu=cpu, memory_mib=memory_mib, pids=pids, disk_mib=disk_mib, layers=layers, env=env, network=network, backend=backend, placement=placement)
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.create_pool(name, size, spec, timeout)))

    @classmethod
    def list(cls, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> List["Pool"]:
        """Every pool with its sizes, claims, misses and refill times."""
        t = transport_for(url, api_key)
        return [cls(t, p) for p in t.run(calls.list_pools(timeout))]

    @classmethod
    def get(cls, name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> "Pool":
        """One pool; ``NotFoundError`` (POOL_NOT_FOUND) when there is none."""
        t = transport_for(url, api_key)
        return cls(t, t.run(calls.get_pool(name, timeout)))

    @staticmethod
    def delete_by_name(name: str, *, timeout: Optional[float] = None, url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        """Deletes a pool by name without fetching it first (its unclaimed sandboxes are killed)."""
        transport_for(url, api_key).run(calls.delete_pool(name, timeout))

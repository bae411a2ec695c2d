"""Files inside a sandbox, written once for both faces (see ``client.py``), and the local tar
helpers ``upload_dir`` and ``download_dir`` use."""

from __future__ import annotations

import io
import tarfile
from typing import Any, Dict, Optional, Union, cast

from . import calls
from . import models as m
from .client_io import _Handle
from .errors import DsecError, NotFoundError


# -- files ----------------------------------------------------------------------------------------


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


class FilesCore(_Handle):
    """Files inside a sandbox; every path resolves inside its root."""

    def __init__(self, transport: Any, sandbox_id: str) -> None:
        super().__init__(transport)
        self.sandbox_id = sandbox_id

    async def _read(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        """A file's bytes."""
        return await self._io.run(calls.read_file(self.sandbox_id, path, timeout))

    async def _read_text(self, path: str, *, encoding: str = "utf-8", timeout: Optional[float] = None) -> str:
        """A file's text (UTF-8 unless told)."""
        return (await self._read(path, timeout=timeout)).decode(encoding)

    async def _write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None, timeout: Optional[float] = None) -> m.WriteResult:
        """Creates or replaces a file (parents created); ``str`` is written as UTF-8."""
        return await self._io.run(calls.write_file(self.sandbox_id, path, data, mode, timeout))

    async def _stat(self, path: str, *, timeout: Optional[float] = None) -> m.FileStat:
        """A file's type, size, mode and times."""
        return await self._io.run(calls.stat(self.sandbox_id, path, timeout))

    async def _exists(self, path: str, *, timeout: Optional[float] = None) -> bool:
        """Whether the path exists."""
        try:
            await self._stat(path, timeout=timeout)
            return True
        except NotFoundError:
            return False

    async def _list(self, path: str, *, timeout: Optional[float] = None) -> m.DirListing:
        """A directory's entries."""
        return await self._io.run(calls.list_dir(self.sandbox_id, path, timeout))

    async def _mkdir(self, path: str, *, parents: bool = True, timeout: Optional[float] = None) -> None:
        """Makes a directory (and its parents unless ``parents=False``)."""
        await self._io.run(calls.mkdir(self.sandbox_id, path, parents, timeout))

    async def _remove(self, path: str, *, recursive: bool = False, timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with ``recursive=True``."""
        await self._io.run(calls.remove(self.sandbox_id, path, recursive, timeout))

    async def _rename(self, src: str, dst: str, *, timeout: Optional[float] = None) -> None:
        """Moves ``src`` to ``dst``."""
        await self._io.run(calls.rename(self.sandbox_id, src, dst, timeout))

    async def _upload_tar(self, directory: str, archive: bytes, *, timeout: Optional[float] = None) -> m.WriteResult:
        """Unpacks a tar archive into ``directory`` (created if missing), inside the sandbox."""
        return await self._io.run(calls.upload_tar(self.sandbox_id, directory, archive, timeout))

    async def _download_tar(self, path: str, *, timeout: Optional[float] = None) -> bytes:
        """A file or directory as a tar archive (one top-level entry: its name)."""
        return await self._io.run(calls.download_tar(self.sandbox_id, path, timeout))

    async def _upload_dir(self, local_dir: str, directory: str, *, timeout: Optional[float] = None) -> m.WriteResult:
        """Copies a local directory's contents into ``directory`` in the sandbox (as one tar)."""
        return await self._upload_tar(directory, tar_directory(local_dir), timeout=timeout)

    async def _download_dir(self, path: str, local_dir: str, *, timeout: Optional[float] = None) -> None:
        """Copies a sandbox file or directory into ``local_dir`` (as ``local_dir/<name>``)."""
        untar_into(await self._download_tar(path, timeout=timeout), local_dir)

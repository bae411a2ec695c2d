"""Where the server is: explicit arguments, then DSEC_URL / DSEC_API_KEY, then the data dir's
client.json (DSEC_DATA_DIR, default /var/lib/dsec), exactly as the TypeScript SDK resolves it."""

from __future__ import annotations

import json
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from .errors import NotConfiguredError

#: Where dsec keeps its state unless told otherwise; ``dsec up`` writes client.json there.
DEFAULT_DATA_DIR = "/var/lib/dsec"
#: Default deadline of one HTTP call, in seconds.
DEFAULT_REQUEST_TIMEOUT = 120.0


@dataclass(frozen=True)
class ConnectionConfig:
    url: str
    api_key: str
    #: Default deadline of a call in seconds, when the call gives none.
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT


def _origin(url: str) -> Optional[Tuple[str, str, int]]:
    """(scheme, host, port) of a URL, or None when it has no scheme and host."""
    try:
        p = urllib.parse.urlsplit(url)
        if not p.scheme or not p.hostname:
            return None
        return (p.scheme.lower(), p.hostname.lower(), p.port or (443 if p.scheme.lower() == "https" else 80))
    except ValueError:
        return None


def _client_path() -> str:
    return os.path.join(os.environ.get("DSEC_DATA_DIR", DEFAULT_DATA_DIR), "client.json")


def _client_file() -> Dict[str, Any]:
    path = _client_path()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def resolve_connection(url: Optional[str] = None, api_key: Optional[str] = None, request_timeout: Optional[float] = None) -> ConnectionConfig:
    """Resolves url and key: arguments, then DSEC_URL/DSEC_API_KEY, then DATA_DIR/client.json.
    client.json's key goes only to the server client.json names: a url given another way (DSEC_URL
    at a remote cluster) without a key is not sent this host's local admin key."""
    url = url if url is not None else os.environ.get("DSEC_URL")
    api_key = api_key if api_key is not None else os.environ.get("DSEC_API_KEY")
    other_server: Optional[str] = None
    if url is None or api_key is None:
        file = _client_file()
        file_url = file.get("url") if isinstance(file.get("url"), str) else None
        file_key = file.get("apiKey") if isinstance(file.get("apiKey"), str) else None
        if url is None:
            url = file_url
            if api_key is None:
                api_key = file_key
        elif file_url is not None and file_key is not None:
            if _origin(file_url) == _origin(url) and _origin(url) is not None:
                api_key = file_key
            else:
                other_server = file_url
    if url is not None and api_key is None and other_server is not None:
        raise NotConfiguredError(
            f"no API key for {url}: set DSEC_API_KEY (or pass api_key=); client.json's key is for {other_server} and is not sent elsewhere",
            "NOT_CONFIGURED",
            None,
            {"url": url, "clientFileUrl": other_server},
        )
    if url is None or api_key is None:
        missing = " and ".join(name for name, v in (("url", url), ("api_key", api_key)) if v is None)
        default = "" if "DSEC_DATA_DIR" in os.environ else ", the default data dir"
        raise NotConfiguredError(
            f"no dsec server configured (no {missing}): pass url= and api_key=, set DSEC_URL and DSEC_API_KEY, or set DSEC_DATA_DIR "
            f"to the data dir of a running `dsec up` (it writes client.json there; looked in {_client_path()}{default})",
            "NOT_CONFIGURED",
            None,
            {"clientFile": _client_path()},
        )
    return ConnectionConfig(url=url.rstrip("/"), api_key=api_key, request_timeout=request_timeout if request_timeout is not None else DEFAULT_REQUEST_TIMEOUT)

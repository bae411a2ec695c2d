"""Where the server is: explicit arguments, then DSEC_URL / DSEC_API_KEY, then the data dir's
client.json (DSEC_DATA_DIR, default /var/lib/dsec), exactly as the TypeScript SDK resolves it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

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
    """Resolves url and key: arguments, then DSEC_URL/DSEC_API_KEY, then DATA_DIR/client.json."""
    url = url if url is not None else os.environ.get("DSEC_URL")
    api_key = api_key if api_key is not None else os.environ.get("DSEC_API_KEY")
    if url is None or api_key is None:
        file = _client_file()
        if url is None and isinstance(file.get("url"), str):
            url = file["url"]
        if api_key is None and isinstance(file.get("apiKey"), str):
            api_key = file["apiKey"]
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

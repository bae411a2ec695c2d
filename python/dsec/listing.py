"""Listing sandboxes a page at a time, counting them, and bulk calls that report their progress.

Call builders as in ``calls.py`` (both clients send them), with the answers' models: what a
trainer holding tens of thousands of sandboxes needs without one answer of all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from . import models as m
from .calls import BULK_TIMEOUT, NDJSON, Call, Op, _invalid, _query, json_call

#: The largest page the server gives (``limit`` of ``GET /v1/sandboxes``).
MAX_PAGE = 10_000


@dataclass
class SandboxPage:
    """One page of a listing, oldest first (or newest, as asked); ``next`` is the cursor of the next page (None on the last)."""

    sandboxes: List[m.SandboxInfo] = field(default_factory=list)
    next: Optional[str] = None

    @classmethod
    def from_wire(cls, d: Any) -> "SandboxPage":
        return cls([m.SandboxInfo.from_wire(s) for s in d["sandboxes"]], d.get("next"))


@dataclass
class SandboxCounts:
    """Sandboxes by status (statuses with none are absent), and their total."""

    counts: Dict[str, int] = field(default_factory=dict)
    total: int = 0

    @classmethod
    def from_wire(cls, d: Any) -> "SandboxCounts":
        return cls(dict(d["counts"]), int(d["total"]))


#: The orders a page may come in: oldest first (the server's default) or newest first.
ORDERS = ("oldest", "newest")


def list_page(
    labels: Optional[Mapping[str, str]],
    status: Optional[str],
    limit: int,
    after: Optional[str],
    timeout: Optional[float],
    order: Optional[str] = None,
) -> Op[SandboxPage]:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise _invalid("limit", f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
    if order is not None and order not in ORDERS:
        raise _invalid("order", f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    q = _query(label=[f"{k}={v}" for k, v in (labels or {}).items()] or None, status=status, limit=limit, after=after, order=order)
    return Op(Call("GET", "/v1/sandboxes", query=q, timeout=timeout), SandboxPage.from_wire)


def counts(project: Optional[str], timeout: Optional[float]) -> Op[SandboxCounts]:
    return Op(Call("GET", "/v1/sandboxes/counts", query=_query(project=project), timeout=timeout), SandboxCounts.from_wire)


def bulk_progress(action: str, labels: Mapping[str, str], timeout: Optional[float]) -> Call:
    """A bulk kill/pause/resume streamed as NDJSON: ``{type: progress, total, done, failed}`` about
    every 500 ms, then ``{type: done, ..., ids, failures}``."""
    if not isinstance(labels, Mapping) or not labels:
        raise _invalid("labels", f"{action}_all needs labels with at least one pair (a bulk call never means all sandboxes), got {labels!r}")
    return json_call("POST", f"/v1/sandboxes/{action}", {"labels": dict(labels)}, accept=NDJSON, timeout=timeout or BULK_TIMEOUT)


def bulk_result(line: Dict[str, Any]) -> m.BulkResult:
    """The result a bulk stream's last line carries."""
    return m.BulkResult.from_wire({"ids": line.get("ids", []), "failures": line.get("failures", [])})

"""A minimal RFC 6455 WebSocket client for terminals, on the standard library.

Why not a dependency: the terminal route needs only the client handshake, masked frames out,
unmasked frames in (binary, text, close, ping), and fragmentation — about 150 lines — while
``websockets`` would be the package's one runtime dependency, absent from most trainer images.
No extensions (no permessage-deflate) are offered, so none can be negotiated.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

#: Largest message accepted from the server (the server caps its own at 1 MiB).
MAX_MESSAGE = 16 << 20


class ProtocolError(Exception):
    """The peer broke the WebSocket protocol."""


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode("ascii")


def accept_for(key: str) -> str:
    """The Sec-WebSocket-Accept value a server must answer to ``key``."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode("ascii")).digest()).decode("ascii")


def handshake_request(host: str, target: str, key: str, headers: Dict[str, str]) -> bytes:
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(head: bytes) -> Tuple[int, Dict[str, str]]:
    """Status and lower-cased headers of an HTTP answer head (up to the blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP answer: {lines[0]!r}")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


def check_upgrade(status: int, headers: Dict[str, str], key: str) -> None:
    if status != 101:
        raise ProtocolError(f"expected 101 Switching Protocols, got {status}")
    if headers.get("upgrade", "").lower() != "websocket" or headers.get("sec-websocket-accept") != accept_for(key):
        raise ProtocolError("the server's upgrade answer does not match the key sent")


def encode_frame(opcode: int, payload: bytes, mask: bool = True) -> bytes:
    """One final frame; clients must mask (RFC 6455 §5.3)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    mbit = 0x80 if mask else 0
    if n < 126:
        head += bytes([mbit | n])
    elif n < 1 << 16:
        head += bytes([mbit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mbit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _xor(payload, key)


def _xor(data: bytes, key: bytes) -> bytes:
    if not data:
        return b""
    n = len(data)
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


def close_payload(code: int = 1000, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:120]


@dataclass
class Frame:
    fin: bool
    opcode: int
    payload: bytes


class FrameParser:
    """Turns received bytes into frames, and frames into whole messages (fragments joined)."""

    def __init__(self) -> None:
        self._buf = b""
        self._parts: List[bytes] = []
        self._first_op: Optional[int] = None

    def feed(self, data: bytes) -> List[Frame]:
        """Whole messages and control frames completed by ``data``, in order."""
        self._buf += data
        out: List[Frame] = []
        while True:
            frame = self._next()
            if frame is None:
                return out
            if frame.opcode >= 0x8:
                if not frame.fin or len(frame.payload) > 125:
                    raise ProtocolError("control frames must be final and at most 125 bytes")
                out.append(frame)
                continue
            if frame.opcode == OP_CONT:
                if self._first_op is None:
                    raise ProtocolError("continuation frame with nothing to continue")
            else:
                if self._first_op is not None:
                    raise ProtocolError("new message inside a fragmented one")
                self._first_op = frame.opcode
            self._parts.append(frame.payload)
            if sum(len(p) for p in self._parts) > MAX_MESSAGE:
                raise ProtocolError(f"message over {MAX_MESSAGE} bytes")
            if frame.fin:
                out.append(Frame(True, self._first_op, b"".join(self._parts)))
                self._parts, self._first_op = [], None

    def _next(self) -> Optional[Frame]:
        b = self._buf
        if len(b) < 2:
            return None
        fin, opcode = bool(b[0] & 0x80), b[0] & 0x0F
        if b[0] & 0x70:
            raise ProtocolError("reserved bits set (no extension was negotiated)")
        masked, n = bool(b[1] & 0x80), b[1] & 0x7F
        pos = 2
        if n == 126:
            if len(b) < 4:
                return None
            n, pos = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, pos = struct.unpack("!Q", b[2:10])[0], 10
        if n > MAX_MESSAGE:
            raise ProtocolError(f"frame over {MAX_MESSAGE} bytes")
        key = b""
        if masked:
            if len(b) < pos + 4:
                return None
            key, pos = b[pos : pos + 4], pos + 4
        if len(b) < pos + n:
            return None
        payload = b[pos : pos + n]
        self._buf = b[pos + n :]
        return Frame(fin, opcode, _xor(payload, key) if masked else payload)

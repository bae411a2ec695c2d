"""Unit tests that need no dsec: connection resolution, error mapping by code, request bodies,
the WebSocket codec, and both transports against a local HTTP server (the same checks as
packages/sdk/src/connection.test.ts and errors.test.ts)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import shutil
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import dsec
from dsec import calls, errors
from dsec import gym
from dsec import models as m
from dsec import sandbox as sandbox_face
from dsec import websocket as ws
from dsec.aio_transport import AsyncTransport
from dsec.config import ConnectionConfig, resolve_connection
from dsec.transport import SyncTransport


class ResolveConnectionTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="dsec-py-conn-")
        with open(os.path.join(self.dir, "client.json"), "w") as f:
            json.dump({"url": "http://127.0.0.1:1111", "apiKey": "from-file"}, f)

    def tearDown(self) -> None:
        shutil.rmtree(self.dir)

    def env(self, **kv: Optional[str]) -> Any:
        base = {k: v for k, v in os.environ.items() if k not in ("DSEC_URL", "DSEC_API_KEY", "DSEC_DATA_DIR")}
        base.update({k: v for k, v in kv.items() if v is not None})
        return mock.patch.dict(os.environ, base, clear=True)

    def test_explicit_arguments_win_over_env_and_client_json(self) -> None:
        with self.env(DSEC_URL="http://127.0.0.1:2222", DSEC_API_KEY="from-env", DSEC_DATA_DIR=self.dir):
            c = resolve_connection("http://127.0.0.1:3333", "explicit")
        self.assertEqual((c.url, c.api_key), ("http://127.0.0.1:3333", "explicit"))

    def test_env_wins_over_client_json(self) -> None:
        with self.env(DSEC_URL="http://127.0.0.1:2222", DSEC_API_KEY="from-env", DSEC_DATA_DIR=self.dir):
            c = resolve_connection()
        self.assertEqual((c.url, c.api_key), ("http://127.0.0.1:2222", "from-env"))

    def test_client_json_in_the_data_dir_when_nothing_else_is_set(self) -> None:
        with self.env(DSEC_DATA_DIR=self.dir):
            c = resolve_connection()
        self.assertEqual((c.url, c.api_key), ("http://127.0.0.1:1111", "from-file"))

    def test_a_key_from_the_env_combines_with_a_url_from_client_json(self) -> None:
        with self.env(DSEC_API_KEY="from-env", DSEC_DATA_DIR=self.dir):
            c = resolve_connection()
        self.assertEqual((c.url, c.api_key), ("http://127.0.0.1:1111", "from-env"))

    def test_client_json_key_goes_only_to_its_own_server(self) -> None:
        # DSEC_URL at another cluster without DSEC_API_KEY: the local admin key is not sent there.
        with self.env(DSEC_URL="http://remote.example:8080", DSEC_DATA_DIR=self.dir):
            with self.assertRaises(dsec.NotConfiguredError) as cm:
                resolve_connection()
        self.assertIn("DSEC_API_KEY", str(cm.exception))
        self.assertIn("http://127.0.0.1:1111", str(cm.exception))
        # The same server client.json names (another spelling of its origin): its key is used.
        with self.env(DSEC_URL="http://127.0.0.1:1111/", DSEC_DATA_DIR=self.dir):
            c = resolve_connection()
        self.assertEqual(c.api_key, "from-file")
        with self.env(DSEC_DATA_DIR=self.dir):
            with self.assertRaises(dsec.NotConfiguredError):
                resolve_connection(url="http://127.0.0.1:2222")

    def test_trailing_slashes_are_removed_and_the_timeout_defaults_to_120_s(self) -> None:
        c = resolve_connection("http://127.0.0.1:1//", "k")
        self.assertEqual(c.url, "http://127.0.0.1:1")
        self.assertEqual(c.request_timeout, 120.0)

    def test_nothing_configured_raises_not_configured_naming_dsec_url(self) -> None:
        with self.env(DSEC_DATA_DIR=os.path.join(self.dir, "missing")):
            with self.assertRaises(dsec.NotConfiguredError) as cm:
                resolve_connection()
        self.assertEqual(cm.exception.code, "NOT_CONFIGURED")
        self.assertIn("DSEC_URL", str(cm.exception))
        self.assertIn(os.path.join(self.dir, "missing", "client.json"), str(cm.exception))


class ErrorMappingTest(unittest.TestCase):
    def test_every_registry_code_maps_to_its_class(self) -> None:
        # The registry in packages/sdk/src/errors.ts: each code, the status the server sends.
        expected = {
            "INVALID_REQUEST": dsec.InvalidRequestError, "UNAUTHORIZED": dsec.AuthError, "FORBIDDEN": dsec.AuthError,
            "FILE_PERMISSION_DENIED": dsec.AuthError,
            "SANDBOX_NOT_FOUND": dsec.NotFoundError, "IMAGE_NOT_FOUND": dsec.NotFoundError, "FILE_NOT_FOUND": dsec.NotFoundError,
            "ROUTE_NOT_FOUND": dsec.NotFoundError, "SESSION_NOT_FOUND": dsec.NotFoundError, "PROCESS_NOT_FOUND": dsec.NotFoundError,
            "SESSION_CLOSED": dsec.ConflictError, "PROCESS_NOT_RUNNING": dsec.ConflictError, "SANDBOX_NOT_RUNNING": dsec.ConflictError,
            "PATH_CONFLICT": dsec.ConflictError, "PAYLOAD_TOO_LARGE": dsec.InvalidRequestError, "UNSUPPORTED_MEDIA_TYPE": dsec.InvalidRequestError,
            "CAPACITY_EXCEEDED": dsec.CapacityError, "SANDBOX_CREATE_FAILED": dsec.ServerError, "EXEC_FAILED": dsec.ServerError,
            "INTERNAL": dsec.ServerError,
        }  # fmt: skip
        for code, cls in expected.items():
            e = errors.error_from_wire(418, {"code": code, "message": "m", "details": {"a": 1}})
            self.assertIs(type(e), cls, code)
            self.assertEqual((e.code, e.message, e.details, e.status), (code, "m", {"a": 1}, 418))

    def test_every_code_of_the_ts_registry_maps_to_a_class_of_its_status_family(self) -> None:
        # Reads the registry the server uses. A code added there maps by its status until it is
        # named in CODE_CLASSES; either way it must land in the family its status says.
        path = os.path.join(os.path.dirname(__file__), "..", "..", "packages", "sdk", "src", "errors.ts")
        with open(path, encoding="utf-8") as f:
            block = f.read().split("ERROR_CODES = {", 1)[1].split("} as const", 1)[0]
        registry = {code: int(status) for code, status in re.findall(r"^\s*([A-Z_]+): (\d+),", block, re.M)}
        self.assertGreater(len(registry), 15)
        family = {400: dsec.InvalidRequestError, 401: dsec.AuthError, 403: dsec.AuthError, 404: dsec.NotFoundError, 409: dsec.ConflictError,
                  413: dsec.InvalidRequestError, 415: dsec.InvalidRequestError, 416: dsec.InvalidRequestError, 500: dsec.ServerError,
                  502: dsec.ServerError, 504: dsec.TimeoutError, 507: dsec.ServerError}  # fmt: skip
        for code, status in registry.items():
            e = errors.error_from_wire(status, {"code": code, "message": "m"})
            self.assertEqual(e.code, code)
            if status == 503:
                self.assertTrue(e.retryable, f"{code} is a 503 and should be retryable")
            elif code.startswith("QUOTA_"):
                # A quota's 403 is not an auth failure: the caller acts on it differently.
                self.assertIs(type(e), dsec.RateLimitError if status == 429 else dsec.QuotaError, code)
            else:
                self.assertIs(type(e), family[status], code)
        for code, cls in errors.CODE_CLASSES.items():
            if code in registry and registry[code] != 503 and not code.startswith("QUOTA_"):
                self.assertIs(cls, family[registry[code]], f"CODE_CLASSES[{code}] disagrees with the registry's status")

    def test_every_registry_code_is_named_and_maps_as_in_the_typescript_sdk(self) -> None:
        # Both SDKs choose the class by code from one table each: CODE_CLASSES here, ERROR_CLASSES
        # in packages/sdk/src/errors.ts. They name exactly the registry's codes, with the same class.
        path = os.path.join(os.path.dirname(__file__), "..", "..", "packages", "sdk", "src", "errors.ts")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        registry_block = source.split("ERROR_CODES = {", 1)[1].split("} as const", 1)[0]
        registry = set(re.findall(r"^\s*([A-Z_]+): \d+,", registry_block, re.M))
        classes_block = source.split("ERROR_CLASSES = {", 1)[1].split("} as const", 1)[0]
        ts_classes = dict(re.findall(r"^\s*([A-Z_]+): (\w+),", classes_block, re.M))
        self.assertGreater(len(registry), 40)
        self.assertEqual(set(errors.CODE_CLASSES), registry, "CODE_CLASSES names exactly the registry's codes")
        self.assertEqual({code: cls.__name__ for code, cls in errors.CODE_CLASSES.items()}, ts_classes)
        retryable = {code for code, cls in errors.CODE_CLASSES.items() if cls.retryable}
        expected = {
            "CAPACITY_EXCEEDED",
            "NODE_MEMORY_PRESSURE",
            "OUTPUT_BUDGET_EXCEEDED",
            "EDGE_UNAVAILABLE",
            "SANDBOX_MIGRATING",
            "REGISTRY_UNAVAILABLE",
            "QUOTA_CREATE_RATE_EXCEEDED",
        }
        self.assertEqual(retryable, expected)

    def test_the_code_decides_not_the_status(self) -> None:
        # A capacity error is retryable whatever status a proxy put on it.
        e = errors.error_from_wire(500, {"code": "CAPACITY_EXCEEDED", "message": "full"})
        self.assertIsInstance(e, dsec.CapacityError)
        self.assertTrue(e.retryable)

    def test_retryable_only_on_capacity_and_rate_limits(self) -> None:
        self.assertTrue(errors.error_from_wire(429, {"code": "RATE_LIMITED", "message": "slow down"}).retryable)
        self.assertTrue(errors.error_from_wire(429, None).retryable)
        self.assertTrue(errors.error_from_wire(503, None).retryable)
        for code in ("SANDBOX_NOT_FOUND", "INVALID_REQUEST", "INTERNAL", "QUOTA_EXCEEDED"):
            self.assertFalse(errors.error_from_wire(400, {"code": code, "message": "x"}).retryable, code)

    def test_an_unknown_code_or_a_body_that_is_not_an_error_falls_back_to_the_status(self) -> None:
        e = errors.error_from_wire(404, {"code": "SOMETHING_NEW", "message": "gone"})
        self.assertIsInstance(e, dsec.NotFoundError)
        self.assertEqual(e.code, "SOMETHING_NEW")
        e = errors.error_from_wire(401, None)
        self.assertIsInstance(e, dsec.AuthError)
        self.assertEqual((e.code, e.message), ("HTTP_401", "HTTP 401"))

    def test_timeout_error_is_also_the_builtin_timeout_error(self) -> None:
        self.assertTrue(issubclass(dsec.TimeoutError, TimeoutError))
        self.assertTrue(issubclass(dsec.TimeoutError, dsec.DsecError))

    def test_command_exit_error_carries_exit_code_and_output(self) -> None:
        e = dsec.CommandExitError(2, "o", "e")
        self.assertEqual((e.exit_code, e.stdout, e.stderr, e.code), (2, "o", "e", "COMMAND_EXIT"))


class RequestBodyTest(unittest.TestCase):
    def test_create_spec_uses_wire_names_and_leaves_unset_fields_out(self) -> None:
        body = calls.create_body(image="busybox", cpu=0.5, memory_mib=64, labels={"task": "t1"}, network="none", ttl_seconds=60)
        self.assertEqual(body, {"image": "busybox", "resources": {"cpu": 0.5, "memoryMiB": 64}, "labels": {"task": "t1"}, "network": {"mode": "none"}, "ttlSeconds": 60})

    def test_exec_body_seconds_become_milliseconds_and_bytes_stdin_travels_as_base64(self) -> None:
        body = calls.exec_body(["cat"], cwd="/tmp", stdin=b"\x00\xff", timeout=1.5, writable_paths=["/work"], binary=True)
        self.assertEqual(body, {"cmd": ["cat"], "cwd": "/tmp", "timeoutMs": 1500, "writablePaths": ["/work"], "encoding": "base64", "stdin": "AP8=", "stdinEncoding": "base64"})
        self.assertEqual(calls.exec_body("echo", stdin="text")["stdin"], "text")

    def test_arguments_of_the_wrong_python_type_are_refused_naming_the_argument(self) -> None:
        for make, field in (
            (lambda: calls.exec_body("true", timeout="5"), "timeout"),  # type: ignore[arg-type]
            (lambda: calls.exec_body("true", timeout=True), "timeout"),
            (lambda: calls.wait_process("sb-x-abcdef", "p-1", "30", None), "wait"),  # type: ignore[arg-type]
            (lambda: calls.write_file("sb-x-abcdef", "/x", {"a": 1}, None, None), "data"),  # type: ignore[arg-type]
            (lambda: calls.read_file("sb-x-abcdef", 123, None), "path"),  # type: ignore[arg-type]
            (lambda: calls.rename("sb-x-abcdef", "/a", None, None), "dst"),  # type: ignore[arg-type]
        ):
            with self.assertRaises(dsec.InvalidRequestError) as cm:
                make()
            self.assertEqual(cm.exception.details, {"field": field}, cm.exception.message)

    def test_the_http_deadline_of_a_command_is_its_timeout_plus_a_margin(self) -> None:
        self.assertEqual(calls.command_deadline(5, None), 15)
        self.assertEqual(calls.command_deadline(None, None), 70)
        self.assertEqual(calls.command_deadline(5, 2), 2)

    def test_query_values_are_encoded_and_labels_repeat(self) -> None:
        op = calls.list_sandboxes({"team": "a", "run": "r 1&x"}, None, None)
        q = parse_qs(urlsplit(op.call.target).query)
        self.assertEqual(sorted(q["label"]), ["run=r 1&x", "team=a"])
        self.assertEqual(parse_qs(urlsplit(calls.write_file("sb-x-abcdef", "/tmp/a b", "x", 0o750, None).call.target).query), {"path": ["/tmp/a b"], "mode": ["750"]})

    def test_trajectories_repeat_labels_name_the_batch_stream_for_a_day_and_need_a_filter(self) -> None:
        c = calls.trajectories({"run": "7", "arm": "x y"}, "batch-abc123", None, None)
        self.assertEqual(urlsplit(c.target).path, "/v1/trajectories")
        q = parse_qs(urlsplit(c.target).query)
        self.assertEqual((sorted(q["label"]), q["batch"]), (["arm=x y", "run=7"], ["batch-abc123"]))
        self.assertEqual((c.accept, c.timeout), (calls.NDJSON, calls.TRAJECTORIES_TIMEOUT))
        self.assertEqual(parse_qs(urlsplit(calls.trajectories(None, "batch-abc123", "team-a", 5).target).query), {"batch": ["batch-abc123"], "project": ["team-a"]})
        for labels in (None, {}):
            with self.assertRaises(dsec.InvalidRequestError) as cm:
                calls.trajectories(labels, None, None, None)
            self.assertEqual(cm.exception.details, {"field": "labels"})
        with self.assertRaises(dsec.InvalidRequestError):
            calls.trajectories("run=7", None, None, None)  # type: ignore[arg-type]

    def test_lineage_is_asked_only_when_wanted_and_read_back(self) -> None:
        self.assertEqual(calls.trajectory("sb-x-abcdef", None, None, None).call.target, "/v1/sandboxes/sb-x-abcdef/trajectory")
        self.assertEqual(parse_qs(urlsplit(calls.trajectory("sb-x-abcdef", 0, 10, None, True).call.target).query), {"afterSeq": ["0"], "limit": ["10"], "lineage": ["true"]})
        t = m.Trajectory.from_wire(
            {"sandboxId": "sb-x-child1", "entries": [{"seq": 1, "kind": "exec", "sandboxId": "sb-x-parent"}, {"seq": 1, "kind": "exec", "sandboxId": "sb-x-child1"}], "dropped": 0, "lineageMissing": ["sb-x-grand1"]}
        )
        self.assertEqual([(e.sandbox_id, e.seq) for e in t.entries], [("sb-x-parent", 1), ("sb-x-child1", 1)])
        self.assertEqual(t.lineage_missing, ["sb-x-grand1"])
        plain = m.Trajectory.from_wire({"sandboxId": "s", "entries": [{"seq": 1, "kind": "exec"}], "dropped": 0})
        self.assertEqual((plain.entries[0].sandbox_id, plain.lineage_missing), (None, []))

    def test_a_failed_batch_item_becomes_the_error_of_its_code_with_its_index(self) -> None:
        e = calls.batch_failure("batch-abc123", {"type": "failed", "index": 7, "code": "CAPACITY_EXCEEDED", "reason": "the node is full"})
        self.assertIsInstance(e, dsec.CapacityError)
        self.assertEqual((e.message, e.details, e.retryable), ("the node is full", {"batchId": "batch-abc123", "index": 7}, True))
        e = calls.batch_failure("batch-abc123", {"type": "failed", "index": 1})
        self.assertEqual((type(e), e.code), (dsec.ServerError, "SANDBOX_CREATE_FAILED"))

    def test_results_read_camel_case_fields(self) -> None:
        r = dsec.ExecResult.from_wire({"exitCode": 3, "stdout": "AP8=", "stderr": "", "encoding": "base64", "stdoutBytes": 2, "timedOut": True, "durationMs": 4})
        self.assertEqual((r.exit_code, r.stdout, r.stdout_total, r.timed_out, r.ok), (3, b"\x00\xff", 2, True, False))
        info = dsec.SandboxInfo.from_wire({"id": "sb-a-123456", "resources": {"cpu": 1, "memoryMiB": 64, "pids": 8}, "imageId": "sha256:x", "future": 1})
        self.assertEqual((info.resources.memory_mib, info.image_id, info.raw["future"]), (64, "sha256:x", 1))


class PortRequestTest(unittest.TestCase):
    """ports.fetch / ports.url send the caller's method, path and headers: what could split or
    redirect the request is refused before anything is built, naming the field."""

    SB = "sb-x-abcdef"

    def refused(self, field: str, make: Callable[[], Any], says: str) -> None:
        with self.assertRaises(dsec.InvalidRequestError) as cm:
            make()
        self.assertEqual(cm.exception.details, {"field": field}, cm.exception.message)
        self.assertIn(says, cm.exception.message)

    def fetch(self, path: str = "/", method: str = "GET", headers: Optional[Dict[str, str]] = None) -> calls.Op[m.PortResponse]:
        return calls.port_fetch(self.SB, 8080, path, method, None, headers, None)

    def test_a_method_that_is_not_letters_is_refused(self) -> None:
        for method in ("GET /admin HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET", "GE T", "", "G" * 21, "GET\n", "M-SEARCH"):
            self.refused("method", lambda: self.fetch(method=method), "method must be an HTTP method")
        self.refused("method", lambda: self.fetch(method=5), "method must be")  # type: ignore[arg-type]
        self.assertEqual(self.fetch(method="patch").call.method, "PATCH")

    def test_a_header_name_that_is_not_a_token_is_refused(self) -> None:
        for name in ("X Bad", "X:Y", "", "X\r\nInjected", "Ü"):
            self.refused("headers", lambda: self.fetch(headers={name: "v"}), "is not an HTTP token")

    def test_a_header_value_with_cr_lf_or_nul_is_refused(self) -> None:
        for value in ("a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b"):
            self.refused("headers", lambda: self.fetch(headers={"X-Ok": value}), "must not contain CR, LF or NUL")
        self.refused("headers", lambda: self.fetch(headers={"X-Ok": 1}), "must be a str")  # type: ignore[dict-item]

    def test_framing_headers_are_the_clients_own(self) -> None:
        for name in ("Content-Length", "transfer-encoding"):
            self.refused("headers", lambda: self.fetch(headers={name: "0"}), "frames the request")

    def test_a_path_with_control_characters_whitespace_or_a_fragment_is_refused(self) -> None:
        for path in ("/a\r\nX-Injected: 1", "/a b", "/a\tb", "/a\x00", "/a\x7f", "/a\x1b", "/a\u00a0b", "/a?q=x y"):
            self.refused("path", lambda: self.fetch(path), "control characters or whitespace")
        self.refused("path", lambda: self.fetch("/a#frag"), "'#'")

    def test_a_path_with_a_dot_dot_segment_is_refused(self) -> None:
        for path in ("/../x", "..", "/a/..", "/a/../../../other/ports/80/", "/%2e%2e/x", "/.%2E/x", "a/../b?q=1"):
            self.refused("path", lambda: self.fetch(path), "'..' segments")

    def test_ports_url_refuses_what_fetch_refuses(self) -> None:
        ports = dsec.Ports(SyncTransport(ConnectionConfig("http://127.0.0.1:1", "k", 5.0)), self.SB)
        self.refused("path", lambda: ports.url(8080, "/../../x"), "'..' segments")
        self.refused("path", lambda: ports.url(8080, "/a b"), "whitespace")
        self.refused("path", lambda: ports.url(8080, "/a#b"), "'#'")
        self.assertEqual(ports.url(8080, "a/b"), f"http://127.0.0.1:1/v1/sandboxes/{self.SB}/ports/8080/a/b")

    def test_paths_and_headers_that_are_fine_pass_as_given(self) -> None:
        for path in ("/", "/a..b/.c/", "/a/b?next=../x&y=1", "/%20?q=%23"):
            self.assertEqual(self.fetch(path).call.path, f"/v1/sandboxes/{self.SB}/ports/8080{path}")
        op = calls.port_fetch(self.SB, 8080, "/p", "post", b"x", {"content-TYPE": "text/plain", "X-Trace": "a b;c", "Authorization": "no"}, 3.0)
        body, headers = op.call.payload()
        self.assertEqual((op.call.method, body, headers), ("POST", b"x", {"X-Trace": "a b;c", "Content-Type": "text/plain"}))
        self.assertTrue(op.call.passthrough and op.response)

    def test_ports_wait_answers_a_port_wait(self) -> None:
        op = calls.port_wait(self.SB, 8080, 5, None)
        self.assertEqual(op.parse({"port": 8080, "waitedMs": 12.5}), dsec.PortWait(port=8080, waited_ms=12.5))
        self.assertEqual(dsec.PortWait.from_wire({"port": 1}).waited_ms, 0.0)
        self.assertIn("PortWait", dsec.__all__)


class WebSocketCodecTest(unittest.TestCase):
    def test_the_accept_value_of_rfc_6455s_example(self) -> None:
        self.assertEqual(ws.accept_for("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")

    def test_frames_of_every_length_form_round_trip_masked_and_split_anywhere(self) -> None:
        for n in (0, 1, 125, 126, 65535, 65536, 200000):
            data = os.urandom(n)
            frame = ws.encode_frame(ws.OP_BINARY, data)
            self.assertTrue(frame[1] & 0x80, "client frames are masked")
            p = ws.FrameParser()
            got: List[ws.Frame] = []
            for i in range(0, len(frame), 7000):
                got += p.feed(frame[i : i + 7000])
            self.assertEqual([(f.opcode, f.payload) for f in got], [(ws.OP_BINARY, data)], n)

    def test_fragments_are_joined_and_control_frames_pass_between_them(self) -> None:
        first = bytes([0x01, 3]) + b"abc"  # text, not final
        ping = bytes([0x89, 1]) + b"p"
        last = bytes([0x80, 2]) + b"de"  # continuation, final
        frames = ws.FrameParser().feed(first + ping + last)
        self.assertEqual([(f.opcode, f.payload) for f in frames], [(ws.OP_PING, b"p"), (ws.OP_TEXT, b"abcde")])

    def test_reserved_bits_and_stray_continuations_are_protocol_errors(self) -> None:
        with self.assertRaises(ws.ProtocolError):
            ws.FrameParser().feed(bytes([0xC2, 0]))
        with self.assertRaises(ws.ProtocolError):
            ws.FrameParser().feed(bytes([0x80, 0]))


# --- transports against a local HTTP server ---------------------------------------------------


class Seen:
    def __init__(self, method: str, path: str, headers: Dict[str, str], body: bytes, client_port: int) -> None:
        self.method, self.path, self.headers, self.body, self.client_port = method, path, headers, body, client_port


class LocalServer:
    """A loopback HTTP/1.1 server whose answer each test sets (``reply``)."""

    def __init__(self) -> None:
        self.seen: List[Seen] = []
        self.reply: Callable[[BaseHTTPRequestHandler], None] = lambda h: LocalServer.json(h, 200, {"ok": True})
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def handle_one(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, self.client_address[1]))
                outer.reply(self)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out or cancelled has hung up: expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @staticmethod
    def json(h: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def raw(h: BaseHTTPRequestHandler, status: int, body: bytes, headers: Optional[Dict[str, str]] = None) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dsec_error_body(code: str, **details: Any) -> bytes:
    return json.dumps({"error": {"code": code, "message": f"{code} said by dsec", "details": details}}).encode()


#: (status, x-dsec-error or None, body, raises): what ports.fetch makes of each answer.
PASSTHROUGH_CASES = [
    (502, "PORT_NOT_LISTENING", dsec_error_body("PORT_NOT_LISTENING"), True),  # dsec's own: header and body agree
    (502, None, dsec_error_body("PORT_NOT_LISTENING"), False),  # the server's JSON, no header
    (502, "PORT_NOT_LISTENING", b"upstream down\n", False),  # a header the server sent, its own body
    (500, "INTERNAL", dsec_error_body("PORT_NOT_LISTENING"), False),  # header and body disagree
    (500, "INTERNAL", b'{"error": "INTERNAL"}', False),  # no error.code
    (200, "PORT_NOT_LISTENING", dsec_error_body("PORT_NOT_LISTENING"), False),  # not an error status
    (404, None, b"not here", False),
]

EDGE_LOST = {"error": {"code": "EDGE_UNAVAILABLE", "message": "edge e1 is lost", "details": {"retryable": True}}}


def passthrough_reply(status: int, marker: Optional[str], body: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    return lambda h: LocalServer.raw(h, status, body, {"X-Dsec-Error": marker} if marker is not None else {})


def refused_then(refusals: int, then: Callable[[BaseHTTPRequestHandler], None]) -> Callable[[BaseHTTPRequestHandler], None]:
    """A reply that refuses the first ``refusals`` tries with a retryable EDGE_UNAVAILABLE."""
    left = [refusals]

    def reply(h: BaseHTTPRequestHandler) -> None:
        left[0] -= 1
        LocalServer.json(h, 503, EDGE_LOST) if left[0] >= 0 else then(h)

    return reply


def slow_ok(seconds: float) -> Callable[[BaseHTTPRequestHandler], None]:
    def reply(h: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
        LocalServer.json(h, 200, {"ok": True})

    return reply


class SyncTransportTest(unittest.TestCase):
    server: LocalServer

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = LocalServer()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()

    def setUp(self) -> None:
        self.server.seen = []
        self.server.reply = lambda h: LocalServer.json(h, 200, {"ok": True})
        self.t = SyncTransport(ConnectionConfig(self.server.url, "secret-key", 5.0))

    def tearDown(self) -> None:
        self.t.close()

    def test_an_empty_stream_leaves_the_connection_ready_for_the_next_call(self) -> None:
        # An NDJSON answer with no lines comes as Content-Length: 0; read1 alone leaves such a
        # response open, and the kept-alive connection then failed the next call (ResponseNotReady).
        self.server.reply = lambda h: LocalServer.raw(h, 200, b"", {"Content-Type": "application/x-ndjson"})
        self.assertEqual(list(self.t.lines(calls.trajectories({"k": "v"}, None, None, None))), [])
        self.server.reply = lambda h: LocalServer.json(h, 200, {"ok": True})
        self.assertEqual(self.t.content(calls.json_call("POST", "/v1/x", {})), (200, b'{"ok": true}'))
        self.assertEqual(len({s.client_port for s in self.server.seen}), 1, "both calls on one kept-alive connection")

    def test_sends_the_api_key_as_a_bearer_token_and_json_bodies(self) -> None:
        self.t.content(calls.json_call("POST", "/v1/x", {"a": [1, 2]}))
        s = self.server.seen[0]
        self.assertEqual(s.headers["authorization"], "Bearer secret-key")
        self.assertEqual(s.headers["content-type"], "application/json")
        self.assertEqual(json.loads(s.body), {"a": [1, 2]})

    def test_trajectories_stream_each_line_as_an_entry_with_its_sandbox(self) -> None:
        lines = [{"sandboxId": f"sb-x-{i}aaaaa", "seq": s, "at": "2026-01-01T00:00:00Z", "kind": "exec", "request": {"cmd": ["echo", str(s)]}, "exitCode": 0, "replayable": True} for i in (1, 2) for s in (1, 2)]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        self.server.reply = lambda h: LocalServer.raw(h, 200, body, {"Content-Type": "application/x-ndjson"})
        got = list(dsec.Sandbox.trajectories(labels={"run": "7"}, url=self.server.url, api_key="secret-key"))
        self.assertEqual([(e.sandbox_id, e.seq, e.exit_code) for e in got], [(line["sandboxId"], line["seq"], 0) for line in lines])
        self.assertEqual(got[0].request, {"cmd": ["echo", "1"]})
        seen = self.server.seen[-1]
        self.assertEqual((urlsplit(seen.path).path, parse_qs(urlsplit(seen.path).query)), ("/v1/trajectories", {"label": ["run=7"]}))
        self.assertEqual(seen.headers["accept"], "application/x-ndjson")

        async def collect() -> List[m.TrajectoryEntry]:
            return [e async for e in dsec.AsyncSandbox.trajectories(batch="batch-abc123", url=self.server.url, api_key="secret-key")]

        self.assertEqual(len(asyncio.run(collect())), 4)
        self.assertEqual(parse_qs(urlsplit(self.server.seen[-1].path).query), {"batch": ["batch-abc123"]})

    def test_sends_raw_bodies_byte_for_byte_as_octet_stream(self) -> None:
        self.t.content(calls.Call("PUT", "/v1/x", body=bytes([0, 255, 10])))
        self.assertEqual(self.server.seen[0].headers["content-type"], "application/octet-stream")
        self.assertEqual(self.server.seen[0].body, bytes([0, 255, 10]))

    def test_a_retryable_edge_unavailable_is_tried_again_within_the_deadline_and_a_final_one_is_not(self) -> None:
        refusals = [3]
        lost = {"error": {"code": "EDGE_UNAVAILABLE", "message": "edge e1 is lost", "details": {"retryable": True}}}

        def reply(h: BaseHTTPRequestHandler) -> None:
            refusals[0] -= 1
            LocalServer.json(h, 503, lost) if refusals[0] >= 0 else LocalServer.json(h, 200, {"ok": True})

        self.server.reply = reply
        self.assertEqual(self.t.run(calls.Op(calls.json_call("POST", "/v1/x", {"cmd": "true"}), lambda d: d)), {"ok": True})
        self.assertEqual(len(self.server.seen), 4, "three refusals, then the answer")
        self.server.seen = []
        self.server.reply = lambda h: LocalServer.json(h, 503, lost)
        with self.assertRaises(dsec.UnavailableError):
            self.t.run(calls.Op(calls.Call("GET", "/v1/x", timeout=1.2), lambda d: d))
        self.assertTrue(2 <= len(self.server.seen) <= 5, len(self.server.seen))
        self.server.seen = []
        self.server.reply = lambda h: LocalServer.json(h, 503, {"error": {"code": "EDGE_UNAVAILABLE", "message": "unknown", "details": {"retryable": False}}})
        with self.assertRaises(dsec.UnavailableError):
            self.t.run(calls.Op(calls.json_call("POST", "/v1/x", {}), lambda d: d))
        self.assertEqual(len(self.server.seen), 1, "a call that may have reached the edge is not sent again")

    def test_a_call_refused_while_its_sandbox_moves_is_sent_again_once_it_has_moved(self) -> None:
        refusals = [2]
        moving = {"error": {"code": "SANDBOX_MIGRATING", "message": "moving", "details": {"retryable": True, "to": "e2"}}}

        def reply(h: BaseHTTPRequestHandler) -> None:
            refusals[0] -= 1
            LocalServer.json(h, 503, moving) if refusals[0] >= 0 else LocalServer.json(h, 200, {"ok": True})

        self.server.reply = reply
        self.assertEqual(self.t.run(calls.Op(calls.json_call("POST", "/v1/x", {"cmd": "true"}), lambda d: d)), {"ok": True})
        self.assertEqual(len(self.server.seen), 3, "two refusals, then the answer")

    def test_a_migrate_result_reads_back(self) -> None:
        r = m.MigrateResult.from_wire(
            {"sandbox": {"id": "sb-a-bbbbbb", "edge": "e2"}, "from": "e1", "to": "e2", "ms": 412.5, "heldMs": 300.1, "bytes": 10, "endedProcesses": [{"pid": 7, "cmd": "sleep 9"}]}
        )
        self.assertEqual((r.sandbox.edge, r.from_edge, r.to, r.ms, r.held_ms, r.bytes), ("e2", "e1", "e2", 412.5, 300.1, 10))
        self.assertEqual(r.ended_processes, [{"pid": 7, "cmd": "sleep 9"}])

    def test_each_retry_has_the_calls_whole_timeout(self) -> None:
        # Refused twice, then 0.6 s to answer, in a call of 1 s: the third try starts ~0.75 s in
        # and still has its whole second (a command's HTTP deadline never shrinks below its timeoutMs).
        self.server.reply = refused_then(2, slow_ok(0.6))
        self.assertEqual(self.t.run(calls.Op(calls.Call("POST", "/v1/x", timeout=1.0), lambda d: d)), {"ok": True})
        self.assertEqual(len(self.server.seen), 3)

    def test_the_retry_window_is_the_timeout_from_the_first_try(self) -> None:
        self.server.reply = lambda h: LocalServer.json(h, 503, EDGE_LOST)
        start = time.monotonic()
        with self.assertRaises(dsec.UnavailableError):
            self.t.run(calls.Op(calls.Call("GET", "/v1/x", timeout=0.6), lambda d: d))
        # Tries at 0 and 0.25 s; the next would start at 0.75 s, past the window.
        self.assertEqual(len(self.server.seen), 2)
        self.assertLess(time.monotonic() - start, 0.6)

    def test_ports_fetch_raises_only_dsecs_own_errors(self) -> None:
        for status, marker, body, raises in PASSTHROUGH_CASES:
            self.server.reply = passthrough_reply(status, marker, body)
            op = calls.port_fetch("sb-x-abcdef", 8080, "/p", "GET", None, None, 5.0)
            if raises:
                with self.assertRaises(dsec.ServerError) as cm:
                    self.t.run(op)
                self.assertEqual((cm.exception.code, cm.exception.status), (marker, status))
            else:
                r = self.t.run(op)
                self.assertEqual((r.status, r.body, r.headers.get("x-dsec-error")), (status, body, marker), (status, marker, body))

    def test_ports_fetch_is_never_retried(self) -> None:
        self.server.reply = passthrough_reply(503, "EDGE_UNAVAILABLE", json.dumps(EDGE_LOST).encode())
        with self.assertRaises(dsec.UnavailableError):
            self.t.run(calls.port_fetch("sb-x-abcdef", 8080, "/p", "GET", None, None, 5.0))
        self.assertEqual(len(self.server.seen), 1)

    def test_a_wire_error_becomes_the_class_of_its_code_with_message_and_details(self) -> None:
        self.server.reply = lambda h: LocalServer.json(h, 404, {"error": {"code": "SANDBOX_NOT_FOUND", "message": "no sandbox x", "details": {"id": "x"}}})
        with self.assertRaises(dsec.NotFoundError) as cm:
            self.t.run(calls.get("sb-x-abcdef", None))
        e = cm.exception
        self.assertEqual((e.code, e.message, e.status, e.details), ("SANDBOX_NOT_FOUND", "no sandbox x", 404, {"id": "x"}))

    def test_a_204_answers_none(self) -> None:
        def reply(h: BaseHTTPRequestHandler) -> None:
            h.send_response(204)
            h.end_headers()

        self.server.reply = reply
        self.assertIsNone(self.t.run(calls.kill("sb-x-abcdef", None)))

    def test_a_call_slower_than_its_timeout_raises_timeout_error(self) -> None:
        self.server.reply = lambda h: (time.sleep(1.0), LocalServer.json(h, 200, {}))  # type: ignore[func-returns-value]
        with self.assertRaises(dsec.TimeoutError) as cm:
            self.t.run(calls.Op(calls.Call("GET", "/v1/slow", timeout=0.2), lambda d: d))
        self.assertEqual(cm.exception.code, "TIMEOUT")

    def test_a_server_that_is_not_there_raises_unreachable(self) -> None:
        t = SyncTransport(ConnectionConfig("http://127.0.0.1:1", "k", 5.0))
        with self.assertRaises(dsec.UnreachableError) as cm:
            t.run(calls.get("sb-x-abcdef", None))
        self.assertEqual(cm.exception.code, "UNREACHABLE")

    def test_consecutive_calls_reuse_one_kept_alive_connection(self) -> None:
        for _ in range(3):
            self.t.run(calls.Op(calls.Call("GET", "/v1/x"), lambda d: d))
        self.assertEqual(len({s.client_port for s in self.server.seen}), 1)

    def test_ndjson_lines_arrive_as_objects_even_when_split_across_chunks(self) -> None:
        def reply(h: BaseHTTPRequestHandler) -> None:
            h.send_response(200)
            h.send_header("Content-Type", calls.NDJSON)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for part in (b'{"type":"start"}\n{"type":"std', b'out","data":"aGk="}\n', b'{"type":"exit","exitCode":0}\n'):
                h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")

        self.server.reply = reply
        lines = list(self.t.lines(calls.exec_stream("sb-x-abcdef", {"cmd": "x"}, 5)))
        self.assertEqual([ln["type"] for ln in lines], ["start", "stdout", "exit"])
        self.assertEqual(self.server.seen[0].headers["accept"], calls.NDJSON)


class AsyncTransportTest(unittest.IsolatedAsyncioTestCase):
    server: LocalServer

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = LocalServer()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()

    async def asyncSetUp(self) -> None:
        self.server.seen = []
        self.server.reply = lambda h: LocalServer.json(h, 200, {"ok": True})
        self.t = AsyncTransport(ConnectionConfig(self.server.url, "secret-key", 5.0))

    async def asyncTearDown(self) -> None:
        await self.t.aclose()

    async def test_bearer_json_body_and_keep_alive(self) -> None:
        for _ in range(3):
            await self.t.content(calls.json_call("POST", "/v1/x", {"a": 1}))
        self.assertEqual(self.server.seen[0].headers["authorization"], "Bearer secret-key")
        self.assertEqual(json.loads(self.server.seen[0].body), {"a": 1})
        self.assertEqual(len({s.client_port for s in self.server.seen}), 1)

    async def test_a_wire_error_maps_by_code(self) -> None:
        self.server.reply = lambda h: LocalServer.json(h, 503, {"error": {"code": "CAPACITY_EXCEEDED", "message": "full", "details": {}}})
        with self.assertRaises(dsec.CapacityError) as cm:
            await self.t.run(calls.get("sb-x-abcdef", None))
        self.assertTrue(cm.exception.retryable)

    async def test_a_call_slower_than_its_timeout_raises_timeout_error(self) -> None:
        self.server.reply = lambda h: (time.sleep(1.0), LocalServer.json(h, 200, {}))  # type: ignore[func-returns-value]
        with self.assertRaises(dsec.TimeoutError):
            await self.t.run(calls.Op(calls.Call("GET", "/v1/slow", timeout=0.2), lambda d: d))

    async def test_a_204_has_no_body_to_wait_for(self) -> None:
        def reply(h: BaseHTTPRequestHandler) -> None:
            h.send_response(204)
            h.end_headers()

        self.server.reply = reply
        self.assertIsNone(await self.t.run(calls.kill("sb-x-abcdef", 2.0)))

    async def test_cancelling_the_task_cancels_the_call(self) -> None:
        self.server.reply = lambda h: (time.sleep(1.0), LocalServer.json(h, 200, {}))  # type: ignore[func-returns-value]
        task = asyncio.ensure_future(self.t.run(calls.get("sb-x-abcdef", None)))
        await asyncio.sleep(0.1)
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        self.assertEqual(self.t._idle, [], "a cancelled call's connection is closed, not pooled")

    async def test_a_retryable_edge_unavailable_is_tried_again_and_each_try_has_the_whole_timeout(self) -> None:
        self.server.reply = refused_then(2, slow_ok(0.6))
        self.assertEqual(await self.t.run(calls.Op(calls.Call("POST", "/v1/x", timeout=1.0), lambda d: d)), {"ok": True})
        self.assertEqual(len(self.server.seen), 3, "two refusals (0.25 s, 0.5 s pauses), then a try that takes 0.6 s of its 1 s")

    async def test_the_retry_window_is_the_timeout_from_the_first_try(self) -> None:
        self.server.reply = lambda h: LocalServer.json(h, 503, EDGE_LOST)
        start = time.monotonic()
        with self.assertRaises(dsec.UnavailableError):
            await self.t.run(calls.Op(calls.Call("GET", "/v1/x", timeout=0.6), lambda d: d))
        self.assertEqual(len(self.server.seen), 2)
        self.assertLess(time.monotonic() - start, 0.6)

    async def test_ports_fetch_raises_only_dsecs_own_errors(self) -> None:
        for status, marker, body, raises in PASSTHROUGH_CASES:
            self.server.reply = passthrough_reply(status, marker, body)
            op = calls.port_fetch("sb-x-abcdef", 8080, "/p", "GET", None, None, 5.0)
            if raises:
                with self.assertRaises(dsec.ServerError) as cm:
                    await self.t.run(op)
                self.assertEqual((cm.exception.code, cm.exception.status), (marker, status))
            else:
                r = await self.t.run(op)
                self.assertEqual((r.status, r.body, r.headers.get("x-dsec-error")), (status, body, marker), (status, marker, body))

    async def test_ports_fetch_is_never_retried(self) -> None:
        self.server.reply = passthrough_reply(503, "EDGE_UNAVAILABLE", json.dumps(EDGE_LOST).encode())
        with self.assertRaises(dsec.UnavailableError):
            await self.t.run(calls.port_fetch("sb-x-abcdef", 8080, "/p", "GET", None, None, 5.0))
        self.assertEqual(len(self.server.seen), 1)



# --- the gym environment, over a fake sandbox -------------------------------------------------


class FakeSandbox:
    """What SandboxEnv uses of a Sandbox, recording each call. ``links``: what ``readlink -f``
    prints per path (default: the path itself); ``unresolvable``: paths where it fails."""

    def __init__(self, id: str, links: Optional[Dict[str, str]] = None, unresolvable: Any = (), grader: Optional["FakeSandbox"] = None) -> None:
        self.id, self.links, self.unresolvable, self.grader = id, links or {}, set(unresolvable), grader
        self.log: List[Any] = []
        self.killed = False
        self.fork_failures: List[m.ForkFailure] = []
        self.run_raises: Optional[BaseException] = None
        outer = self

        class Files:
            def mkdir(self, path: str) -> None:
                outer.log.append(("mkdir", path))

            def write(self, path: str, data: Any) -> None:
                outer.log.append(("write", path, data))

        class Commands:
            def run(self, cmd: Any, **kw: Any) -> m.ExecResult:
                outer.log.append(("run", cmd, kw))
                if outer.run_raises is not None:
                    raise outer.run_raises
                if isinstance(cmd, list) and cmd[:2] == ["readlink", "-f"]:
                    if cmd[2] in outer.unresolvable:
                        return m.ExecResult(exit_code=1)
                    return m.ExecResult(exit_code=0, stdout=outer.links.get(cmd[2], cmd[2]) + "\n")
                return m.ExecResult(exit_code=0, stdout="ok\n")

        self.files, self.commands = Files(), Commands()

    def set_network(self, mode: str, allow: Any = None) -> None:
        self.log.append(("network", mode))

    def kill(self) -> None:
        self.killed = True

    def fork(self, count: int) -> m.Fork[Any]:
        self.log.append(("fork", count))
        made = [self.grader] if self.grader is not None and not self.fork_failures else []
        return m.Fork(sandboxes=made, snapshot=m.SnapshotResult(image_id="img"), failures=self.fork_failures)


class SandboxEnvUnitTest(unittest.TestCase):
    def env(self) -> gym.SandboxEnv:
        return gym.SandboxEnv(url="http://127.0.0.1:1", api_key="k", max_output_bytes=123)

    def task(self, **kw: Any) -> gym.Task:
        base: Dict[str, Any] = dict(files={"/work/a.sh": "x"}, tests={"t.sh": "exit 0"}, test_cmd="sh /grader/t.sh", writable_paths=["/work", "/tmp"], step_timeout=7.0)
        base.update(kw)
        return gym.Task(**base)

    def test_paths_are_checked_absolute_and_normalised_before_any_sandbox_is_made(self) -> None:
        cases: List[Tuple[Dict[str, Any], str]] = [
            (dict(tests_dir="//work/tests"), "under the writable path /work"),  # normpath alone keeps '//'
            (dict(tests={"//tmp/t.sh": "x"}), "under the writable path /tmp"),
            (dict(tests={"../work/t.sh": "x"}), "under the writable path /work"),
            (dict(tests_dir="/grader/../work/g"), "under the writable path /work"),
            (dict(tests_dir="/dev/shm/grader"), "/dev (always writable)"),
            (dict(tests={"/dev/t.sh": "x"}), "/dev (always writable)"),
            (dict(tests_dir="grader"), "tests_dir must be an absolute path"),
            (dict(writable_paths=["work", "/tmp"]), "writable_paths: each must be an absolute path"),
            (dict(writable_paths=None, workdir="work"), "writable_paths: each must be an absolute path"),
        ]
        env = self.env()
        with mock.patch("dsec.gym.Sandbox.create") as create:
            for kw, says in cases:
                with self.assertRaises(ValueError, msg=str(kw)) as cm:
                    env.reset(self.task(**kw))
                self.assertIn(says, str(cm.exception), kw)
            create.assert_not_called()

    def test_reset_refuses_a_tests_dir_that_resolves_into_a_writable_path_and_kills_the_sandbox(self) -> None:
        sb = FakeSandbox("agent", links={"/grader": "/work/tests"})
        env = self.env()
        with mock.patch("dsec.gym.Sandbox.create", return_value=sb):
            with self.assertRaises(ValueError) as cm:
                env.reset(self.task())
        self.assertIn("resolved in the sandbox to /work/tests", str(cm.exception))
        self.assertTrue(sb.killed)
        self.assertIsNone(env.sandbox)

    def test_reset_resolves_tests_dir_after_the_files_and_setup(self) -> None:
        sb = FakeSandbox("agent")
        env = self.env()
        with mock.patch("dsec.gym.Sandbox.create", return_value=sb):
            env.reset(self.task(setup=["make"]))
        runs = [e[1] for e in sb.log if e[0] == "run"]
        self.assertEqual(runs, ["make", ["readlink", "-f", "/grader"], ["ls", "-la", "/work"]])
        self.assertLess(sb.log.index(("write", "/work/a.sh", "x")), sb.log.index(("run", ["readlink", "-f", "/grader"], {})))
        self.assertFalse(sb.killed)

    def test_resolving_walks_up_to_the_nearest_ancestor_that_resolves(self) -> None:
        sb = FakeSandbox("agent", links={"/a": "/work/a"}, unresolvable={"/a/b/grader", "/a/b"})
        self.assertEqual(gym.SandboxEnv._resolve(sb, "//a/b/grader"), "/work/a/b/grader")  # type: ignore[arg-type]
        env = self.env()
        with mock.patch("dsec.gym.Sandbox.create", return_value=sb):
            with self.assertRaises(ValueError):
                env.reset(self.task(tests_dir="/a/b/grader"))
        self.assertTrue(sb.killed)

    def started(self, agent: FakeSandbox, **kw: Any) -> gym.SandboxEnv:
        env = self.env()
        env.sandbox, env.task, env.steps, env.done = agent, self.task(**kw), 0, False  # type: ignore[assignment]
        return env

    def test_the_tests_run_in_a_fork_of_the_agents_sandbox_which_is_then_killed(self) -> None:
        grader = FakeSandbox("grader")
        agent = FakeSandbox("agent", grader=grader)
        env = self.started(agent, tests={"t.sh": "exit 0", "/opt/check.sh": "true"})
        obs, reward, done, info = env.step(gym.Submit())
        self.assertEqual((reward, done, obs.output), (1.0, True, "ok\n"))
        self.assertEqual((info["sandbox_id"], info["grader_sandbox_id"]), ("agent", "grader"))
        self.assertEqual(agent.log, [("fork", 1)], "nothing is written or run in the agent's sandbox")
        self.assertEqual(grader.log, [
            ("write", "/grader/t.sh", "exit 0"), ("write", "/opt/check.sh", "true"),
            ("run", "sh /grader/t.sh", {"cwd": "/work", "writable_paths": ["/tmp"], "timeout": 7.0, "max_output_bytes": 123}),
        ])  # fmt: skip
        self.assertTrue(grader.killed)
        self.assertFalse(agent.killed, "the agent's sandbox stays until close()")

    def test_a_failed_fork_raises_and_a_failed_test_run_still_kills_the_fork(self) -> None:
        agent = FakeSandbox("agent", grader=FakeSandbox("grader"))
        agent.fork_failures = [m.ForkFailure("CAPACITY_EXCEEDED", "the node is full")]
        with self.assertRaises(RuntimeError) as cm:
            self.started(agent).step(gym.Submit())
        self.assertIn("CAPACITY_EXCEEDED: the node is full", str(cm.exception))
        grader = FakeSandbox("grader")
        grader.run_raises = dsec.TimeoutError("too slow", "TIMEOUT")
        with self.assertRaises(dsec.TimeoutError):
            self.started(FakeSandbox("agent", grader=grader)).step(gym.Submit())
        self.assertTrue(grader.killed)


class FacesTest(unittest.TestCase):
    """The sync and asyncio clients are two faces over client.py: the same calls, with the same
    parameters, blocking in one and awaited in the other."""

    PAIRS = [
        (dsec.Sandbox, dsec.AsyncSandbox),
        (dsec.Commands, dsec.AsyncCommands),
        (dsec.Process, dsec.AsyncProcess),
        (dsec.Sessions, dsec.AsyncSessions),
        (dsec.Session, dsec.AsyncSession),
        (dsec.Files, dsec.AsyncFiles),
        (dsec.Ports, dsec.AsyncPorts),
        (dsec.Volume, dsec.AsyncVolume),
        (dsec.Image, dsec.AsyncImage),
        (dsec.Pool, dsec.AsyncPool),
    ]

    @staticmethod
    def public(cls: type) -> Dict[str, Any]:
        return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    def test_both_faces_have_the_same_calls_with_the_same_parameters(self) -> None:
        for sync_cls, async_cls in self.PAIRS:
            sync_calls, async_calls = self.public(sync_cls), self.public(async_cls)
            self.assertEqual(sorted(sync_calls), sorted(async_calls), sync_cls.__name__)
            for name, f in sync_calls.items():
                params = [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(f).parameters.values()]
                async_params = [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(async_calls[name]).parameters.values()]
                self.assertEqual(params, async_params, f"{sync_cls.__name__}.{name}")
                self.assertEqual(f.__name__, name)
                self.assertTrue(f.__doc__, f"{sync_cls.__name__}.{name} has a docstring")

    def test_sync_calls_block_and_async_calls_are_awaited(self) -> None:
        streams = {"stream", "follow", "iter_create_many", "trajectories", "iterate"}
        pure = {"url"}  # ports.url builds a string: nothing to await
        for sync_cls, async_cls in self.PAIRS:
            for name, f in self.public(sync_cls).items():
                self.assertFalse(inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f), f"{sync_cls.__name__}.{name}")
            for name, f in self.public(async_cls).items():
                if name in streams or name in pure:
                    continue
                self.assertTrue(inspect.iscoroutinefunction(f), f"{async_cls.__name__}.{name}")

    def test_a_sync_call_runs_without_an_event_loop_and_refuses_to_suspend(self) -> None:
        async def done() -> int:
            return 7

        self.assertEqual(sandbox_face.run_sync(done()), 7)

        async def suspends() -> None:
            await asyncio.sleep(0)

        with self.assertRaises(RuntimeError):
            sandbox_face.run_sync(suspends())

    def test_leaving_a_sync_stream_early_runs_its_clean_up(self) -> None:
        cleaned: List[str] = []

        async def numbers() -> AsyncIterator[int]:
            try:
                for i in range(10):
                    yield i
            finally:
                cleaned.append("closed")

        for i in sandbox_face.iterate_sync(numbers()):
            if i == 2:
                break
        self.assertEqual(cleaned, ["closed"])

if __name__ == "__main__":
    unittest.main()

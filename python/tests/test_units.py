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
from typing import Any, AsyncIterator, Callable, Dict, List, Optional
from unittest import mock
from urllib.parse import parse_qs, urlsplit

import dsec
from dsec import calls, errors
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
        expected = {"CAPACITY_EXCEEDED", "NODE_MEMORY_PRESSURE", "EDGE_UNAVAILABLE", "REGISTRY_UNAVAILABLE", "QUOTA_CREATE_RATE_EXCEEDED"}
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

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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

    def test_sends_the_api_key_as_a_bearer_token_and_json_bodies(self) -> None:
        self.t.content(calls.json_call("POST", "/v1/x", {"a": [1, 2]}))
        s = self.server.seen[0]
        self.assertEqual(s.headers["authorization"], "Bearer secret-key")
        self.assertEqual(s.headers["content-type"], "application/json")
        self.assertEqual(json.loads(s.body), {"a": [1, 2]})

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
        streams = {"stream", "follow", "iter_create_many"}
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

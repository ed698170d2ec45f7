"""The dispatcher's HTTP/1.1 transport against real sockets: answers, keep-alive, and above
all which failure is which — the call classification depends on it (dispatcher.classify)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import uvloop

from devstack.postgres_tls import CertificateAuthority
from dispatcher.classify import RETRYABLE, UNCERTAIN, classify_failure
from dispatcher.http11 import Http11Transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Serve = Callable[..., Awaitable[tuple["Server", str]]]


class Server:
    """A loopback TCP server running ``handler`` per connection, counting connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def start(self, tls: ssl.SSLContext | None = None) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader, server: Server) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length)
    server.requests.append(head + body)
    return body


def answering(*answers: bytes, then_close: bool = False) -> Callable[[Server], Handler]:
    """Each connection: read a request and write the next answer, for every answer."""

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader, server)
                index = min(len(server.requests), len(answers)) - 1
                writer.write(answers[index])
                await writer.drain()
                if then_close:
                    return

        return handler

    return make


OK = (
    b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n"
    b'{"a": 1}\n'
)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[Server] = []

    async def start(
        make: Callable[[Server], Handler], tls: ssl.SSLContext | None = None
    ) -> tuple[Server, str]:
        server = Server(lambda r, w: asyncio.sleep(0))
        server.handler = make(server)
        servers.append(server)
        return server, await server.start(tls)

    yield start
    for server in servers:
        await server.close()


def client(
    *,
    ssl_context: ssl.SSLContext | None = None,
    keepalive_expiry: float = 4.0,
    monotonic: Callable[[], float] = time.monotonic,
) -> httpx.AsyncClient:
    timeout = httpx.Timeout(connect=1.0, read=0.5, write=1.0, pool=0.5)
    transport = Http11Transport(
        ssl_context=ssl_context, keepalive_expiry=keepalive_expiry, monotonic=monotonic
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout)


async def test_an_answer_comes_back_whole_and_the_connection_is_kept(serve: Serve) -> None:
    server, url = await serve(answering(OK))
    async with client() as http:
        first = await http.post(f"{url}/v1/messages?x=1", content=b'{"n": 1}')
        second = await http.post(f"{url}/v1/messages", content=b'{"n": 2}')
    assert (first.status_code, first.json()) == (202, {"a": 1})
    assert second.headers["content-type"] == "application/json"
    assert server.connections == 1
    assert server.requests[0].startswith(b"POST /v1/messages?x=1 HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"n": 1}')
    assert b"\r\nidempotency" not in server.requests[0].lower()


async def test_chunked_and_close_delimited_bodies_are_read(serve: Serve) -> None:
    chunked = (
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"b"\r\n4\r\n: 2}\r\n0\r\n\r\n'
    )
    until_close = b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"c": 3}'
    _, url = await serve(answering(chunked))
    closing, closing_url = await serve(answering(until_close, then_close=True))
    async with client() as http:
        assert (await http.get(url)).json() == {"b": 2}
        assert (await http.get(closing_url)).json() == {"c": 3}
        assert (await http.get(closing_url)).json() == {"c": 3}
    assert closing.connections == 2  # "Connection: close" is honoured


async def test_an_interim_answer_is_skipped(serve: Serve) -> None:
    _, url = await serve(answering(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK))
    async with client() as http:
        assert (await http.post(url, content=b"{}")).status_code == 202


async def test_a_connection_the_product_closed_while_idle_is_not_used_again(serve: Serve) -> None:
    server, url = await serve(answering(OK, then_close=True))
    async with client() as http:
        await http.post(url, content=b"{}")
        # Let the end of stream arrive; the next request must open a new connection
        # rather than write into the closed one (that would look uncertain).
        for _ in range(20):
            await asyncio.sleep(0)
        assert (await http.post(url, content=b"{}")).status_code == 202
    assert server.connections == 2


async def test_a_close_not_yet_seen_by_the_event_loop_is_found_before_writing() -> None:
    # The product (in a thread of its own) answers once and closes; the client asks again
    # before its event loop has had a turn to notice. The socket itself is asked then.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    closed = threading.Event()
    accepted: list[int] = []

    def product() -> None:
        while len(accepted) < 2:
            conn, _ = listener.accept()
            accepted.append(1)
            with conn:
                data = b""
                while not data.endswith(b"{}"):
                    data += conn.recv(4096)
                conn.sendall(OK)
            closed.set()

    thread = threading.Thread(target=product, daemon=True)
    thread.start()
    try:
        async with client() as http:
            await http.post(f"http://127.0.0.1:{port}/", content=b"{}")
            # Blocking, so the event loop gets no turn; on loopback the end of stream is in
            # this side's socket once the product's close returned.
            assert closed.wait(5)
            assert (await http.post(f"http://127.0.0.1:{port}/", content=b"{}")).status_code == 202
    finally:
        thread.join(5)
        listener.close()
    assert len(accepted) == 2


async def test_a_connection_idle_past_the_expiry_is_replaced(serve: Serve) -> None:
    server, url = await serve(answering(OK))
    now = [100.0]
    async with client(keepalive_expiry=4.0, monotonic=lambda: now[0]) as http:
        await http.post(url, content=b"{}")
        now[0] += 3.9
        await http.post(url, content=b"{}")
        assert server.connections == 1
        now[0] += 4.0
        await http.post(url, content=b"{}")
    assert server.connections == 2


async def test_nothing_listening_is_a_connect_error_and_retryable() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with client() as http:
        with pytest.raises(httpx.ConnectError) as caught:
            await http.post(f"http://127.0.0.1:{port}/", content=b"{}")
    assert classify_failure(caught.value).result == RETRYABLE


async def test_an_unsupported_scheme_sends_nothing() -> None:
    async with client() as http:
        with pytest.raises(httpx.UnsupportedProtocol) as caught:
            await http.post("ftp://127.0.0.1/", content=b"{}")
    assert classify_failure(caught.value).result == RETRYABLE


async def test_no_answer_in_time_is_a_read_timeout_and_uncertain(serve: Serve) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader, server)
            await asyncio.sleep(5)

        return handler

    server, url = await serve(make)
    async with client() as http:
        with pytest.raises(httpx.ReadTimeout) as caught:
            await http.post(url, content=b"{}")
    assert server.requests  # it arrived: whether it was processed is unknown
    assert classify_failure(caught.value).result == UNCERTAIN


@pytest.mark.parametrize(
    "partial",
    [b"", b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"a"', b"HTTP/1.1 200 OK\r\nConte"],
)
async def test_a_connection_closed_after_the_request_is_uncertain(
    serve: Serve, partial: bytes
) -> None:
    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader, server)
            writer.write(partial)
            await writer.drain()

        return handler

    _, url = await serve(make)
    async with client() as http:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await http.post(url, content=b"{}")
    assert classify_failure(caught.value).result == UNCERTAIN


async def test_garbage_instead_of_an_answer_is_uncertain(serve: Serve) -> None:
    _, url = await serve(answering(b"SMTP ready\r\n\r\n"))
    async with client() as http:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await http.post(url, content=b"{}")
    assert classify_failure(caught.value).result == UNCERTAIN


async def test_requests_beyond_the_pool_wait_for_a_connection_given_back(serve: Serve) -> None:
    server, url = await serve(answering(OK))
    timeout = httpx.Timeout(connect=1.0, read=1.0, write=1.0, pool=2.0)
    transport = Http11Transport(max_connections=2)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as http:
        answers = await asyncio.gather(*(http.post(url, content=b"{}") for _ in range(7)))
    assert [a.status_code for a in answers] == [202] * 7
    assert server.connections == 2  # the waiting requests reused the two kept connections


async def test_a_full_pool_waits_then_times_out_without_sending(serve: Serve) -> None:
    release = asyncio.Event()

    def make(server: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader, server)
            await release.wait()
            writer.write(OK)
            await writer.drain()

        return handler

    server, url = await serve(make)
    timeout = httpx.Timeout(connect=1.0, read=5.0, write=1.0, pool=0.2)
    transport = Http11Transport(max_connections=1)
    async with httpx.AsyncClient(transport=transport, timeout=timeout) as http:
        busy = asyncio.create_task(http.post(url, content=b"{}"))
        while not server.requests:
            await asyncio.sleep(0.01)
        with pytest.raises(httpx.PoolTimeout) as caught:
            await http.post(url, content=b"{}")
        release.set()
        assert (await busy).status_code == 202
    assert len(server.requests) == 1
    assert classify_failure(caught.value).result == RETRYABLE


async def test_https_verifies_the_product_certificate(serve: Serve, tmp_path: Path) -> None:
    authority = CertificateAuthority.create()
    cert_pem, key_pem = authority.issue_server(("127.0.0.1",))
    (tmp_path / "server.crt").write_bytes(cert_pem)
    (tmp_path / "server.key").write_bytes(key_pem)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    _, url = await serve(answering(OK), tls=server_tls)

    trusting = ssl.create_default_context(cadata=authority.pem.decode())
    async with client(ssl_context=trusting) as http:
        assert (await http.post(url, content=b"{}")).status_code == 202
    # A certificate nobody trusts: the connection is never made, so nothing was sent.
    async with client(ssl_context=ssl.create_default_context()) as http:
        with pytest.raises(httpx.ConnectError) as caught:
            await http.post(url, content=b"{}")
    assert classify_failure(caught.value).result == RETRYABLE


def test_the_transport_works_on_uvloop_as_the_components_run_it() -> None:
    async def exchange() -> tuple[int, int]:
        server = Server(lambda r, w: asyncio.sleep(0))
        server.handler = answering(OK)(server)
        url = await server.start()
        try:
            async with client() as http:
                await http.post(url, content=b"{}")
                answer = await http.post(url, content=b"{}")
        finally:
            await server.close()
        return answer.status_code, server.connections

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(exchange()) == (202, 1)


async def test_a_header_with_a_line_break_is_never_written(serve: Serve) -> None:
    server, url = await serve(answering(OK))
    async with client() as http:
        with pytest.raises(httpx.LocalProtocolError):
            await http.post(url, content=b"{}", headers={"X-Note": "a\r\nX-Forged: 1"})
    assert server.requests == []

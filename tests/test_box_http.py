"""The execd endpoint's HTTP request reader, fed bytes as a socket would give them: a request split
anywhere reads the same, what follows it is kept, and every refusal names what was wrong."""

from __future__ import annotations

import pytest

from owsandbox.box.execd.http import MAX_BODY_BYTES, MAX_HEAD_BYTES, HttpError, RequestReader, http_response

pytestmark = pytest.mark.unit

POST = (b"POST /pty?x=1&x=2 HTTP/1.1\r\nHost: box\r\nX-Execd-Access-Token: t\r\nContent-Length: 11\r\n\r\n"
        b'{"cwd":"a"}' b"\x81\x00")


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(POST)])
def test_a_request_split_anywhere_reads_the_same(size: int) -> None:
    reader = RequestReader()
    for start in range(0, len(POST), size):
        reader.feed(POST[start:start + size])
    request = reader.request
    assert request is not None and request.method == "POST" and request.path == "/pty"
    assert request.query == {"x": "2"} and request.header("x-execd-access-token") == "t"
    assert request.body == b'{"cwd":"a"}' and reader.rest == b"\x81\x00"  # a WebSocket's first frame
    assert not reader.wants_continue


def test_a_client_that_waits_for_continue_is_told_once() -> None:
    reader = RequestReader()
    reader.feed(b"POST /pty HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert reader.wants_continue and reader.request is None and reader.head_read
    reader.wants_continue = False
    reader.feed(b"{}")
    assert reader.request is not None and reader.request.body == b"{}" and not reader.wants_continue


@pytest.mark.parametrize("data, said", [
    (b"GET /pty HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "Transfer-Encoding is not supported"),
    (b"GET /pty HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n", "malformed Content-Length"),
    (b"GET /pty HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1), "larger than the limit"),
    (b"GET pty HTTP/1.1\r\n\r\n", "must be a path"),
    (b"GET /pty HTTP/2\r\n\r\n", "malformed request line"),
    (b"GET /pty HTTP/1.1\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"GET /pty HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 1), "request head is larger"),
])
def test_refusals_name_what_was_wrong(data: bytes, said: str) -> None:
    with pytest.raises(HttpError) as refused:
        RequestReader().feed(data)
    assert refused.value.status == 400 and said in refused.value.body["message"]


def test_an_answer_says_its_length_and_closes() -> None:
    answer = http_response(404, {"code": "NOT_FOUND"})
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n") and b"Content-Length: %d" % len(body) in head
    assert b"Connection: close" in head and body == b'{"code": "NOT_FOUND"}'

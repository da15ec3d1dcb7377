"""The HTTP protocol the service runs under uvicorn: httptools' parser where installed (the
``serve`` extra; a C parser, less server CPU per small request than the
pure-Python h11), else h11, and in both a request that is not HTTP (a broken request line,
a control character in a header) refused with one line of JSON like every other refusal,
where uvicorn answers such a request in plain text.

Which requests are "not HTTP" is the parser's call: httptools follows RFC 9110 strictly
(a DEL or other control character in a header value is refused), h11 lets some through to
the application, which then refuses them itself (a malformed ``Idempotency-Key``: 422).
Either way nothing of such a request is certified, charged or released.
"""

from __future__ import annotations

import json


def _refusal(reason: str) -> bytes:
    body = json.dumps({"detail": f"malformed HTTP request ({reason.rstrip('.')}); nothing "
                                 f"was read or charged"}).encode()
    head = (f"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
    return head + body


class _JsonRefusal:
    """Mixin over a uvicorn HTTP protocol: its one plain-text answer, to a request its
    parser cannot read, is written as JSON instead (the connection closes after it, as
    uvicorn's does, so the parser's state needs no update)."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_refusal(msg))
        self.transport.close()


def http_protocol() -> type:
    """The protocol class to pass as uvicorn's ``http``: httptools' where it imports, else
    h11's, each with JSON refusals of unreadable requests."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:           # no httptools: uvicorn's own h11 protocol
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type(f"Json{base.__name__}", (_JsonRefusal, base), {})

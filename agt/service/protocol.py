"""The HTTP protocol the service runs under uvicorn: uvicorn's h11 protocol, with a request
that is not HTTP (a broken request line, a control character in a header name, a request
head over h11's 16 KiB bound) refused with one line of JSON like every other refusal, where
uvicorn answers such a request in plain text.

h11 rather than httptools, deliberately, even where httptools is installed: httptools'
parser took about a fifth less server CPU per single-query request here, but under uvicorn
it bounds no request head (a client sent hundreds of MiB of one header before any key
check) and closes a connection on an unreadable request at once, dropping the answer to a
valid request pipelined before it after that answer was charged (adversarial review).
h11 reads one request at a time and refuses an endless head. Nothing of a refused request
is certified, charged or released.
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
    """Mixin over uvicorn's h11 protocol: its one plain-text answer, to a request its parser
    cannot read, is written as JSON instead (the connection closes after it, as uvicorn's
    does, so the parser's state needs no update)."""

    def send_400_response(self, msg: str) -> None:
        self.transport.write(_refusal(msg))
        self.transport.close()


def http_protocol() -> type:
    """The protocol class to pass as uvicorn's ``http``.

    Returns:
        uvicorn's h11 protocol with JSON refusals of unreadable requests.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return type("JsonH11Protocol", (_JsonRefusal, H11Protocol), {})

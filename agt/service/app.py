"""The HTTP layer of the prediction service (FastAPI): authentication, limits, JSON.

Endpoints (JSON under /v1; the OpenAPI schema at /openapi.json):

* ``POST /v1/predict`` (client or owner key): ``{"queries": [q, ...]}``, each q an array of
  the model's input shape. Returns the labels (``null`` where the mechanism gave no
  answer), which came from earlier releases (``cached``: at no charge), and the guarantee.
  An optional ``Idempotency-Key`` header (1-255 printable ASCII characters) makes a retry
  of the same request get the same answer, charged once (422 for the same key with other
  queries).
* ``GET /v1/budget`` (client or owner key): the caller's own spend and what remains to it
  and to the dataset.
* ``GET /v1/info`` (public): the mechanism, relation, input shape, classes and guarantee.
* ``GET /healthz`` (public): 200 ``{"status": "ok", "ready": true}`` once the model answered
  its warm-up query, 503 ``{"status": "starting", "ready": false}`` before.
* ``POST /v1/owner/radii`` and ``GET /v1/owner/ledger`` (owner key): the queries' radii and
  the ledger's entries. Owner-only: nothing a client receives depends on the private data
  except through the mechanism.
* ``GET /owner`` and ``POST /owner`` (owner key, in a header or posted by the page's form,
  never in the URL): the owner's page (`agt.service.owner_page`).

Status codes: 400 malformed JSON or a wrong JSON type, 401 a missing or unknown key, 403 a
client on an owner endpoint, 413 a body or a request over the limits, 422 queries of the
wrong shape, with a NaN or infinite value or outside the declared domain (and a bad query
parameter), 429 a request over the client's or the dataset's budget (with what remains;
nothing charged, nothing released), 503 a ledger that cannot be written or more requests at
once than ``max_connections``. Every refusal is one line of JSON ``{"detail": "..."}``
(documented per endpoint in the OpenAPI schema), charges nothing and draws nothing; the key
is checked before anything else of the request.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from agt.errors import BudgetExceededError, DataError, PrivacyError
from agt.service import owner_page
from agt.service.keys import KeyRecord, KeyStore, Principal
from agt.service.server import PredictionService
from mechanisms.ledger.records import idempotency_key_problem

try:                       # the serve extra's fast JSON reader and writer
    import orjson
except ImportError:        # pragma: no cover - the standard library's, slower
    orjson = None

#: defaults of the request limits
MAX_BODY_BYTES = 8 << 20
MAX_QUERIES = 10_000
MAX_CONNECTIONS = 256


class RefusalBody(BaseModel):
    """Every refusal: one line saying what to change."""

    detail: str


class BudgetRefusalBody(BaseModel):
    """A request over a budget (429): what remains to the caller and to the dataset, as in
    ``/v1/budget`` (null where the caller's key has no budget of its own)."""

    detail: str
    remaining: dict | None = None


_REASONS = {
    400: "malformed JSON, or a body that is not {\"queries\": [...]}",
    401: "a missing, unknown or revoked key",
    403: "a client's key on an owner endpoint",
    413: "a body over the byte limit or more queries than one request may hold",
    422: "queries of the wrong shape, with a NaN or infinite value or outside the declared "
         "input domain; a query parameter out of range",
    429: "over the client's or the dataset's budget: nothing charged, nothing released",
    503: "the ledger cannot be used now, the model is still warming up (healthz), or more "
         "requests at once than the server takes; try again later",
}


def _refusals(*statuses: int) -> dict:
    """OpenAPI ``responses`` for these refusal statuses (503 is possible on every path)."""
    out = {}
    for status in (*statuses, 503):
        model = BudgetRefusalBody if status == 429 else RefusalBody
        out[status] = {"model": model, "description": _REASONS[status]}
    return out


def _query_schema(input_shape: tuple[int, ...]) -> dict:
    """JSON schema of one query: arrays nested to the model's input shape, of numbers."""
    schema: dict = {"type": "number"}
    for size in reversed(input_shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


def _queries_body(input_shape: tuple[int, ...], max_queries: int) -> dict:
    """The OpenAPI request body of /v1/predict and /v1/owner/radii for this instance."""
    return {
        "required": True,
        "content": {"application/json": {"schema": {
            "type": "object", "required": ["queries"], "additionalProperties": False,
            "properties": {"queries": {
                # the count limit is not maxItems: over it is 413 (like a body over the byte
                # limit), where a schema violation would be 400 or 422
                "type": "array", "minItems": 1,
                "description": f"queries, each an array of shape {list(input_shape)} of "
                               f"finite numbers (inside the declared input domain, if any); "
                               f"at most {int(max_queries)} per request (more: 413)",
                "items": _query_schema(input_shape)}}}}}}


_PREDICTION_SCHEMA = {"type": "object", "required": ["labels", "cached", "guarantee", "charged"],
                      "properties": {
                          "labels": {"type": "array", "items": {"type": ["integer", "null"]}},
                          "cached": {"type": "array", "items": {"type": "boolean"}},
                          "guarantee": {"type": "object"}, "charged": {"type": "object"},
                          "session": {"type": "object"}}}


class _ConcurrencyLimit:
    """ASGI middleware: at most `limit` HTTP requests served at once; one more is answered
    503 with a JSON body at once (uvicorn's own limit answers in plain text)."""

    def __init__(self, app, limit: int):
        self.app, self.limit, self.active = app, int(limit), 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            busy = JSONResponse({"detail": f"the server is serving {self.limit} requests at "
                                           f"once; try again in a moment"},
                                status_code=503, headers={"retry-after": "1"})
            await busy(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class _Keys:
    """The keys file, read again when it changes on disk (a key added or revoked while the
    service runs takes effect at the next request)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._stamp = None
        self._store = None
        self.reload()

    def reload(self) -> None:
        stat = os.stat(self.path)
        stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if stamp != self._stamp:
            self._store = KeyStore.load(self.path)
            self._stamp = stamp

    def authenticate(self, key: str | None) -> Principal | None:
        try:
            self.reload()
        except (OSError, ValueError):
            # a keys file removed or damaged while serving admits no one (an operator who
            # deletes it means to cut access) until it is valid again
            self._stamp = None
            return None
        return self._store.authenticate(key)

    def records(self) -> list[KeyRecord]:
        """The stored keys (never a key itself), as last read."""
        return [] if self._store is None else list(self._store.records)


def create_app(service: PredictionService, keys_path, *,
               max_body_bytes: int = MAX_BODY_BYTES, max_queries: int = MAX_QUERIES,
               max_connections: int = MAX_CONNECTIONS):
    """The FastAPI application serving ``service`` to the keys of ``keys_path``.

    Args:
        service: the prediction service (`PredictionService`).
        keys_path: the keys file (`agt keys add`), or a key store with an
            ``authenticate(key)`` method (`agt.service.keys.LedgerKeyStore`: the keys of a
            PostgreSQL ledger, shared by replicas).
        max_body_bytes: the largest request body accepted.
        max_queries: the most queries one request may hold.
        max_connections: the most requests served at once (one more gets a JSON 503).

    Returns:
        A FastAPI application (run it with uvicorn).
    """
    keys = keys_path if hasattr(keys_path, "authenticate") else _Keys(keys_path)
    # a keys file is checked on the event loop (a stat and one hash per stored key: cheaper
    # than handing each request to a worker thread and back); a key store that asks a
    # database (a PostgreSQL ledger's keys) is asked from the thread pool, so that a slow
    # database never stalls the other requests
    keys_block = not isinstance(keys, _Keys)

    async def authenticate(key: str | None) -> Principal | None:
        if keys_block:
            return await run_in_threadpool(keys.authenticate, key)
        return keys.authenticate(key)

    @asynccontextmanager
    async def lifespan(app):
        yield
        service.close()            # the queued requests are answered first

    app = FastAPI(title="agt prediction service", version=_version(), lifespan=lifespan,
                  description="Private predictions through the privacy ledger: labels and "
                              "their guarantee only.")

    app.add_middleware(_ConcurrencyLimit, limit=max_connections)
    queries_body = _queries_body(service.input_shape, max_queries)
    # documents the scheme in the OpenAPI schema; the key itself is checked by principal_of
    bearer = HTTPBearer(auto_error=False, description="an API key from agt keys add")

    class Refusal(Exception):
        def __init__(self, status: int, detail: str, **extra):
            self.status, self.detail, self.extra = status, detail, extra

    @app.exception_handler(Refusal)
    async def refused(request, exc: Refusal):
        return JSONResponse({"detail": exc.detail, **exc.extra}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        # one line, like every other refusal (FastAPI's default is a list of objects)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return JSONResponse({"detail": f"{where}: {first.get('msg', 'invalid')}"},
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_refused(request, exc: StarletteHTTPException):
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def failed(request, exc: Exception):
        return JSONResponse({"detail": "internal error; nothing was released"},
                            status_code=500)

    async def principal_of(request, role: str | None = None) -> Principal:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        who = await authenticate(key)
        if who is None:
            raise Refusal(401, "a valid API key is needed (header Authorization: Bearer KEY)")
        if role == "owner" and who.role != "owner":
            raise Refusal(403, "this endpoint needs the owner's key")
        return who

    # dependencies run before FastAPI validates the query parameters: the key comes first;
    # (coroutines: FastAPI runs a plain function dependency in its thread pool)
    async def client_key(request: Request, _=Depends(bearer)) -> Principal:
        return await principal_of(request)

    async def owner_key(request: Request, _=Depends(bearer)) -> Principal:
        return await principal_of(request, "owner")

    async def read_queries(request) -> object:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > max_body_bytes):
            raise Refusal(413, f"the request body is over {max_body_bytes} bytes")
        try:
            if size is not None:
                body = await request.body()            # its length is checked above
            else:                                      # chunked: count as it comes
                body = bytearray()
                async for chunk in request.stream():
                    body += chunk
                    if len(body) > max_body_bytes:
                        raise Refusal(413, f"the request body is over {max_body_bytes} bytes")
        except ClientDisconnect:
            raise Refusal(400, "the client went away before the body was read") from None
        try:
            data, utf8 = _read_json(body)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise Refusal(400, f"malformed JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict) or set(data) != {"queries"}:
            raise Refusal(400, 'the body must be a JSON object {"queries": [...]}')
        queries = data["queries"]
        if not isinstance(queries, list) or not queries:
            raise Refusal(400, '"queries" must be a non-empty list of queries')
        if len(queries) > max_queries:
            raise Refusal(413, f"at most {max_queries} queries per request, got {len(queries)}")
        # a JSON true or false is written as its letters, never escaped: a body orjson read
        # (UTF-8) without the bytes b"true" and b"false" holds no boolean, and the check for
        # one (a walk over every value) is skipped. The standard reader also takes UTF-16
        # and UTF-32 bodies, where those letters are other bytes: their walk is kept
        booleans = not utf8 or b"true" in body or b"false" in body
        try:
            return service.check_queries(queries, booleans=booleans)
        except DataError as exc:
            raise Refusal(422, str(exc)) from None

    async def wait(future, who: Principal | None = None):
        try:
            return await asyncio.wrap_future(future)
        except BudgetExceededError as exc:
            remaining = None
            if who is not None:
                try:
                    left = await asyncio.wrap_future(service.budget(who))
                    remaining = {"client": left["remaining"],
                                 "dataset": left["dataset"]["remaining"]}
                except PrivacyError:      # the ledger cannot be read now: refuse without it
                    remaining = None
            raise Refusal(429, _budget_reason(str(exc)), remaining=remaining) from None
        except DataError as exc:
            raise Refusal(422, str(exc).splitlines()[0]) from None
        except PrivacyError:
            # (the ledger's message names its file: not a client's business)
            raise Refusal(503, "the privacy ledger cannot be used now; nothing was released; "
                               "try again later") from None

    @app.get("/healthz", responses={503: {"model": RefusalBody, "description":
                                          "still warming up, or too many requests at once"}})
    async def healthz():
        if not service.ready:
            return JSONResponse({"status": "starting", "ready": False}, status_code=503)
        return {"status": "ok", "ready": True}

    @app.get("/v1/info", responses=_refusals())
    async def info():
        return service.info()

    @app.post("/v1/predict", openapi_extra={"requestBody": queries_body},
              responses={200: {"content": {"application/json": {"schema": _PREDICTION_SCHEMA}},
                               "description": "the labels and their guarantee"},
                         **_refusals(400, 401, 413, 422, 429)})
    async def predict(request: Request, who: Principal = Depends(client_key)):
        x = await read_queries(request)
        retry = request.headers.get("idempotency-key")
        if retry is not None and idempotency_key_problem(retry):
            # refused before certification: a malformed key must not buy free work
            raise Refusal(422, idempotency_key_problem(retry))
        answered = await wait(service.submit(who, x, idempotency_key=retry), who)
        labels = [None if int(v) < 0 else int(v) for v in answered.labels]
        g = answered.guarantee
        out = {"labels": labels, "cached": answered.cached.tolist(),
               "guarantee": {"epsilon": g.epsilon, "delta": g.delta, "relation": g.relation,
                             "per": "query" if answered.per_query else "session"},
               "charged": {"count": answered.charges, "epsilon": answered.charged_epsilon,
                           "delta": answered.charged_delta}}
        if not answered.per_query:
            out["session"] = {"opened": answered.sessions_opened,
                              "closed": answered.session_closed}
        return Response(_write_json(out), media_type="application/json")

    @app.get("/v1/budget", responses=_refusals(401))
    async def budget(who: Principal = Depends(client_key)):
        return await wait(service.budget(who))

    @app.post("/v1/owner/radii", openapi_extra={"requestBody": queries_body},
              responses=_refusals(400, 401, 403, 413, 422))
    async def radii(request: Request, _: Principal = Depends(owner_key)):
        x = await read_queries(request)
        return JSONResponse(await wait(service.radii(x)), headers=owner_page.HEADERS)

    @app.get("/v1/owner/ledger", responses=_refusals(401, 403, 422))
    async def ledger(_: Principal = Depends(owner_key),
                     limit: int = Query(100, ge=0, le=100_000,
                                        description="the newest entries, at most this many")):
        return JSONResponse(await wait(service.entries(limit)), headers=owner_page.HEADERS)

    # -- the owner's page: HTML for a browser, JSON refusals for anything else ---------------

    def owner_refusal(request, status: int, detail: str):
        if "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(owner_page.login_page(detail), status_code=status,
                                headers=owner_page.HEADERS)
        return JSONResponse({"detail": detail}, status_code=status, headers=owner_page.HEADERS)

    async def owner_view(request, key: str | None):
        who = await authenticate(key)
        if who is None:
            return owner_refusal(request, 401, "that is not a valid key")
        if who.role != "owner":
            return owner_refusal(request, 403, "this page needs the owner's key")
        # (the keys file's `records()` is a method; a ledger's key store's `records` a
        # property that reads the database)
        records = keys.records() if isinstance(keys, _Keys) else \
            await run_in_threadpool(lambda: list(keys.records))
        clients = [{"id": r.id, "name": r.name, "role": r.role,
                    "budget": None if r.budget_epsilon is None else
                    {"epsilon": r.budget_epsilon, "delta": r.budget_delta}}
                   for r in records if not r.revoked]
        data = await wait(service.overview(clients))
        return HTMLResponse(owner_page.overview_page(data), headers=owner_page.HEADERS)

    @app.get("/owner", include_in_schema=False)
    async def owner_get(request: Request):
        header = request.headers.get("authorization", "")
        if not header:
            return HTMLResponse(owner_page.login_page(), headers=owner_page.HEADERS)
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        return await owner_view(request, key)

    @app.post("/owner", include_in_schema=False)
    async def owner_post(request: Request):
        from urllib.parse import parse_qs

        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > 4096:
                return owner_refusal(request, 413, "the form is over 4096 bytes")
        try:
            key = parse_qs(body.decode("ascii"), max_num_fields=4).get("key", [None])[0]
        except (UnicodeDecodeError, ValueError):
            key = None
        return await owner_view(request, key)

    return app


def _read_json(body: bytes) -> tuple[object, bool]:
    """The request body's JSON value, every number in it a float where it is an integer
    beyond 64 bits (the nearest float64: how every query is read; infinite past float64's
    range, which the query check refuses), and whether orjson's reader took the body.

    orjson reads RFC 8259 JSON in UTF-8 and turns such integers into floats itself; what it
    refuses (NaN, Infinity, a number beyond float64's range, a lone surrogate, UTF-16 or
    UTF-32, a byte-order mark) goes to the standard library's reader, told to read integers
    as floats, so both readers give the same numbers and NaN and Infinity are still refused
    by the query check (422)."""
    if orjson is not None:
        try:
            return orjson.loads(body), True
        except orjson.JSONDecodeError:
            pass
    return json.loads(body, parse_int=float), False


def _write_json(value) -> bytes:
    """A response body (orjson where installed: the same JSON, written faster)."""
    return orjson.dumps(value) if orjson is not None else json.dumps(value).encode()


def _budget_reason(text: str) -> str:
    """A client's refusal: which budget. The ledger's message on the dataset's budget is not
    passed on (it names totals and the ledger); what remains of the dataset's budget is in
    the response's ``remaining``, as in ``/v1/budget`` (a function of the charges, which
    depend on released outputs only)."""
    if text.startswith("client "):
        return text
    return "the dataset's privacy budget cannot pay for this request; nothing was released"


def _version() -> str:
    from agt.version import __version__
    return __version__

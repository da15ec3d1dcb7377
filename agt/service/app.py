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
* ``GET /healthz`` (public).
* ``POST /v1/owner/radii`` and ``GET /v1/owner/ledger`` (owner key): the queries' radii and
  the ledger's entries. Owner-only: nothing a client receives depends on the private data
  except through the mechanism.

Status codes: 400 malformed JSON or a wrong JSON type, 401 a missing or unknown key, 403 a
client on an owner endpoint, 413 a body or a request over the limits, 422 queries of the
wrong shape, with a NaN or infinite value or outside the declared domain, 429 a request over
the client's or the dataset's budget (with what remains; nothing charged, nothing released),
503 a ledger that cannot be written. Every refusal is one line ``{"detail": "..."}``,
charges nothing and draws nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from agt.errors import BudgetExceededError, DataError, PrivacyError
from agt.service.keys import KeyStore, Principal
from agt.service.server import PredictionService

#: defaults of the request limits
MAX_BODY_BYTES = 8 << 20
MAX_QUERIES = 10_000

_PREDICT_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["queries"],
        "properties": {"queries": {
            "type": "array", "minItems": 1,
            "description": "queries, each an array (nested to the model's input shape) of "
                           "finite numbers",
            "items": {"type": "array", "items": {}}}}}}}}


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


def create_app(service: PredictionService, keys_path, *,
               max_body_bytes: int = MAX_BODY_BYTES, max_queries: int = MAX_QUERIES):
    """The FastAPI application serving ``service`` to the keys of ``keys_path``.

    Args:
        service: the prediction service (`PredictionService`).
        keys_path: the keys file (`agt keys add`), or a key store with an
            ``authenticate(key)`` method (`agt.service.keys.LedgerKeyStore`: the keys of a
            PostgreSQL ledger, shared by replicas).
        max_body_bytes: the largest request body accepted.
        max_queries: the most queries one request may hold.

    Returns:
        A FastAPI application (run it with uvicorn).
    """
    keys = keys_path if hasattr(keys_path, "authenticate") else _Keys(keys_path)

    @asynccontextmanager
    async def lifespan(app):
        yield
        service.close()            # the queued requests are answered first

    app = FastAPI(title="agt prediction service", version=_version(), lifespan=lifespan,
                  description="Private predictions through the privacy ledger: labels and "
                              "their guarantee only.")

    class Refusal(Exception):
        def __init__(self, status: int, detail: str, **extra):
            self.status, self.detail, self.extra = status, detail, extra

    @app.exception_handler(Refusal)
    async def refused(request, exc: Refusal):
        return JSONResponse({"detail": exc.detail, **exc.extra}, status_code=exc.status)

    def principal_of(request, role: str | None = None) -> Principal:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else None
        who = keys.authenticate(key)
        if who is None:
            raise Refusal(401, "a valid API key is needed (header Authorization: Bearer KEY)")
        if role == "owner" and who.role != "owner":
            raise Refusal(403, "this endpoint needs the owner's key")
        return who

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
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise Refusal(400, f"malformed JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict) or set(data) != {"queries"}:
            raise Refusal(400, 'the body must be a JSON object {"queries": [...]}')
        queries = data["queries"]
        if not isinstance(queries, list) or not queries:
            raise Refusal(400, '"queries" must be a non-empty list of queries')
        if len(queries) > max_queries:
            raise Refusal(413, f"at most {max_queries} queries per request, got {len(queries)}")
        try:
            return service.check_queries(queries)
        except DataError as exc:
            raise Refusal(422, str(exc)) from None

    async def wait(future, who: Principal | None = None):
        try:
            return await asyncio.wrap_future(future)
        except BudgetExceededError as exc:
            remaining = None
            if who is not None:
                left = await asyncio.wrap_future(service.budget(who))
                remaining = {"client": left["remaining"], "dataset": left["dataset"]["remaining"]}
            raise Refusal(429, _budget_reason(str(exc)), remaining=remaining) from None
        except DataError as exc:
            raise Refusal(422, str(exc).splitlines()[0]) from None
        except PrivacyError:
            # (the ledger's message names its file: not a client's business)
            raise Refusal(503, "the privacy ledger cannot be used now; nothing was released; "
                               "try again later") from None

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/v1/info")
    async def info():
        return service.info()

    @app.post("/v1/predict", openapi_extra={"requestBody": _PREDICT_BODY})
    async def predict(request: Request):
        who = principal_of(request)
        x = await read_queries(request)
        retry = request.headers.get("idempotency-key")
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
        return Response(json.dumps(out).encode(), media_type="application/json")

    @app.get("/v1/budget")
    async def budget(request: Request):
        who = principal_of(request)
        return await wait(service.budget(who))

    @app.post("/v1/owner/radii", openapi_extra={"requestBody": _PREDICT_BODY})
    async def radii(request: Request):
        principal_of(request, "owner")
        x = await read_queries(request)
        return await wait(service.radii(x))

    @app.get("/v1/owner/ledger")
    async def ledger(request: Request, limit: int = 100):
        principal_of(request, "owner")
        if not 0 <= limit <= 100_000:
            raise Refusal(422, "limit must be in [0, 100000]")
        return await wait(service.entries(limit))

    return app


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

"""A small Python client of the prediction service (`agt serve`), on httpx.

    from agt.client import Client

    with Client("http://127.0.0.1:8000", key="agt_...") as client:
        client.info()                     # mechanism, guarantee, input shape (public)
        result = client.predict(x)        # x: one query per row
        result.labels                     # None where the mechanism gave no answer
        client.budget()                   # this key's spend and what remains

A refusal raises `ServiceError` with the service's status and one-line reason (429: over a
budget, with what remains in ``.body``). Nothing here loads torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agt.errors import AGTError


class ServiceError(AGTError):
    """A request the service refused: ``status`` (HTTP) and the service's reason."""

    def __init__(self, status: int, detail: str, body: dict | None = None):
        super().__init__(f"{status}: {detail}")
        self.status, self.detail, self.body = status, detail, body or {}


@dataclass(frozen=True)
class Prediction:
    """The service's answer to one request: labels (None: no answer), whether each came
    from an earlier release (no charge), the guarantee and what was charged."""

    labels: list[int | None]
    cached: list[bool]
    guarantee: dict
    charged: dict
    session: dict | None = field(default=None)


class Client:
    """A client of one service, authenticated by one key.

    Args:
        url: the service's address, e.g. ``http://127.0.0.1:8000``.
        key: the API key (`agt keys add`).
        timeout: seconds per request.
    """

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 60.0):
        import httpx

        headers = {"authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs) -> Any:
        response = self._http.request(method, path, **kwargs)
        try:
            body = response.json()
        except ValueError:
            body = {"detail": response.text[:200]}
        if response.status_code >= 400:
            detail = body.get("detail") if isinstance(body, dict) else None
            raise ServiceError(response.status_code, str(detail or response.reason_phrase),
                               body if isinstance(body, dict) else None)
        return body

    def health(self) -> bool:
        """True once the service is ready (its model warmed up); False while it starts.

        Raises:
            httpx.HTTPError: the service cannot be reached.
        """
        response = self._http.get("/healthz")
        try:
            body = response.json()
        except ValueError:
            return False
        return response.status_code == 200 and isinstance(body, dict) and \
            body.get("ready") is True

    def info(self) -> dict:
        """The mechanism, relation, input shape, classes and guarantee (public)."""
        return self._call("GET", "/v1/info")

    def predict(self, queries, *, idempotency_key: str | None = None) -> Prediction:
        """Labels for the queries (a sequence of queries, or an array with one per row).

        Args:
            queries: the queries.
            idempotency_key: a retry token (``Idempotency-Key``): sending the same queries
                with the same key again, to any replica, gets the first answer, charged
                once (e.g. after a timeout or a lost connection).

        Returns:
            The `Prediction`.

        Raises:
            ServiceError: the service refused the request (nothing was charged).
        """
        data = queries.tolist() if hasattr(queries, "tolist") else list(queries)
        headers = {} if idempotency_key is None else {"idempotency-key": idempotency_key}
        body = self._call("POST", "/v1/predict", json={"queries": data}, headers=headers)
        return Prediction(body["labels"], body["cached"], body["guarantee"], body["charged"],
                          body.get("session"))

    def budget(self) -> dict:
        """This key's spend, its budget and what remains (and the dataset's remainder)."""
        return self._call("GET", "/v1/budget")

    def radii(self, queries) -> dict:
        """Owner key only: the queries' predictions and radii (owner-only values)."""
        data = queries.tolist() if hasattr(queries, "tolist") else list(queries)
        return self._call("POST", "/v1/owner/radii", json={"queries": data})

    def ledger(self, limit: int = 100) -> list[dict]:
        """Owner key only: the ledger's newest entries."""
        return self._call("GET", "/v1/owner/ledger", params={"limit": int(limit)})

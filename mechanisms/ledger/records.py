"""What crosses the ledger's door: the records a release returns and a ledger holds, and
the query digests the answers are kept by."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, PrivacyError
from mechanisms.base import Mechanism
from mechanisms.guarantee import Guarantee


def hash_query(query: ArrayLike) -> str:
    """sha256 (hex) of a query array: dtype, shape and C-order bytes, so equal arrays of
    different dtype or shape hash differently.

    Args:
        query: one query (any array-like).

    Returns:
        64 hex digits.
    """
    arr = np.ascontiguousarray(np.asarray(query))
    digest = hashlib.sha256()
    digest.update(f"{arr.dtype.str}|{arr.shape}|".encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


def hash_queries(queries: ArrayLike) -> list[str]:
    """`hash_query` of every row of ``queries`` (one query per row), computed together.

    Args:
        queries: an array with one query per row.

    Returns:
        One hash per row, in order.

    Raises:
        PrivacyError: a 0-dimensional array (no rows).
    """
    arr = np.ascontiguousarray(np.asarray(queries))
    if arr.ndim == 0:
        raise PrivacyError("hash_queries needs an array with one query per row")
    prefix = f"{arr.dtype.str}|{arr.shape[1:]}|".encode()      # `hash_query` of one row
    if not len(arr):
        return []
    # every row's bytes from one copy of the C-order buffer: row i is data[i w:(i + 1) w]
    # (w = 0: every row is the empty query)
    flat = arr.reshape(len(arr), -1).view(np.uint8).reshape(len(arr), -1)
    width, data, sha256 = flat.shape[1], flat.tobytes(), hashlib.sha256
    return [sha256(prefix + data[i * width:(i + 1) * width]).hexdigest()
            for i in range(len(arr))]


def default_ledger_path(dataset_sha256: str) -> Path:
    """The ledger of a private dataset when none is named: one dataset, one default ledger,
    whichever bundle, ensemble or copy releases from it.

    ``$AGT_LEDGER_DIR`` (default ``~/.agt/ledgers``) / ``<name>.db`` with name = the first 20
    hex digits of HMAC-SHA256(key, dataset hash), the key 32 random bytes kept in ``.key``
    in that folder (created on first use, owner-readable only). A name derived from the raw
    dataset hash would let anyone who sees the path test candidate datasets against it.

    Args:
        dataset_sha256: the private dataset's hash.

    Returns:
        The ledger file's path (the file itself is created by `Ledger.open`).

    Raises:
        PrivacyError: the folder cannot be used, or its key is damaged.
    """
    base = Path(os.environ.get("AGT_LEDGER_DIR") or Path.home() / ".agt" / "ledgers").expanduser()
    try:
        base.mkdir(parents=True, exist_ok=True)
        key_file = base / ".key"
        if not key_file.exists():
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        key = key_file.read_bytes()
    except FileExistsError:          # another process created it between the two calls
        key = (base / ".key").read_bytes()
    except OSError as exc:
        raise PrivacyError(f"cannot use the default ledger folder {base} ({exc.strerror or exc}); "
                           f"set AGT_LEDGER_DIR or give --ledger") from None
    if len(key) < 16:
        raise PrivacyError(f"{base / '.key'} is damaged (too short); restore it or give --ledger")
    name = hmac.new(key, dataset_sha256.encode(), hashlib.sha256).hexdigest()[:20]
    return base / f"{name}.db"


def idempotency_key_problem(key) -> str | None:
    """What is wrong with an idempotency key, or None when it is usable.

    Args:
        key: the client's retry token (the ``Idempotency-Key`` header).

    Returns:
        A one-line reason (a key must be 1 to 255 printable ASCII characters), or None.
    """
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or not key.isprintable() \
            or not key.isascii():
        return "an idempotency key must be 1 to 255 printable ASCII characters"
    return None


@dataclass(frozen=True)
class Release:
    """What leaves the door: the released labels (REFUSED = -1 where the mechanism gave no
    answer) and the guarantee they come with, under the ledger's relation: per query, or for
    the whole release when `per_query` is False (a session)."""

    labels: NDArray[np.int64]
    guarantee: Guarantee
    mechanism: str
    charged_epsilon: float
    charged_delta: float
    seeded: bool
    per_query: bool = True

    @property
    def n_queries(self) -> int:
        """The number of released labels (one per query)."""
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class LedgerEntry:
    """A recorded charge (a row of the ledger's ``releases`` table, or one charge of a
    ``charge_runs`` row)."""

    id: int
    time: str
    source_id: str
    query_hash: str
    mechanism: str
    epsilon: float
    delta: float
    seeded: bool
    note: str


@dataclass(frozen=True)
class _Charge:
    epsilon: float
    delta: float
    mechanism: str
    source_id: str
    query_hash: str
    seeded: bool
    note: str


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class AnswerRequest:
    """One request to `Ledger.answer_batch`: a mechanism, its inputs (with every query's
    hash as ``query_ids``), the client who asks (a key's id; "" for none) and the client's
    own budget (None: only the ledger's caps it).

    ``idempotency_key`` (optional, a client's retry token): the first request of a client
    with this key is answered and its answer recorded in the same transaction as its
    charges; a later one with the same key and the same queries gets that recorded answer
    again, charged nothing; the same key with other queries is refused (`IdempotencyError`).
    """

    mechanism: Mechanism
    inputs: object
    client: str = ""
    client_budget: tuple[float, float] | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Answered(Release):
    """What `answer_batch` released for one request: a `Release` (a label per query, REFUSED
    = -1 where the mechanism gave no answer, and the guarantee), which labels came from
    earlier releases (``cached``), and what was recorded: ``charges`` new charges of
    (charged_epsilon, charged_delta) each, one per new query or one per session opened
    (``sessions_opened``); ``session_closed``: a session reached its cutoff within this
    request."""

    cached: NDArray[np.bool_] | None = None
    charges: int = 0
    sessions_opened: int = 0
    session_closed: bool = False


@dataclass(frozen=True)
class _Prepared:
    request: AnswerRequest
    guarantee: Guarantee
    eps_c: float
    delta_c: float
    #: the queries' hashes as bytes, (Q, 32) (`index.hash_bytes_of`, checked once)
    hash_bytes: NDArray | None = None
    #: the queries' digests (`index.digests_of`: the first 16 bytes of each)
    digests: NDArray | None = None




class IdempotencyError(DataError):
    """An ``Idempotency-Key`` reused by its client for a request with other queries (or
    another mechanism): refused, nothing charged, nothing released."""

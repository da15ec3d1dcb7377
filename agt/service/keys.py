"""API keys of the prediction service: hashed keys with roles and budgets, in a JSON file
(`KeyStore`) or in a PostgreSQL ledger's ``api_keys`` table (`LedgerKeyStore`, shared by
replicas).

A key is ``agt_`` followed by 43 characters of a random 256-bit token (`secrets`). The
file stores only its SHA-256 (a key carries 256 bits of entropy, so a fast hash cannot be
inverted by guessing), a public id (the first 12 hex digits of that hash, which names the
client in the ledger), the role (``owner`` or ``client``), an optional per-client budget and
whether it was revoked. `KeyStore.authenticate` compares the hash of a presented key with
every stored hash in constant time (`hmac.compare_digest`), so the time it takes does not
depend on how much of a key is right.

Budgets: the dataset's ledger caps every client together (clients can collude: the
dataset's budget is the guarantee); a client's own budget is fairness among clients.
The file is written atomically and readable by its owner only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from agt.errors import ConfigError

ROLES = ("owner", "client")
FORMAT = "agt-keys"
PREFIX = "agt_"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a key's id, its role and its own budget (None: only the
    dataset's ledger caps it)."""

    id: str
    role: str
    budget_epsilon: float | None = None
    budget_delta: float | None = None

    @property
    def budget(self) -> tuple[float, float] | None:
        """The client's own (epsilon, delta) budget, or None where only the dataset's ledger
        caps it."""
        if self.budget_epsilon is None:
            return None
        return float(self.budget_epsilon), float(self.budget_delta or 0.0)


@dataclass(frozen=True)
class KeyRecord:
    """A stored key: never the key itself."""

    id: str
    sha256: str
    role: str
    name: str = ""
    budget_epsilon: float | None = None
    budget_delta: float | None = None
    created: str = ""
    revoked: bool = False

    def principal(self) -> Principal:
        """The request's principal of this key (its id, role and budget)."""
        return Principal(self.id, self.role, self.budget_epsilon, self.budget_delta)


_FIELDS = {f.name for f in fields(KeyRecord)}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _entry_problem(entry) -> str | None:
    """What is wrong with one stored key entry (a JSON object or a database row as a dict),
    or None: every field of the right type and range, so nothing a request later does with
    it (its budget, its role, its hash) can fail."""
    if not isinstance(entry, dict):
        return "is not a JSON object"
    unknown = set(entry) - _FIELDS
    if unknown:
        return f"has unknown fields {sorted(unknown)}"
    missing = {"id", "sha256", "role"} - set(entry)
    if missing:
        return f"lacks {sorted(missing)}"
    for name in ("id", "sha256", "role", "name", "created"):
        if name in entry and not isinstance(entry[name], str):
            return f"has a {name} that is not a string ({type(entry[name]).__name__})"
    if len(entry["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in entry["sha256"]):
        return "has a sha256 that is not 64 lower-case hex digits"
    if entry["role"] not in ROLES:
        return f"has the role {entry['role']!r} (one of {', '.join(ROLES)})"
    eps, delta = entry.get("budget_epsilon"), entry.get("budget_delta")
    if eps is not None and not (_is_number(eps) and eps > 0):
        return f"has budget_epsilon {eps!r}: a positive finite number or null"
    if delta is not None and not (_is_number(delta) and 0 <= delta < 1):
        return f"has budget_delta {delta!r}: a number in [0, 1) or null"
    if delta is not None and eps is None:
        return "has a budget_delta without a budget_epsilon"
    if eps is not None and entry["role"] == "owner":
        return "is an owner key with a budget"
    if not isinstance(entry.get("revoked", False), bool):
        return f"has revoked {entry['revoked']!r}: true or false"
    return None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyStore:
    """The keys file (``load``, ``add``, ``revoke``, ``authenticate``)."""

    def __init__(self, path: str | os.PathLike[str], records: list[KeyRecord]):
        self.path = Path(path)
        self.records = records

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, create: bool = False) -> "KeyStore":
        """Read a keys file; a missing file is an empty store when ``create``, else an
        error.

        Raises:
            ConfigError: the file is missing (without ``create``), unreadable or malformed.
        """
        path = Path(path)
        if not path.exists():
            if create:
                return cls(path, [])
            raise ConfigError(f"keys file not found: {path} (create keys with agt keys add "
                              f"--keys {path})")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read the keys file {path} ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT or \
                not isinstance(raw.get("keys"), list):
            raise ConfigError(f"{path} is not an agt keys file")
        records = []
        for i, entry in enumerate(raw["keys"]):
            problem = _entry_problem(entry)
            if problem is not None:
                # the whole file is refused: a file edited by hand and damaged admits no one
                # (never a 500 on a later request, never another client's failure)
                raise ConfigError(f"{path}: key entry {i + 1} {problem}; fix or remove it "
                                  f"(agt keys list shows the valid entries of a good file)")
            records.append(KeyRecord(**entry))
        return cls(path, records)

    def save(self) -> None:
        """Write the file atomically, readable by its owner only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(6)}.tmp")
        text = json.dumps({"format": FORMAT, "keys": [asdict(r) for r in self.records]},
                          indent=1)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def add(self, role: str, *, name: str = "", budget_epsilon: float | None = None,
            budget_delta: float | None = None) -> tuple[str, KeyRecord]:
        """A new key: returns the key (shown once; only its hash is kept) and its record.

        Raises:
            ConfigError: an unknown role, a budget on an owner key, or a budget that is not
                a positive epsilon and a delta in [0, 1).
        """
        if role not in ROLES:
            raise ConfigError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if role == "owner" and (budget_epsilon is not None or budget_delta is not None):
            raise ConfigError("an owner key carries no budget (owner endpoints release nothing)")
        if budget_delta is not None and budget_epsilon is None:
            raise ConfigError("--budget-delta needs --budget-epsilon")
        if budget_epsilon is not None and not (0 < float(budget_epsilon) < float("inf")):
            raise ConfigError(f"budget epsilon must be a positive number, got {budget_epsilon!r}")
        if budget_delta is not None and not 0 <= float(budget_delta) < 1:
            raise ConfigError(f"budget delta must be in [0, 1), got {budget_delta!r}")
        key = PREFIX + secrets.token_urlsafe(32)
        digest = _digest(key)
        record = KeyRecord(
            id=digest[:12], sha256=digest, role=role, name=str(name),
            budget_epsilon=None if budget_epsilon is None else float(budget_epsilon),
            budget_delta=None if budget_epsilon is None else float(budget_delta or 0.0),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        self.records.append(record)
        return key, record

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark the key with this id revoked (kept in the file: its charges stay its own).

        Raises:
            ConfigError: no key has this id.
        """
        for i, record in enumerate(self.records):
            if record.id == key_id:
                self.records[i] = KeyRecord(**{**asdict(record), "revoked": True})
                return self.records[i]
        raise ConfigError(f"no key with id {key_id!r} in {self.path} (agt keys list shows them)")

    def authenticate(self, key: str | None) -> Principal | None:
        """The principal of a presented key, or None for a missing, unknown or revoked key.
        Every stored hash is compared, in constant time each."""
        if not key or not isinstance(key, str):
            return None
        digest = _digest(key)
        found = None
        for record in self.records:
            if hmac.compare_digest(record.sha256, digest) and not record.revoked:
                found = record
        return None if found is None else found.principal()


class LedgerKeyStore:
    """The keys of a PostgreSQL ledger (its ``api_keys`` table): shared by every replica that
    serves from the ledger, so a key added or revoked by ``agt keys ... --ledger URL``
    takes effect on every replica at its next request (`authenticate` reads the table each
    time; no cache to expire). Only hashes are stored, as in the keys file.

    A row that fails the entry checks (a table edited by hand) is that key refused alone:
    `authenticate` returns None for it and `records` leaves it out with a warning line.

    Args:
        url: the ledger's ``postgresql://`` URL (the table is created where missing).

    Raises:
        ConfigError: psycopg is missing or the database cannot be reached.
    """

    _COLUMNS = "id, sha256, role, name, budget_epsilon, budget_delta, created, revoked"

    def __init__(self, url: str):
        try:
            import psycopg
        except ImportError:
            raise ConfigError('keys in a PostgreSQL ledger need psycopg 3: pip install -e '
                              '".[postgres]"') from None
        from mechanisms.ledger.schema import API_KEYS_TABLE
        from mechanisms.ledger.stores import public_url

        self._psycopg = psycopg
        self.url = url
        self.path = public_url(url)            # (named like the keys file in messages)
        self._conn = None
        self._connect().execute(API_KEYS_TABLE)

    def _connect(self):
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                self._conn = self._psycopg.connect(self.url, autocommit=True,
                                                   connect_timeout=10)
            except self._psycopg.Error as exc:
                self._conn = None
                raise ConfigError(f"cannot reach the ledger {self.path} for its keys "
                                  f"({str(exc).strip().splitlines()[0]})") from None
        return self._conn

    def _rows(self, where: str = "", params: tuple = ()) -> list[dict]:
        cols = [c.strip() for c in self._COLUMNS.split(",")]
        try:
            rows = self._connect().execute(
                f"SELECT {self._COLUMNS} FROM api_keys {where} ORDER BY created, id",
                params or None).fetchall()
        except self._psycopg.Error as exc:
            raise ConfigError(f"cannot read the keys of {self.path} "
                              f"({str(exc).strip().splitlines()[0]})") from None
        return [dict(zip(cols, row)) for row in rows]

    @property
    def records(self) -> list[KeyRecord]:
        """Every valid stored key, oldest first (never the keys themselves)."""
        out = []
        for row in self._rows():
            if _entry_problem(row) is None:
                out.append(KeyRecord(**row))
        return out

    def add(self, role: str, *, name: str = "", budget_epsilon: float | None = None,
            budget_delta: float | None = None) -> tuple[str, KeyRecord]:
        """A new key, stored at once: returns the key (shown once) and its record.

        Args:
            role: ``owner`` or ``client``.
            name: a note for whom the key is.
            budget_epsilon: a client's own epsilon budget.
            budget_delta: its delta budget.

        Returns:
            (the key, its record).

        Raises:
            ConfigError: as `KeyStore.add`, or the database cannot be written.
        """
        key, record = KeyStore("-", []).add(role, name=name, budget_epsilon=budget_epsilon,
                                            budget_delta=budget_delta)
        try:
            self._connect().execute(
                f"INSERT INTO api_keys ({self._COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                f"%s)", tuple(asdict(record).values()))
        except self._psycopg.Error as exc:
            raise ConfigError(f"cannot store the key in {self.path} "
                              f"({str(exc).strip().splitlines()[0]})") from None
        return key, record

    def revoke(self, key_id: str) -> KeyRecord:
        """Revoke the key with this id (kept: its charges stay its own).

        Args:
            key_id: the key's id (`records`).

        Returns:
            The revoked key's record.

        Raises:
            ConfigError: no key has this id, or the database cannot be written.
        """
        try:
            self._connect().execute("UPDATE api_keys SET revoked = TRUE WHERE id = %s",
                                    (key_id,))
        except self._psycopg.Error as exc:
            raise ConfigError(f"cannot revoke the key in {self.path} "
                              f"({str(exc).strip().splitlines()[0]})") from None
        rows = self._rows("WHERE id = %s", (key_id,))
        if not rows:
            raise ConfigError(f"no key with id {key_id!r} in {self.path} (agt keys list "
                              f"--ledger shows them)")
        return KeyRecord(**rows[0])

    def save(self) -> None:
        """Nothing to do: every change is stored when it is made."""

    def authenticate(self, key: str | None) -> Principal | None:
        """The principal of a presented key, or None for a missing, unknown, revoked or
        damaged key, or when the database cannot be read (no one is admitted then).

        Args:
            key: the presented key.

        Returns:
            Its `Principal`, or None.
        """
        if not key or not isinstance(key, str):
            return None
        digest = _digest(key)
        try:
            # looked up by its hash: the index walk depends on the hash of what was
            # presented, never on how much of a real key it matches
            rows = self._rows("WHERE sha256 = %s", (digest,))
        except ConfigError:
            return None
        for row in rows:
            if _entry_problem(row) is None and hmac.compare_digest(row["sha256"], digest) \
                    and not row["revoked"]:
                return KeyRecord(**row).principal()
        return None

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()


def open_keys(keys: str | os.PathLike[str] | None = None, ledger: str | None = None, *,
              create: bool = False):
    """The key store a command names: a keys file, or the keys of a PostgreSQL ledger.

    Args:
        keys: the keys file (SQLite ledgers; any ledger).
        ledger: a ``postgresql://`` ledger URL whose ``api_keys`` table holds the keys.
        create: a missing keys file is an empty store.

    Returns:
        A `KeyStore` or a `LedgerKeyStore` (both: ``records``, ``add``, ``revoke``,
        ``save``, ``authenticate``).

    Raises:
        ConfigError: neither or both named, a ledger that is not a PostgreSQL URL, or the
            store cannot be read.
    """
    if (keys is None) == (ledger is None):
        raise ConfigError("name the keys file (--keys FILE) or the PostgreSQL ledger that "
                          "holds the keys (--ledger postgresql://...), one of them")
    if keys is not None:
        return KeyStore.load(keys, create=create)
    if not str(ledger).startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"keys live in a PostgreSQL ledger (postgresql://...); an SQLite "
                          f"ledger such as {ledger} takes a keys file (--keys FILE)")
    return LedgerKeyStore(str(ledger))

"""API keys of the prediction service: a JSON file of hashed keys with roles and budgets.

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
import os
import secrets
from dataclasses import asdict, dataclass
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
        return Principal(self.id, self.role, self.budget_epsilon, self.budget_delta)


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
        for entry in raw["keys"]:
            try:
                record = KeyRecord(**entry)
            except TypeError:
                raise ConfigError(f"{path}: a malformed key entry") from None
            if record.role not in ROLES or len(record.sha256) != 64:
                raise ConfigError(f"{path}: key {record.id!r} has a bad role or hash")
            records.append(record)
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

"""The ledger's schema: its tables in SQLite and in PostgreSQL, its format version, and
the settings a ledger is created with (checked, stored, compared when it is opened again).

Both backends hold the same tables with the same columns (docs/reference/formats.md):
``ledger_meta`` (one row: budget, accountant, relation, dataset), ``releases`` (one row per
charge of `Ledger.release`, append-only), the answering door's ``charge_runs`` (one row per
request: a run of charges with consecutive ids from the same sequence, append-only),
``spend_totals``, ``client_totals``, ``answer_blocks`` (one row per request's answers),
``answers`` (one row per answer, of older ledgers: read, no longer written), ``sessions``
and ``idempotency``, and an
rdp ledger's ``rdp_charges`` and ``data_dependent``.
A PostgreSQL ledger also holds the service's ``api_keys`` (agt.service.keys), so that
replicas share them. Amounts are IEEE doubles stored as given (SQLite REAL, PostgreSQL
DOUBLE PRECISION: both binary64, so a charge reads back bit for bit) and counted in
integers; every sum is made by the accountant, in exact rationals rounded up
(accounting.py), never by the database.
"""

from __future__ import annotations

import json

from agt.errors import PrivacyError
from mechanisms.accounting import ACCOUNTANTS, Accountant
from mechanisms.checks import check_delta, check_epsilon, privacy_problems
from mechanisms.guarantee import REPLACE_ONE, check_relation
from mechanisms.ledger.records import _now

#: the SQLite ledger's format (3: the answering door records a request's charges as one
#: ``charge_runs`` row; 4: and its answers as one ``answer_blocks`` row; 5: a run's query
#: hashes as 32 bytes each, not a JSON array of hex strings)
FORMAT_VERSION = 5
#: the PostgreSQL ledger's format (its own line of versions; 2: ``charge_runs``; 3:
#: ``answer_blocks``; 4: a run's query hashes as ``bytea``, 32 bytes each)
POSTGRES_FORMAT_VERSION = 4
#: per backend, the formats this code migrates to its own on open (the ones before lack only
#: tables the migration adds: ``charge_runs``, ``answer_blocks``, and hold a run's hashes as
#: JSON text, converted to bytes in the migration's transaction: `migrate_run_hashes`)
MIGRATES_FROM = {"SQLite": (2, 3, 4), "PostgreSQL": (1, 2, 3)}
#: the bytes of one query hash in a charge run (SHA-256, `hash_query`)
HASH_BYTES = 32
_TABLES = {"ledger_meta", "releases", "sqlite_sequence"}
#: tables the answering door (`Ledger.answer_batch`) adds on first use: running totals of the
#: charges, all and per client (so a budget check reads a few rows, not every charge; every
#: insert into `releases` adds to them in its transaction), the released answers (the cache:
#: asked again, a query gets its released label at no new charge) and the open
#: stability-gated sessions
_ANSWER_TABLES = {"spend_totals", "client_totals", "answers", "sessions", "idempotency",
                  "charge_runs", "answer_blocks"}
_FIXED_ACCOUNTANTS = ("best", "advanced", "tight")
#: every accountant a ledger takes: the (eps, delta) ones of accounting.py and "rdp"
LEDGER_ACCOUNTANTS: tuple[str, ...] = ACCOUNTANTS + ("rdp",)
#: the tables of an rdp ledger: each charge's curve, and the sanitised data-dependent costs
_RDP_TABLES = {"rdp_charges", "data_dependent"}
_RDP_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rdp_charges (
        release_id INTEGER PRIMARY KEY REFERENCES releases (id),
        curve BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS data_dependent (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('sanitised')),
        order_alpha REAL NOT NULL,
        value REAL NOT NULL,
        epsilon REAL NOT NULL,
        delta REAL NOT NULL,
        release_id INTEGER NOT NULL REFERENCES releases (id),
        note TEXT NOT NULL)""",
    """CREATE TRIGGER IF NOT EXISTS rdp_charges_no_update BEFORE UPDATE ON rdp_charges
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS rdp_charges_no_delete BEFORE DELETE ON rdp_charges
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS data_dependent_no_update BEFORE UPDATE ON data_dependent
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS data_dependent_no_delete BEFORE DELETE ON data_dependent
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

# One statement each: sqlite3's executescript would COMMIT the open transaction first.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        format_version INTEGER NOT NULL,
        budget_epsilon REAL NOT NULL CHECK (budget_epsilon > 0),
        budget_delta REAL NOT NULL CHECK (budget_delta >= 0 AND budget_delta < 1),
        accountant TEXT NOT NULL,
        delta_prime REAL,
        per_query_epsilon REAL,
        per_query_delta REAL,
        relation TEXT NOT NULL,
        dataset_sha256 TEXT,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS releases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        query_hash TEXT NOT NULL,
        mechanism TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon > 0),
        delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
        seeded INTEGER NOT NULL,
        note TEXT NOT NULL)""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

#: a client's retry token -> the digest of its request and the answer it was given (JSON),
#: written in the transaction that charged it
_IDEMPOTENCY_TABLE = """CREATE TABLE IF NOT EXISTS idempotency (client TEXT NOT NULL,
    key TEXT NOT NULL, request_sha256 TEXT NOT NULL, answer TEXT NOT NULL, time TEXT NOT NULL,
    PRIMARY KEY (client, key))"""
#: an answer recorded for a retry is never changed or removed (a removed record would make
#: the retry charge again)
_IDEMPOTENCY_SQLITE = (
    _IDEMPOTENCY_TABLE,
    """CREATE TRIGGER IF NOT EXISTS idempotency_no_update BEFORE UPDATE ON idempotency
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS idempotency_no_delete BEFORE DELETE ON idempotency
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

#: the answering door's charges, one row per request: ``count`` charges of (epsilon,
#: delta) with the consecutive ids ``id .. id + count - 1`` (shared with ``releases``: one
#: sequence of charge ids), their query hashes in charge order as ``32 x count`` bytes (each
#: hash's SHA-256 digest; format 4 and before: a JSON array of hex strings, converted when
#: opened). One row and one index entry instead of ``count``: the durable writes of a
#: request no longer grow with its rows' text (`Ledger.entries` expands a run into its
#: charges)
_CHARGE_RUNS_SQLITE = (
    """CREATE TABLE IF NOT EXISTS charge_runs (id INTEGER PRIMARY KEY,
        count INTEGER NOT NULL CHECK (count > 0), time TEXT NOT NULL,
        source_id TEXT NOT NULL, mechanism TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon > 0),
        delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1), seeded INTEGER NOT NULL,
        note TEXT NOT NULL,
        query_hashes BLOB NOT NULL CHECK (length(query_hashes) = 32 * count))""",
    """CREATE TRIGGER IF NOT EXISTS charge_runs_no_update BEFORE UPDATE ON charge_runs
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    # (SQLite keeps text in a BLOB column: a process of an older agt still running on a
    # migrated ledger would write its JSON; refused, as is a run of the wrong length in a
    # table declared before the length check)
    """CREATE TRIGGER IF NOT EXISTS charge_runs_hash_bytes BEFORE INSERT ON charge_runs
        WHEN typeof(NEW.query_hashes) != 'blob' OR length(NEW.query_hashes) != 32 * NEW.count
        BEGIN SELECT RAISE(ABORT, 'charge runs hold 32 bytes per query hash: upgrade agt');
        END""",
    """CREATE TRIGGER IF NOT EXISTS charge_runs_no_delete BEFORE DELETE ON charge_runs
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

#: the answering door's released answers, one row per request (an "answer block"): its
#: queries' digests (the first 16 bytes of each query's hash, `n x 16` bytes), their labels
#: and release ids (little-endian int64, `n x 8` bytes each), under the namespace (source,
#: mechanism, its parameters' repr, seeded) they are served again in. Appended at the end
#: (ids in commit order: every writer holds the ledger's write lock), so a commit writes a
#: few pages, not one random B-tree page per answer. The older ``answers`` table (one row
#: per answer) is read, never written, once a ledger has blocks: an insert is refused, so a
#: process of an older agt still running on a migrated ledger cannot add an answer that this
#: version's cache would miss
_BLOCKS_SQLITE = (
    """CREATE TABLE IF NOT EXISTS answer_blocks (id INTEGER PRIMARY KEY,
        source_id TEXT NOT NULL, mechanism TEXT NOT NULL, params TEXT NOT NULL,
        seeded INTEGER NOT NULL, count INTEGER NOT NULL CHECK (count > 0),
        digests BLOB NOT NULL CHECK (length(digests) = 16 * count),
        labels BLOB NOT NULL CHECK (length(labels) = 8 * count),
        release_ids BLOB NOT NULL CHECK (length(release_ids) = 8 * count))""",
    """CREATE TRIGGER IF NOT EXISTS answer_blocks_no_update BEFORE UPDATE ON answer_blocks
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS answer_blocks_no_delete BEFORE DELETE ON answer_blocks
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)
#: (only where ``answers`` exists)
_ANSWERS_FROZEN_SQLITE = (
    """CREATE TRIGGER IF NOT EXISTS answers_moved BEFORE INSERT ON answers
        BEGIN SELECT RAISE(ABORT, 'answers moved to answer_blocks: upgrade agt'); END""",
)

# One statement each (sqlite3's executescript would COMMIT the open transaction first).
_ANSWER_SCHEMA = (
    """CREATE TABLE spend_totals (epsilon REAL NOT NULL, delta REAL NOT NULL,
        count INTEGER NOT NULL, PRIMARY KEY (epsilon, delta))""",
    """INSERT INTO spend_totals (epsilon, delta, count)
        SELECT epsilon, delta, COUNT(*) FROM releases GROUP BY epsilon, delta""",
    """CREATE TABLE client_totals (client TEXT NOT NULL, epsilon REAL NOT NULL,
        delta REAL NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (client, epsilon, delta))""",
    # key: the first 16 bytes of SHA-256(source id | mechanism | query hash); small keys
    # in one B-tree (no rowid) keep a commit's page writes few
    """CREATE TABLE answers (key BLOB PRIMARY KEY, label INTEGER NOT NULL,
        release_id INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE sessions (client TEXT NOT NULL, source_id TEXT NOT NULL,
        mechanism TEXT NOT NULL, params TEXT NOT NULL, release_id INTEGER NOT NULL,
        rho INTEGER NOT NULL, tops INTEGER NOT NULL,
        PRIMARY KEY (client, source_id, mechanism))""",
    *_IDEMPOTENCY_SQLITE,
    """CREATE TRIGGER answers_no_update BEFORE UPDATE ON answers
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER answers_no_delete BEFORE DELETE ON answers
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    *_CHARGE_RUNS_SQLITE,
    *_BLOCKS_SQLITE,
    *_ANSWERS_FROZEN_SQLITE,
)




#: the service's API keys in a PostgreSQL ledger (agt.service.keys.LedgerKeyStore): a hash,
#: never a key
API_KEYS_TABLE = ("""CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL UNIQUE CHECK (length(sha256) = 64),
        role TEXT NOT NULL CHECK (role IN ('owner', 'client')), name TEXT NOT NULL,
        budget_epsilon DOUBLE PRECISION CHECK (budget_epsilon > 0
            AND budget_epsilon < 'Infinity'::float8),
        budget_delta DOUBLE PRECISION CHECK (budget_delta >= 0 AND budget_delta < 1),
        created TEXT NOT NULL, revoked BOOLEAN NOT NULL DEFAULT FALSE)""")
#: the PostgreSQL ledger: every table created at once, on first open. The same columns as
#: SQLite's; ids of ``releases`` are given by the ledger (consecutive, under the budget lock)
_PG_APPEND_ONLY = ("releases", "rdp_charges", "data_dependent", "answers", "charge_runs",
                   "idempotency", "answer_blocks")
POSTGRES_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        format_version INTEGER NOT NULL,
        budget_epsilon DOUBLE PRECISION NOT NULL CHECK (budget_epsilon > 0),
        budget_delta DOUBLE PRECISION NOT NULL CHECK (budget_delta >= 0 AND budget_delta < 1),
        accountant TEXT NOT NULL,
        delta_prime DOUBLE PRECISION,
        per_query_epsilon DOUBLE PRECISION,
        per_query_delta DOUBLE PRECISION,
        relation TEXT NOT NULL,
        dataset_sha256 TEXT,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS releases (
        id BIGINT PRIMARY KEY,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        query_hash TEXT NOT NULL,
        mechanism TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        seeded INTEGER NOT NULL,
        note TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS rdp_charges (
        release_id BIGINT PRIMARY KEY REFERENCES releases (id),
        curve BYTEA NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS data_dependent (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('sanitised')),
        order_alpha DOUBLE PRECISION NOT NULL,
        value DOUBLE PRECISION NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL,
        release_id BIGINT NOT NULL REFERENCES releases (id),
        note TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS spend_totals (epsilon DOUBLE PRECISION NOT NULL,
        delta DOUBLE PRECISION NOT NULL, count BIGINT NOT NULL, PRIMARY KEY (epsilon, delta))""",
    """CREATE TABLE IF NOT EXISTS client_totals (client TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        count BIGINT NOT NULL, PRIMARY KEY (client, epsilon, delta))""",
    """CREATE TABLE IF NOT EXISTS answers (key BYTEA PRIMARY KEY, label INTEGER NOT NULL,
        release_id BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS charge_runs (id BIGINT PRIMARY KEY,
        count INTEGER NOT NULL CHECK (count > 0), time TEXT NOT NULL,
        source_id TEXT NOT NULL, mechanism TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL CHECK (epsilon > 0),
        delta DOUBLE PRECISION NOT NULL CHECK (delta >= 0 AND delta < 1),
        seeded INTEGER NOT NULL, note TEXT NOT NULL,
        query_hashes BYTEA NOT NULL CONSTRAINT charge_runs_hashes_length
            CHECK (length(query_hashes) = 32 * count))""",
    """CREATE TABLE IF NOT EXISTS answer_blocks (id BIGINT PRIMARY KEY,
        source_id TEXT NOT NULL, mechanism TEXT NOT NULL, params TEXT NOT NULL,
        seeded INTEGER NOT NULL, count INTEGER NOT NULL CHECK (count > 0),
        digests BYTEA NOT NULL CHECK (length(digests) = 16 * count),
        labels BYTEA NOT NULL CHECK (length(labels) = 8 * count),
        release_ids BYTEA NOT NULL CHECK (length(release_ids) = 8 * count))""",
    # random bytes do not compress: stored out of line as they are, no compression tried
    "ALTER TABLE charge_runs ALTER COLUMN query_hashes SET STORAGE EXTERNAL",
    "ALTER TABLE answer_blocks ALTER COLUMN digests SET STORAGE EXTERNAL",
    """CREATE TABLE IF NOT EXISTS sessions (client TEXT NOT NULL, source_id TEXT NOT NULL,
        mechanism TEXT NOT NULL, params TEXT NOT NULL, release_id BIGINT NOT NULL,
        rho INTEGER NOT NULL, tops INTEGER NOT NULL,
        PRIMARY KEY (client, source_id, mechanism))""",
    _IDEMPOTENCY_TABLE,
    API_KEYS_TABLE,

    """CREATE OR REPLACE FUNCTION agt_append_only() RETURNS trigger LANGUAGE plpgsql AS
        'BEGIN RAISE EXCEPTION ''the privacy ledger is append-only''; END'""",
    *(f"""CREATE OR REPLACE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}
        FOR EACH ROW EXECUTE FUNCTION agt_append_only()""" for table in _PG_APPEND_ONLY),
    # the answers moved to answer_blocks (SQLite's _ANSWERS_FROZEN_SQLITE says why)
    """CREATE OR REPLACE FUNCTION agt_answers_moved() RETURNS trigger LANGUAGE plpgsql AS
        'BEGIN RAISE EXCEPTION ''answers moved to answer_blocks: upgrade agt''; END'""",
    """CREATE OR REPLACE TRIGGER answers_moved BEFORE INSERT ON answers
        FOR EACH ROW EXECUTE FUNCTION agt_answers_moved()""",
)
#: every table of a PostgreSQL ledger (a database holding others is refused)
POSTGRES_TABLES = {"ledger_meta", "releases", "rdp_charges", "data_dependent", "spend_totals",
                   "client_totals", "answers", "sessions", "idempotency", "api_keys",
                   "charge_runs", "answer_blocks"}


# -- creation and comparison ---------------------------------------------------------------

def _check_given(given: dict) -> None:
    problems = privacy_problems("privacy ledger")
    if given["budget_epsilon"] is not None:
        check_epsilon(given["budget_epsilon"], problems, name="budget_epsilon")
    if given["budget_delta"] is not None:
        check_delta(given["budget_delta"], problems, name="budget_delta", allow_zero=True)
    if given["accountant"] is not None and given["accountant"] not in LEDGER_ACCOUNTANTS:
        problems.add(f"accountant must be one of {LEDGER_ACCOUNTANTS}, got "
                     f"{given['accountant']!r}")
    if given["relation"] is not None:
        check_relation(given["relation"], problems)
    if given["per_query_epsilon"] is not None:
        check_epsilon(given["per_query_epsilon"], problems, name="per_query_epsilon")
    if given["per_query_delta"] is not None:
        check_delta(given["per_query_delta"], problems, name="per_query_delta",
                    allow_zero=True)
    if given["delta_prime"] is not None:
        check_delta(given["delta_prime"], problems, name="delta_prime")
    sha = given["dataset_sha256"]
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
        problems.add(f"dataset_sha256 must be a 64-digit hex string, got {sha!r}")
    problems.raise_if_any()


def _read_meta(store, path: str, migrate: bool = False) -> dict | None:
    cursor = store.execute("SELECT * FROM ledger_meta")
    cols = [d[0] for d in cursor.description]
    row = cursor.fetchone()
    if row is None:
        return None
    meta = dict(zip(cols, row))
    if migrate and meta.get("format_version") in MIGRATES_FROM[store.kind]:
        # the changes since: the answering door's runs and blocks, tables created beside
        # the old ones (already created by the caller), and the runs' hashes as bytes (the
        # same hashes, converted in this transaction); the other rows stay as they are
        store.migrate_run_hashes()
        store.execute("UPDATE ledger_meta SET format_version = ?", (store.format_version,))
        meta["format_version"] = store.format_version
    newer_check(store, path, meta.get("format_version"))
    if meta.get("format_version") != store.format_version:
        raise PrivacyError(f"{path} is a ledger of format {meta.get('format_version')!r}; this "
                           f"code reads format {store.format_version} of {store.kind} ledgers "
                           f"(bound to one dataset and relation); start a new ledger "
                           f"({store.kind == 'SQLite' and 'file' or 'database'})")
    return meta


def run_hashes(hashes) -> bytes:
    """A run's query hashes as its ``query_hashes`` column holds them: each hash's 32
    bytes, in charge order.

    Args:
        hashes: 64-digit lowercase hex strings (`hash_query`).

    Returns:
        ``32 x len(hashes)`` bytes.

    Raises:
        PrivacyError: a hash that is not 64 hex digits.
    """
    joined = "".join(hashes)
    try:
        raw = bytes.fromhex(joined)
    except ValueError:
        raw = b""
    # lowercase only: the hashes read back (`Ledger.entries`) are the ones recorded
    if len(raw) != HASH_BYTES * len(hashes) or len(joined) != 64 * len(hashes) or \
            joined != joined.lower() or any(len(h) != 64 for h in hashes):
        raise PrivacyError("internal: a charge run's query hashes must be 64 lowercase hex "
                           "digits each")
    return raw


def run_hashes_from_json(text: str, count: int) -> bytes:
    """A run's query hashes as format 4 (SQLite) / 3 (PostgreSQL) and before stored them (a
    JSON array of 64-digit hex strings), as the bytes the formats after store.

    Args:
        text: the JSON array.
        count: the run's number of charges.

    Returns:
        The ``32 x count`` bytes of the hashes, in order.

    Raises:
        PrivacyError: the text is not `count` hashes (a damaged run: nothing is converted).
    """
    try:
        hashes = json.loads(text)
        raw = bytes.fromhex("".join(hashes))
        ok = isinstance(hashes, list) and len(hashes) == count and \
            all(isinstance(h, str) and len(h) == 64 for h in hashes)
    except (ValueError, TypeError):
        ok = False
    if not ok or len(raw) != HASH_BYTES * count:
        raise PrivacyError(f"a charge run of {count} charges does not hold {count} query "
                           f"hashes; the ledger is damaged (nothing was changed)")
    return raw


def newer_check(store, path: str, version) -> None:
    """Refuse a ledger written by a newer agt with a message that says so.

    Args:
        store: the ledger's store.
        path: its name, for the message.
        version: its stored ``format_version``.

    Raises:
        PrivacyError: `version` is above this code's.
    """
    if isinstance(version, int) and version > store.format_version:
        raise PrivacyError(f"{path} is a ledger of format {version}, written by a newer agt; "
                           f"this agt reads {store.kind} ledgers up to format "
                           f"{store.format_version}: upgrade agt (nothing was changed)")


def _create(store, path: str, given: dict) -> dict:
    eps_t = given["budget_epsilon"]
    if eps_t is None:
        raise PrivacyError(f"{path} is a new ledger: give its total budget (budget_epsilon, "
                           f"and budget_delta, default 0 for pure eps-DP releases)")
    delta_t = 0.0 if given["budget_delta"] is None else float(given["budget_delta"])
    pq_eps, pq_delta = given["per_query_epsilon"], given["per_query_delta"]
    if pq_eps is None and pq_delta is not None:
        raise PrivacyError("per_query_delta needs per_query_epsilon")
    if pq_eps is not None and pq_delta is None:
        pq_delta = 0.0
    accountant = given["accountant"] or ("standard" if pq_eps is None else "best")
    if accountant in _FIXED_ACCOUNTANTS and pq_eps is None:
        raise PrivacyError(
            f"the {accountant} accountant composes a sequence of per-query guarantees fixed in "
            f"advance, not epsilons chosen release by release: create the ledger with a fixed "
            f"per-query (epsilon, delta), or use the standard accountant")
    if accountant in ("standard", "rdp") and pq_eps is not None:
        pq_eps = pq_delta = None       # standard and Renyi composition need no fixed plan
    if accountant == "rdp" and delta_t == 0:
        raise PrivacyError("the rdp accountant converts Renyi curves to (eps, delta)-DP and "
                           "needs budget_delta > 0 (e.g. 1e-5); use 'standard' for a pure-eps "
                           "budget")
    delta_prime = given["delta_prime"]
    if accountant == "rdp" and delta_prime is not None:
        raise PrivacyError("the rdp accountant takes no delta_prime (its conversion uses the "
                           "whole budget_delta)")
    Accountant("standard" if accountant == "rdp" else accountant, delta_prime)
    if delta_prime is not None and delta_prime >= delta_t:
        raise PrivacyError(f"delta_prime={delta_prime!r} must be below budget_delta="
                           f"{delta_t!r}; lower delta_prime or leave it unset")
    if accountant == "advanced" and delta_t == 0:
        raise PrivacyError("the advanced accountant needs budget_delta > 0 (its slack delta' "
                           "comes out of it); use 'standard' for a pure-eps budget")
    if pq_eps is not None and (pq_eps > eps_t or pq_delta > delta_t):
        raise PrivacyError(f"the per-query guarantee ({pq_eps!r}, {pq_delta!r}) exceeds the "
                           f"total budget ({eps_t!r}, {delta_t!r})")
    meta = {"format_version": store.format_version, "budget_epsilon": float(eps_t),
            "budget_delta": delta_t, "accountant": accountant, "delta_prime": delta_prime,
            "per_query_epsilon": None if pq_eps is None else float(pq_eps),
            "per_query_delta": None if pq_delta is None else float(pq_delta),
            "relation": given["relation"] or REPLACE_ONE,
            "dataset_sha256": given["dataset_sha256"], "created": _now()}
    store.execute("INSERT INTO ledger_meta (id, " + ", ".join(meta) + ") VALUES (1, "
                 + ", ".join("?" * len(meta)) + ")", tuple(meta.values()))
    return meta


def _compare(path: str, meta: dict, given: dict) -> None:
    stored, new = meta.get("dataset_sha256"), given.get("dataset_sha256")
    if stored is not None and new is not None and stored != new:
        raise PrivacyError(f"the ledger {path} accounts for another private dataset; one ledger "
                           f"per private dataset (use that dataset's own ledger)")
    mismatch = []
    for key, value in given.items():
        if value is None:
            continue
        stored = meta.get(key)
        if key == "dataset_sha256" and stored is None:
            continue           # bound by the first release
        if key in ("per_query_epsilon", "per_query_delta") and \
                meta["accountant"] in ("standard", "rdp"):
            continue           # a standard ledger fixes no per-query guarantee
        if value != stored:
            mismatch.append(f"{key}={value!r} (stored {stored!r})")
    if mismatch:
        raise PrivacyError(f"{path} was created with other settings: {', '.join(mismatch)}; "
                           f"omit these arguments to use the stored values, or use another "
                           f"ledger file")



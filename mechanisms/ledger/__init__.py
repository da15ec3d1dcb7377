"""The privacy ledger: the one door from certified predictions to released labels.

A ledger is an SQLite file or a PostgreSQL database bound to one private dataset (its
sha256) and one neighbouring relation, with a total budget (eps_T, delta_T) and an
accountant (accounting.py). It holds an append-only table of what was charged.
`Ledger.release(mechanism, inputs)` is the only way to release:

  1. the mechanism checks the inputs (kind, classes, radii and their smoothness proof) and
     states its per-query guarantee under the ledger's relation (converted by group privacy
     where the inputs are certified under another relation, guarantee.py); inputs of another
     dataset are refused (the first release binds a ledger created without a dataset);
  2. the write lock (SQLite's BEGIN IMMEDIATE, or a row lock on PostgreSQL's meta row,
     stores.py): checks from concurrent processes are serialised (others wait up to
     `timeout` seconds);
  3. the accountant composes every recorded spend with the Q new ones; over (eps_T, delta_T):
     ROLLBACK and BudgetExceededError, nothing recorded, no noise drawn;
  4. INSERT one row per query and COMMIT (a batch is one transaction; the answering door
     records a request's charges as one row, a run of consecutive charge ids, which
     `Ledger.entries` lists charge by charge);
  5. only then the mechanism draws the noise, from the operating system's secure source
     unless an `insecure_*` argument (experiments) is given, which every row records.

So the recorded cost and the drawn noise come from the same object and cannot disagree, and
no answer leaves without its record. A crash after the commit loses the answer but keeps the
spend (budget spent, nothing released: the safe side); a crash before it leaves no trace.

Accountants. "standard" composition is valid for spends chosen adaptively, and so is "rdp":
every charge brings its Renyi curve on a fixed grid of orders (mechanisms/rdp.py: the
mechanism's own, or the pure-DP curve of an eps-DP one; an (eps, delta > 0) guarantee without a
curve is refused before anything is recorded), the curves add order by order, and the sum is
converted to (eps, delta_T) for the budget check (its own table `rdp_charges` holds each
charge's curve; `data_dependent` holds sanitised estimates of PATE's data-dependent costs,
mechanisms/pate_costs.py). "advanced",
"best" (the smaller of standard and advanced) and "tight" (PLD) compose a sequence fixed in
advance; such a ledger is created with a fixed per-query guarantee (per_query_epsilon,
per_query_delta) and charges every release at exactly that value (a release whose own
guarantee is smaller is charged the fixed value; a larger one is refused). Totals are rounded
up and compared without tolerance.

Files. An SQLite ledger runs in write-ahead-log mode with ``synchronous = FULL`` (set once the
file is known to be a ledger; the mode is kept in the file): a commit appends the
transaction to ``<ledger>-wal`` and syncs it before COMMIT returns, so every answer that
leaves was durable first (a kill -9 or a power loss after it loses nothing; an open replays
the log), at one sync per commit where the rollback journal took several (stores.py). The
log is copied back into the main file from time to time (a checkpoint, and when the last
connection closes), so **the main file alone may lack committed charges**: back up with
`backup_ledger` (``agt ledger backup``, SQLite's online backup: one consistent snapshot, safe
while serving) and restore with `restore_ledger` (``agt ledger restore``), never by copying
files (backup.py). ``-wal`` and ``-shm`` beside the file belong to it; processes on one
machine share the file through them (not over a network file system).

PostgreSQL (``Ledger.open("postgresql://user@host/db")``, psycopg 3, the ``postgres`` extra):
the same tables, API and semantics, shared by every process and machine that opens the URL
(replicas of `agt serve`); the write lock is a row lock on the one meta row, and stores.py
proves that no interleaving of writers can over-spend.

Where things are:

  records.py   what crosses the door: Release, Answered, AnswerRequest, LedgerEntry; hashes
  schema.py    the tables of both backends, the format versions, the settings checks
  stores.py    the backends (SqliteStore, PostgresStore): the write lock and its proof
  backup.py    backing up and restoring an SQLite ledger in use (SQLite's backup API)
  charge.py    THE charge path: the write transaction, the budget checks, the inserts
  answers.py   the answering door: answers cache, sessions, client budgets, idempotency;
               why the in-memory cache, caught up under the write lock, never re-releases
  index.py     the answers cache in memory: sorted digests and labels per namespace
  core.py      the Ledger class: opening, accounting reads, release, release_estimate
"""

from mechanisms.ledger.backup import backup_ledger, restore_ledger
from mechanisms.ledger.core import Ledger
from mechanisms.ledger.records import (
    Answered,
    AnswerRequest,
    IdempotencyError,
    LedgerEntry,
    Release,
    default_ledger_path,
    hash_queries,
    hash_query,
)
from mechanisms.ledger.schema import FORMAT_VERSION, LEDGER_ACCOUNTANTS, POSTGRES_FORMAT_VERSION
from mechanisms.ledger.stores import StoreError, is_url, postgres_ledger_exists

__all__ = ["Ledger", "Release", "LedgerEntry", "AnswerRequest", "Answered", "IdempotencyError",
           "StoreError", "postgres_ledger_exists", "hash_query", "hash_queries",
           "default_ledger_path", "is_url", "backup_ledger", "restore_ledger",
           "FORMAT_VERSION", "POSTGRES_FORMAT_VERSION", "LEDGER_ACCOUNTANTS"]

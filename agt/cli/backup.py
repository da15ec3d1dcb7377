"""``agt ledger``: back up and restore an SQLite ledger (mechanisms/ledger/backup.py).

    agt ledger backup LEDGER COPY      a copy of every committed charge, while serving
    agt ledger restore COPY LEDGER     with every process on LEDGER stopped

An SQLite ledger keeps recent commits in ``LEDGER-wal`` beside the file: copying the file
alone is not a backup, and copying a file over a ledger is not a restore (docs/operations.md,
"Backups"). A PostgreSQL ledger is backed up by the server's own tools.
"""

from __future__ import annotations

from agt.cli.format import non_empty


def add_parser(sub) -> None:
    p = sub.add_parser("ledger", help="back up or restore an SQLite privacy ledger (safe "
                       "while it is being written)")
    verbs = p.add_subparsers(dest="verb", required=True)
    b = verbs.add_parser("backup", help="copy every committed charge of a ledger, in use or "
                         "not, into a new file")
    b.add_argument("ledger", type=non_empty, help="the ledger file")
    b.add_argument("copy", type=non_empty, help="the new backup file (must not exist)")
    b.set_defaults(func=run_backup)
    r = verbs.add_parser("restore", help="write a backup into a ledger file (stop every "
                         "process serving from it first)")
    r.add_argument("copy", type=non_empty, help="the backup file (agt ledger backup)")
    r.add_argument("ledger", type=non_empty, help="the ledger file")
    r.set_defaults(func=run_restore)


def run_backup(args) -> int:
    from mechanisms.ledger.backup import backup_ledger

    n = backup_ledger(args.ledger, args.copy)
    print(f"backed up {args.ledger} to {args.copy}: {n} charges")
    return 0


def run_restore(args) -> int:
    from mechanisms.ledger.backup import restore_ledger

    n = restore_ledger(args.copy, args.ledger)
    print(f"restored {args.copy} into {args.ledger}: {n} charges")
    return 0

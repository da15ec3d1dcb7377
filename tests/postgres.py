"""A throwaway PostgreSQL database per test (the server on 127.0.0.1:5432, trust
authentication): created as ``agt_test_<random>``, dropped afterwards; the test is skipped,
with the reason, where no server answers or psycopg is missing."""

from __future__ import annotations

import os
import secrets

import pytest

#: where the development machines and CI run PostgreSQL (override: AGT_TEST_POSTGRES)
SERVER = os.environ.get("AGT_TEST_POSTGRES", "postgresql://127.0.0.1:5432")
_USERS = ("postgres", "root")


def _admin():
    """A connection to the server's ``postgres`` database, or a skip with the reason."""
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg is not installed (pip install -e '.[postgres]')")
    errors = []
    for user in _USERS:
        base = SERVER.replace("://", f"://{user}@", 1) if "@" not in SERVER else SERVER
        try:
            return psycopg.connect(f"{base}/postgres", autocommit=True, connect_timeout=3), base
        except psycopg.Error as exc:
            errors.append(str(exc).strip().splitlines()[0] if str(exc).strip() else "error")
    pytest.skip(f"no PostgreSQL server answers at {SERVER} ({'; '.join(errors)})")


class Databases:
    """Creates databases on demand; `drop_all` removes them (terminating their sessions)."""

    def __init__(self) -> None:
        self.admin, self.base = _admin()
        self.names: list[str] = []

    def new(self) -> str:
        name = f"agt_test_{secrets.token_hex(6)}"
        self.admin.execute(f"CREATE DATABASE {name}")
        self.names.append(name)
        return f"{self.base}/{name}"

    def drop_all(self) -> None:
        for name in self.names:
            self.admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
            self.admin.execute(f"DROP DATABASE IF EXISTS {name}")
        self.admin.close()


@pytest.fixture
def pg_databases():
    """A factory of fresh PostgreSQL databases (URLs), all dropped after the test."""
    dbs = Databases()
    try:
        yield dbs
    finally:
        dbs.drop_all()


@pytest.fixture
def postgres_url(pg_databases) -> str:
    """The URL of one fresh PostgreSQL database, dropped after the test."""
    return pg_databases.new()

"""API keys: a keys file with a wrongly typed entry is a clear start-up error (never a 500
later, never another client's failure); keys held in a PostgreSQL ledger are added, listed
and revoked by `agt keys --ledger URL`, and a row of the wrong kind refuses that key alone."""

from __future__ import annotations

import json

import pytest

from agt.errors import ConfigError
from agt.service.keys import KeyStore, LedgerKeyStore, open_keys
from tests.postgres import pg_databases, postgres_url  # noqa: F401  (fixtures)

GOOD = {"id": "0123456789ab", "sha256": "a" * 64, "role": "client", "name": "",
        "budget_epsilon": 2.0, "budget_delta": 0.0, "created": "", "revoked": False}


@pytest.mark.parametrize("change, says", [
    ({"sha256": None}, "sha256 that is not a string"),
    ({"sha256": "A" * 64}, "64 lower-case hex"),
    ({"budget_epsilon": "abc"}, "budget_epsilon 'abc'"),
    ({"budget_epsilon": float("nan")}, "budget_epsilon nan"),
    ({"budget_epsilon": True}, "budget_epsilon True"),
    ({"budget_epsilon": -1}, "budget_epsilon -1"),
    ({"budget_delta": 1.5}, "budget_delta 1.5"),
    ({"budget_epsilon": None}, "budget_delta without a budget_epsilon"),
    ({"role": "admin"}, "role 'admin'"),
    ({"role": "owner"}, "owner key with a budget"),
    ({"revoked": "no"}, "revoked 'no'"),
    ({"id": 7}, "id that is not a string"),
    ({"colour": "red"}, "unknown fields"),
])
def test_a_wrongly_typed_entry_is_a_clear_load_error(tmp_path, change, says):
    path = tmp_path / "keys.json"
    entries = [GOOD, {**GOOD, "id": "ba9876543210", "sha256": "b" * 64, **change}]
    path.write_text(json.dumps({"format": "agt-keys", "keys": entries}))
    with pytest.raises(ConfigError, match="key entry 2") as err:
        KeyStore.load(path)
    assert says in str(err.value)
    path.write_text(json.dumps({"format": "agt-keys", "keys": [GOOD, "junk"]}))
    with pytest.raises(ConfigError, match="not a JSON object"):
        KeyStore.load(path)


def test_serve_refuses_a_damaged_keys_file_at_start(tmp_path):
    from agt.cli.main import main

    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"format": "agt-keys",
                                "keys": [{**GOOD, "budget_epsilon": "abc"}]}))
    # refused before the bundle is read (it does not exist here): exit status 2, one line
    assert main(["serve", "--bounds", str(tmp_path / "missing.h5"), "--mechanism",
                 "exp-radius", "--epsilon", "1", "--ledger", str(tmp_path / "l.db"),
                 "--keys", str(path)]) == 2


def test_keys_in_a_postgres_ledger(postgres_url, capsys):  # noqa: F811
    from agt.cli.main import main
    from mechanisms import Ledger

    assert main(["keys", "add", "--ledger", postgres_url, "--role", "client",
                 "--budget-epsilon", "2", "--name", "dave"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1].split()[-1]
    store = open_keys(ledger=postgres_url)
    who = store.authenticate(key)
    assert who.role == "client" and who.budget == (2.0, 0.0)
    assert main(["keys", "list", "--ledger", postgres_url]) == 0
    listing = capsys.readouterr().out
    assert who.id in listing and key not in listing
    # the ledger created afterwards in the same database keeps the keys
    Ledger.open(postgres_url, 5.0).close()
    assert LedgerKeyStore(postgres_url).authenticate(key) == who
    assert main(["keys", "revoke", "--ledger", postgres_url, who.id]) == 0
    assert store.authenticate(key) is None                  # read afresh on every request
    assert main(["keys", "revoke", "--ledger", postgres_url, "nope"]) == 2
    with pytest.raises(SystemExit):                         # neither --keys nor --ledger
        main(["keys", "list"])
    with pytest.raises(ConfigError, match="PostgreSQL ledger"):
        open_keys(ledger="ledger.db")
    # a row the table's checks let through but the service's refuses (a delta budget
    # without an epsilon, written by hand): that key alone is refused, the others answer
    other, record = store.add("client", budget_epsilon=1.0)
    fine, _ = store.add("client")
    import psycopg
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE api_keys SET budget_epsilon = NULL, budget_delta = 0.5 WHERE "
                     "id = %s", (record.id,))
    assert store.authenticate(other) is None and store.authenticate(fine) is not None
    assert all(r.id != record.id for r in store.records)

"""``agt keys``: API keys of the prediction service (add, list, revoke).

    agt keys add (--keys FILE | --ledger URL) --role client|owner [--name NAME]
                 [--budget-epsilon E] [--budget-delta D]
    agt keys list (--keys FILE | --ledger URL)
    agt keys revoke (--keys FILE | --ledger URL) ID

``add`` prints the new key once; the store keeps only its hash (agt.service.keys). With
``--ledger postgresql://...`` the keys live in that ledger, shared by every replica of
``agt serve`` on it: a revocation reaches them all at their next request.
"""

from __future__ import annotations

from agt.cli.format import non_empty, positive_float, unit_float


def add_parser(sub) -> None:
    p = sub.add_parser("keys", help="API keys of agt serve: add, list, revoke")
    verbs = p.add_subparsers(dest="verb", required=True)
    add = verbs.add_parser("add", help="create a key (printed once; only its hash is kept)")
    _store_options(add)
    add.add_argument("--role", required=True, choices=("client", "owner"))
    add.add_argument("--name", default="", help="a note for whom the key is")
    add.add_argument("--budget-epsilon", type=positive_float,
                     help="this client's own epsilon budget (the dataset's ledger caps every "
                          "client together)")
    add.add_argument("--budget-delta", type=unit_float, help="this client's own delta budget")
    add.set_defaults(func=run_add)
    ls = verbs.add_parser("list", help="list the keys (ids, roles, budgets; never the keys)")
    _store_options(ls)
    ls.set_defaults(func=run_list)
    rv = verbs.add_parser("revoke", help="revoke a key by its id")
    _store_options(rv)
    rv.add_argument("id", help="the key's id (agt keys list)")
    rv.set_defaults(func=run_revoke)


def _store_options(parser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--keys", type=non_empty, help="the keys file (a JSON file)")
    where.add_argument("--ledger", type=non_empty,
                       help="a PostgreSQL ledger (postgresql://...) that holds the keys of "
                            "every replica serving from it")


def _where(args) -> str:
    return args.keys if args.keys else args.ledger.split("@")[-1]


def run_add(args) -> int:
    from agt.service.keys import open_keys

    store = open_keys(args.keys, args.ledger, create=True)
    key, record = store.add(args.role, name=args.name, budget_epsilon=args.budget_epsilon,
                            budget_delta=args.budget_delta)
    store.save()
    budget = ("" if record.budget_epsilon is None else
              f", budget ({record.budget_epsilon:g}, {record.budget_delta:g})")
    print(f"added {record.role} key {record.id}{budget} to {_where(args)}")
    print(f"key (shown once, not stored): {key}")
    return 0


def run_list(args) -> int:
    from agt.service.keys import open_keys

    store = open_keys(args.keys, args.ledger)
    print(f"{'id':<14}{'role':<8}{'budget':<22}{'revoked':<9}{'created':<27}name")
    for r in store.records:
        budget = "-" if r.budget_epsilon is None else f"({r.budget_epsilon:g}, {r.budget_delta:g})"
        print(f"{r.id:<14}{r.role:<8}{budget:<22}{'yes' if r.revoked else 'no':<9}"
              f"{r.created:<27}{r.name}")
    return 0


def run_revoke(args) -> int:
    from agt.service.keys import open_keys

    store = open_keys(args.keys, args.ledger)
    record = store.revoke(args.id)
    store.save()
    print(f"revoked {record.role} key {record.id}")
    return 0

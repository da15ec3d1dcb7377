"""``agt serve``: answer prediction queries over HTTP through the ledger (a release service).

    agt serve --bounds FILE.h5 | --ensemble DIR --mechanism NAME --epsilon E [--delta D]
              --ledger FILE.db|postgresql://... [--budget-epsilon E_T] [--budget-delta D_T]
              [--keys FILE] [--host 127.0.0.1] [--port 8000]

Every label goes through `mechanisms.Ledger.answer_batch`: charged and recorded (with the
label, so a retry of the same query is answered again at no charge) before it leaves. The
service listens on loopback by default; put a TLS proxy in front to serve further
(docs/service.md). Needs the ``serve`` extra (FastAPI, uvicorn, httpx). Several processes
serving one bundle from one PostgreSQL ledger (``--ledger postgresql://...``, the
``postgres`` extra) share its budgets, answers, sessions and keys (``agt keys --ledger``;
``--keys FILE`` is needed for an SQLite ledger).
"""

from __future__ import annotations

from agt.cli.format import (
    add_mechanism_options,
    mechanism_options,
    non_empty,
    positive_float,
    positive_int,
    unit_float,
)


def add_parser(sub) -> None:
    from mechanisms import Certified, Votes, mechanism_names

    names = mechanism_names(Certified) + mechanism_names(Votes)
    p = sub.add_parser("serve", help="answer prediction queries over HTTP through the ledger "
                       "(a release service)",
                       description="Serve private predictions: labels and their guarantee "
                                   "only, every one charged to the ledger before it leaves.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--bounds", type=non_empty, help="a bundle (.h5): single-model "
                        "mechanisms")
    source.add_argument("--ensemble", type=non_empty, help="an ensemble directory: ensemble "
                        "mechanisms")
    p.add_argument("--mechanism", required=True, choices=names)
    p.add_argument("--epsilon", required=True, type=positive_float,
                   help="per-query epsilon (svt, ens-svt: of each session)")
    p.add_argument("--delta", type=unit_float, help="per-query delta of (eps, delta) mechanisms")
    p.add_argument("--ledger", required=True, type=non_empty,
                   help="the dataset's ledger: an SQLite file, or a PostgreSQL URL "
                        "(postgresql://user@host/db) shared by replicas; created if missing")
    p.add_argument("--budget-epsilon", type=positive_float,
                   help="total epsilon of a new ledger (every client together)")
    p.add_argument("--budget-delta", type=unit_float, help="total delta of a new ledger")
    p.add_argument("--accountant", choices=("standard", "best", "advanced", "tight"),
                   help="composition of a new ledger (default standard)")
    p.add_argument("--relation", choices=("replace-one", "add-remove"),
                   help="neighbouring relation of a new ledger (default replace-one)")
    p.add_argument("--keys", type=non_empty,
                   help="the API keys file (agt keys add --keys FILE ...); needed with an "
                        "SQLite ledger; a PostgreSQL ledger holds its own keys by default")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "loopback; put a TLS proxy in front to serve beyond it)")
    p.add_argument("--port", type=positive_int, default=8000)
    p.add_argument("--max-queries", type=positive_int, default=10_000,
                   help="most queries per request (default 10000)")
    p.add_argument("--max-body-bytes", type=positive_int, default=8 << 20,
                   help="largest request body (default 8 MiB)")
    p.add_argument("--max-connections", type=positive_int, default=256,
                   help="requests served at once; more get a JSON 503 (default 256)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    add_mechanism_options(p, ensembles=True)
    p.set_defaults(func=run)


def run(args) -> int:
    from agt.errors import ConfigError

    try:
        import fastapi  # noqa: F401
        import uvicorn

        from agt.service.protocol import http_protocol
    except ImportError:
        raise ConfigError('agt serve needs the serve extra: pip install -e ".[serve]"') from None
    from agt.service.app import create_app
    from agt.service.keys import KeyStore, open_keys
    from agt.service.server import PredictionService
    from mechanisms import make_mechanism

    mechanism = make_mechanism(args.mechanism, args.epsilon, args.delta,
                               **mechanism_options(args))
    from mechanisms.ledger import is_url

    if args.keys is None and not is_url(args.ledger):
        raise ConfigError("an SQLite ledger's service needs its keys file: --keys FILE "
                          "(agt keys add --keys FILE ...)")
    if args.keys is not None:
        KeyStore.load(args.keys)     # refuse a missing or malformed keys file before anything
        keys = args.keys
    else:
        keys = open_keys(ledger=args.ledger)     # the ledger's keys, shared by replicas
    if args.bounds:
        from agt.store import read_bundle
        source = read_bundle(args.bounds)
    else:
        from agt.ensemble import read_ensemble
        source = read_ensemble(args.ensemble)
    service = PredictionService(source, mechanism, args.ledger,
                                budget_epsilon=args.budget_epsilon,
                                budget_delta=args.budget_delta, accountant=args.accountant,
                                relation=args.relation, device=args.device)
    app = create_app(service, keys, max_body_bytes=args.max_body_bytes,
                     max_queries=args.max_queries, max_connections=args.max_connections)
    g = service.guarantee
    print(f"serving {mechanism.name} ({g.epsilon:.6g}, {g.delta:.3g})-DP per "
          f"{'query' if mechanism.per_query else 'session'} w.r.t. {g.relation} on "
          f"http://{args.host}:{args.port}/v1 (ledger {service.ledger_name}); Ctrl-C stops",
          flush=True)
    # (the app limits the requests served at once: uvicorn's own limit answers plain text;
    # the loop is uvloop where the serve extra installed it)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                http=http_protocol())
    return 0

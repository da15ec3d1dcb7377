"""Formatting and argument helpers shared by the commands (the only printing code)."""

from __future__ import annotations

import argparse
import math
from typing import Sequence

from agt.certify.certificate import summary_ks  # noqa: F401  (the commands import it here)


def certified_fractions(frac: dict[int, float], k_values: Sequence[int], label: str = "") -> str:
    return "\n".join(f"  k={k:<6d} {label}{frac[k]:.4f}" for k in summary_ks(k_values))


def guarantee_line(n: int, mechanism: str, guarantee, extra: str = "",
                   per_query: bool = True) -> str:
    scope = "each" if per_query else "the whole session"
    return (f"released {n} labels with {mechanism}{extra}: {scope} ({guarantee.epsilon:.6g}, "
            f"{guarantee.delta:.3g})-DP w.r.t. {guarantee.relation}")


def charge_note(released) -> str | None:
    """A line when the ledger charged more than the release's own guarantee (a ledger with
    a fixed per-query guarantee charges every release that much: a new user's review saw
    "each (0.5, 0)-DP" printed where the ledger recorded 1.0 per query)."""
    g = released.guarantee
    if (released.charged_epsilon, released.charged_delta) == (g.epsilon, g.delta):
        return None
    scope = "each query" if released.per_query else "the session"
    return (f"the ledger charged {scope} ({released.charged_epsilon:.6g}, "
            f"{released.charged_delta:.3g}): its fixed per-query guarantee, above this "
            f"release's own")


def ledger_line(ledger, named: bool) -> str:
    """The budget line of a release. A default ledger is not named: its file name is a
    keyed hash of the private dataset's hash, the same for every release from one dataset
    and another for a neighbouring one, which a release output must not carry."""
    spent = ledger.spent()
    where = f"ledger {ledger.path}" if named else "the dataset's default ledger"
    return (f"{where}: spent eps={spent.epsilon:.6g}, delta={spent.delta:.3g} "
            f"({spent.method}) of the budget ({ledger.budget_epsilon:.6g}, "
            f"{ledger.budget_delta:.3g}); relation {ledger.relation}")


# -- argparse types: bad values become argparse's one-line usage error (exit 2) ------------

def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0 or value >= 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**32), got {text}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def unit_float(text: str) -> float:
    """A delta: a number in [0, 1)."""
    value = finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


def non_empty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return text


# -- mechanism options -------------------------------------------------------------------

def add_mechanism_options(p, ensembles: bool) -> None:
    """Options of particular mechanisms (given only where they apply); --radius-rule only
    where ensemble mechanisms can be chosen."""
    p.add_argument("--cutoff", type=positive_int,
                   help="svt / ens-svt: unstable queries a session answers by its fallback "
                        "before it refuses the rest (default 10)")
    p.add_argument("--fallback", choices=("exp-radius", "refuse"),
                   help="svt / ens-svt: the answer of an unstable query (default exp-radius)")
    if ensembles:
        p.add_argument("--threshold", type=non_negative_float, metavar="T",
                       help="confident-gnmax: answer only where the noisy top vote count "
                            "reaches T (default: half the teachers)")
        p.add_argument("--radius-rule", choices=("thm5.3", "tight"),
                       help="ens-ss-*: ensemble radius, min-cost (default) or AGT Thm 5.3 "
                            "(the paper's, m - 1 smaller)")


def mechanism_options(args) -> dict:
    """The options given for the chosen mechanism; an option it does not take is an error."""
    from agt.errors import ConfigError

    takes = {"cutoff": ("svt", "ens-svt"), "fallback": ("svt", "ens-svt"),
             "radius_rule": ("ens-ss-laplace", "ens-ss-cauchy"),
             "threshold": ("confident-gnmax",)}
    out = {}
    for key, names in takes.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        if args.mechanism not in names:
            raise ConfigError(f"--{key.replace('_', '-')} applies to {', '.join(names)}, not "
                              f"{args.mechanism}")
        out[key] = value
    return out


def add_release_options(p, out_help: str, accountant_help: str, ensembles: bool) -> None:
    """The options every release command shares: ledger, relation, seed, output and the
    check before spending (--out is required unless --dry-run: `require_out`)."""
    p.add_argument("--ledger", type=non_empty,
                   help="SQLite privacy ledger (default: the private dataset's own ledger "
                        "under $AGT_LEDGER_DIR or ~/.agt/ledgers); created if missing")
    p.add_argument("--accountant", choices=("standard", "best", "advanced", "tight", "rdp"),
                   help=accountant_help)
    p.add_argument("--relation", choices=("replace-one", "add-remove"),
                   help="neighbouring relation of a new ledger (default replace-one)")
    p.add_argument("--insecure-seed", type=non_negative_int, metavar="N",
                   help="EXPERIMENTS ONLY: seed the noise (anyone who knows N can remove it); "
                        "recorded in the ledger; the output says only that the noise was seeded")
    p.add_argument("--out", type=non_empty, help=out_help + " (required unless --dry-run)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    add_spend_check_options(p)
    add_mechanism_options(p, ensembles)


def require_out(args) -> None:
    """A release writes --out; only a dry run goes without it."""
    from agt.errors import ConfigError

    if args.out is None and not args.dry_run:
        raise ConfigError("give --out (the release's output file), or --dry-run to plan "
                          "without releasing")


# -- release plans (owner-only) ------------------------------------------------------------

OWNER_ONLY_NOTE = ("OWNER-ONLY: this plan is a function of the radii and votes of your private "
                   "data; do not publish it. Choosing a mechanism by it is a data-dependent "
                   "choice (docs/privacy.md: plan on public queries or a public surrogate).")


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plan_table(rows) -> str:
    """The rows of a release plan (`mechanisms.release_plan.PlanRow`) as a text table."""
    head = (f"{'mechanism':<16}{'accountant':<11}{'eps/query':>11}{'delta/query':>12}"
            f"{'answered':>10}{'agreement':>11}{'accuracy':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        e = r.expectation
        eps_label = f"{r.epsilon_per_query:.4g}" + ("" if r.per_query else "*")
        acc = _cell(e.accuracy, ".4f")
        if e.law != "exact":
            acc += f" (+-{e.standard_error:.3f} MC)"
        lines.append(f"{r.mechanism:<16}{r.accountant:<11}{eps_label:>11}"
                     f"{r.delta_per_query:>12.3g}{e.answered:>10.4f}{e.agreement:>11.4f}"
                     f"{acc:>10}" + ("  refused" if r.refused else ""))
    if any(not r.per_query for r in rows):
        lines.append("* a session: one (eps, delta) for all its queries")
    if any(r.refused for r in rows):
        lines.append("refused: the check before spending refuses it (answers too little, or "
                     "a threshold above the grid's largest radius) unless --force")
    return "\n".join(lines)


def plan_text(plan) -> str:
    """A `mechanisms.release_plan.ReleasePlan` as the owner reads it."""
    head = (f"release plan for B = {plan.n_queries} queries within ({plan.epsilon_total:.6g}, "
            f"{plan.delta_total:.3g})-DP w.r.t. {plan.relation}; expectations (exact laws) on "
            f"{plan.n_sample} sample queries"
            + ("" if plan.labelled else "; no labels: accuracy not computed"))
    parts = [OWNER_ONLY_NOTE, head, plan_table(plan.rows)]
    if plan.skipped:
        parts.append("not applicable: " + "; ".join(
            f"{name} ({why.removeprefix(name.split('/')[0] + ': ')})"
            for name, why in plan.skipped))
    parts.append(("recommended: " if plan.recommended is not None else "") + plan.reason)
    return "\n".join(parts)


def add_spend_check_options(p) -> None:
    """--dry-run, --min-answered and --force of the owner's release commands."""
    p.add_argument("--dry-run", action="store_true",
                   help="print this release's plan (owner-only: expected answered fraction, "
                        "agreement, accuracy) and stop: nothing is charged, no ledger created")
    p.add_argument("--min-answered", type=fraction, default=0.05, metavar="F",
                   help="refuse, before charging, a release expected to answer less than "
                        "this fraction of its queries, or whose svt / ptr threshold is above "
                        "the largest radius of the k grid (default 0.05)")
    p.add_argument("--force", action="store_true",
                   help="release even when the check before spending refuses it")


def fraction(text: str) -> float:
    """A fraction in [0, 1]."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value

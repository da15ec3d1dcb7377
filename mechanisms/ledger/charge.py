"""The charge path: the one place where a spend is checked and committed.

Every charge of a ledger -- `Ledger.release`, `Ledger.release_estimate` and the answering
door (`Ledger.answer_batch`) -- goes through `ChargePath._writing` (one write transaction
under the ledger's write lock, stores.py), and inside it through `_check_budget` (the
accountant composes every recorded spend with the new ones; over the budget: nothing is
written) and then `_insert_charges` (the rows, their Renyi curves, the running totals). The
budget check and the rows it admits are in one transaction, so no other writer can spend
in between (the proof is in stores.py); a failure anywhere rolls every row back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms.accounting import Composition
from mechanisms.ledger.records import _Charge, _now
from mechanisms.ledger.schema import HASH_BYTES
from mechanisms.ledger.stores import StoreError
from mechanisms.rdp import curve_to_bytes


class ChargePath:
    """The write transaction, the budget checks and the inserts of `Ledger` (a mixin: the
    accounting reads it uses live in core.py)."""

    @contextlib.contextmanager
    def _writing(self, pipelined: bool = False):
        """One write transaction (the ledger's write lock: concurrent processes are
        serialised): committed when the block ends, rolled back when it raises; a database
        error is a PrivacyError saying that nothing was released. `pipelined`: the store
        may queue the statements whose results are not read (`write`) until the next read
        or the commit (PostgreSQL's pipeline mode)."""
        db = self._db
        try:
            db.begin_write(pipelined)
        except StoreError as exc:
            db.rollback()
            raise PrivacyError(f"cannot write the privacy ledger {self.path} ({exc}); "
                               f"nothing was released") from None
        try:
            yield db
            db.commit()
        except StoreError as exc:
            db.rollback()
            raise PrivacyError(f"cannot write the privacy ledger {self.path} ({exc}); "
                               f"nothing was released") from None
        except BaseException:
            db.rollback()
            raise

    def _bind_dataset(self, dataset_sha256: str) -> bool:
        """Inside a write transaction: refuse inputs of another dataset than the ledger's;
        returns whether the ledger is still unbound (the first charge binds it)."""
        bound = self._db.read_dataset()
        if bound is not None and bound != dataset_sha256:
            raise PrivacyError(   # no hashes: they identify the private datasets
                f"the ledger {self.path} accounts for another dataset than these inputs "
                f"come from: one ledger per private dataset (use that dataset's own ledger)")
        return bound is None

    def _commit(self, charges: Sequence[_Charge], dataset_sha256: str,
                curve: tuple[float, ...] | None = None) -> list[int]:
        """Check the budget and record `charges` in one transaction (no draw here); returns
        the new rows' ids."""
        with self._writing() as db:
            unbound = self._bind_dataset(dataset_sha256)
            # one release charges every query (or its one session) the same (eps, delta)
            self._check_budget(charges[0].epsilon, charges[0].delta, len(charges), curve)
            if unbound:
                db.bind_dataset(dataset_sha256)
            ids = self._insert_charges(charges, curve)
        self._dataset = dataset_sha256
        return ids

    def _insert_charges(self, charges: Sequence[_Charge], curve: tuple[float, ...] | None,
                        client: str = "") -> list[int]:
        """Inside a write transaction, after the budget checks: the rows, their curves (an
        rdp ledger) and the running totals (where the answering door keeps them)."""
        db, now = self._db, _now()
        ids = db.insert_releases([(now, c.source_id, c.query_hash, c.mechanism,
                                   float(c.epsilon), float(c.delta), int(c.seeded), c.note)
                                  for c in charges])
        if self.is_rdp:
            blob = curve_to_bytes(curve)
            db.executemany("INSERT INTO rdp_charges (release_id, curve) VALUES (?, ?)",
                           [(i, blob) for i in ids])
        if self._has_totals():
            self._add_totals(charges[0].epsilon, charges[0].delta, len(charges), client)
        return ids

    def _add_totals(self, epsilon: float, delta: float, count: int, client: str = "") -> None:
        """Add `count` charges of (epsilon, delta) to the running totals (and the client's):
        integer counts per exact (epsilon, delta), summed by the accountant only."""
        self._db.add_totals(epsilon, delta, count, client)

    def _check_budget(self, epsilon: float, delta: float, count: int,
                      curve: tuple[float, ...] | None = None) -> None:
        """Raise BudgetExceededError unless `count` more charges of (epsilon, delta) (of
        `curve` in an rdp ledger) fit what is left, saying what is spent and how many of them
        would fit."""
        if self.is_rdp:
            recorded_curves = self._recorded_curves()
            recorded = [(0.0, 0.0, c) for _, c in recorded_curves]

            def total(m: int) -> Composition:
                return self._compose_curves(recorded_curves + ([(curve, m)] if m else []))
        else:
            recorded = self._recorded_groups()

            def total(m: int) -> Composition:
                return self._compose(recorded + ([(epsilon, delta, m)] if m else []))

        over = total(count)
        if over.fits(self.budget_epsilon, self.budget_delta):
            return

        def fits(m: int) -> bool:
            return total(m).fits(self.budget_epsilon, self.budget_delta)

        # the most that fit (composition is monotone in the number of charges): doubling,
        # then bisection, so the compositions stay near the answer's size (a PLD of 10^6
        # charges takes seconds)
        lo, hi = 0, 1
        # (not under `tight`: its exact check costs about a second per composition there)
        exact_count = self.accountant.name != "tight"
        while exact_count and hi < count and fits(hi):
            lo, hi = hi, min(2 * hi, count)
        while exact_count and lo + 1 < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        spent = total(0)
        if self.per_query is not None:
            advice = (f"this ledger charges every query its fixed ({self.per_query[0]!r}, "
                      f"{self.per_query[1]!r}) whatever the mechanism's own guarantee; "
                      + (f"at most {lo} such queries fit now" if exact_count else
                         "release fewer queries"))
        elif lo == 0 and recorded:
            advice = "not one of these charges fits what is left"
        elif count == 1:
            advice = "lower the session's epsilon (or delta)"
        else:
            advice = (f"at most {lo} of these queries fit; release fewer or lower the per-query "
                      f"epsilon (or delta)")
        raise BudgetExceededError(
            f"{count} release(s) at (eps={epsilon!r}, delta={delta!r}) each would bring the "
            f"total to (eps={over.epsilon!r}, delta={over.delta!r}) under {over.method} "
            f"composition, over the budget (eps={self.budget_epsilon!r}, "
            f"delta={self.budget_delta!r}) of which (eps={spent.epsilon!r}, "
            f"delta={spent.delta!r}) is spent; nothing was released: {advice}")

    def _client_groups(self, client: str) -> list[tuple[float, float, int]]:
        return self._db.client_groups(client)

    def _client_total(self, recorded: list[tuple[float, float, int]], budget_delta: float,
                      epsilon: float, delta: float, count: int) -> Composition:
        """A client's recorded charge groups and `count` new charges of (epsilon, delta),
        composed by the ledger's accountant at the client's delta budget: the one composition
        that both the charge (`_check_client_budget`) and its pre-check (`client_fits`) ask."""
        return self.accountant.compose_groups(
            sorted(recorded + [(float(epsilon), float(delta), int(count))]),
            delta_budget=float(budget_delta))

    def client_fits(self, client: str, budget: tuple[float, float], n_charges: int,
                    epsilon: float, delta: float = 0.0) -> bool:
        """Would `n_charges` more charges of (epsilon, delta) fit the client's own budget now?
        (Advisory, like `fits`: the answering door re-checks inside its write transaction.)

        The answer is the charge path's own (`_check_client_budget`): the client's recorded
        charge groups and the new ones, composed by the ledger's accountant by the same
        function and compared with the budget by the same `Composition.fits`. Over the same
        recorded charges both give the same answer, so a client refused here would be refused
        by the charge too. Recorded charges are only ever added to, and every accountant's
        total grows with them, so a False stays False for as long as the budget is the same.

        Args:
            client: the client's id (an API key's id).
            budget: its own (epsilon, delta) budget.
            n_charges: the number of new charges.
            epsilon: each charge's epsilon (`charge_for`).
            delta: each charge's delta.

        Returns:
            Whether they fit the client's budget (the dataset's is `fits`'s to say).

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        recorded = self._client_groups(client) if self._table_exists("client_totals") else []
        return self._client_total(recorded, budget[1], epsilon, delta, n_charges).fits(
            float(budget[0]), float(budget[1]))

    def _check_client_budget(self, client: str, budget: tuple[float, float], epsilon: float,
                             delta: float, count: int) -> None:
        """Raise BudgetExceededError unless `count` more charges fit the client's own budget
        (composed by the ledger's accountant, like the ledger's)."""
        recorded = self._client_groups(client)
        eps_b, delta_b = float(budget[0]), float(budget[1])
        total = self._client_total(recorded, delta_b, epsilon, delta, count)
        if total.fits(eps_b, delta_b):
            return
        spent = self.accountant.compose_groups(sorted(recorded), delta_budget=delta_b) \
            if recorded else None
        raise BudgetExceededError(
            f"client {client}: {count} charge(s) at (eps={epsilon!r}, delta={delta!r}) would "
            f"bring its total to (eps={total.epsilon!r}, delta={total.delta!r}), over its "
            f"budget (eps={eps_b!r}, delta={delta_b!r}) of which (eps="
            f"{0.0 if spent is None else spent.epsilon!r}, delta="
            f"{0.0 if spent is None else spent.delta!r}) is spent; nothing was released")

    def _record(self, item, hashes: bytes, count: int, seeded: bool,
                note: str) -> list[int]:
        """The answering door's charge: `count` charges, one per query hash (`hashes`: their
        32 bytes each, in order, as `run_hashes` gives them), after the dataset's and the
        client's budget checks (inside `answer_batch`'s write transaction), recorded as one
        ``charge_runs`` row; returns their ids."""
        request = item.request
        eps, delta = float(item.eps_c), float(item.delta_c)
        self._check_budget(eps, delta, count)
        if request.client_budget is not None:
            self._check_client_budget(request.client, request.client_budget, eps, delta,
                                      count)
        # one row for the request's charges (a run of consecutive ids): the same charges,
        # budget checks and totals as one row each, in fewer durable writes
        if not isinstance(hashes, bytes) or len(hashes) != HASH_BYTES * count:
            raise PrivacyError("internal: a run's hashes and its count differ")
        first = self._db.insert_run((int(count), _now(), request.inputs.source.source_id,
                                     request.mechanism.name, eps, delta, int(seeded), note,
                                     hashes))
        self._add_totals(eps, delta, count, request.client)
        return list(range(first, first + count))

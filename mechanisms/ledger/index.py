"""The answers cache in memory: per namespace, sorted arrays of 16-byte query digests and
their released labels, kept in step with the ledger's ``answer_blocks`` table.

A namespace is (source id, mechanism name, the mechanism's parameters ``repr``, seeded): a
label released by one mechanism at one (epsilon, delta) is served again only to a request of
the same mechanism with the same parameters, noise of the same kind (seeded test noise never
meets secure noise) and the same source. Within a namespace a query is its digest: the first
16 bytes of its hash (`hash_query`, SHA-256), so no second hash is computed.

Each namespace holds a few log-structured segments (a sorted ``S16`` array of digests and an
``int64`` array of labels each): a new batch of answers is one more segment, and the last
two are merged while the older is less than twice the newer, so there are O(log n) segments
and each answer is merged O(log n) times. A segment also holds each digest's first 8 bytes as
an integer, the key its lookups search by (`_Space.lookup`). Memory: 32 bytes per answer (16
of digest, 8 of prefix, 8 of label), plus a merge's temporary copy of the segments it
merges. No Python object per answer.

The index decides releases only inside the ledger's write transaction, after its lock is
held and after `AnswerIndex.catch_up` has read every block committed since the last one it
saw (the argument is in answers.py); answers of a transaction are added only once it
committed (`add`), so a rollback leaves nothing here.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from agt.errors import PrivacyError

#: a digest: the first 16 bytes of a query's SHA-256
DIGEST = np.dtype("S16")
#: an answer block's labels and release ids: little-endian int64 each
BLOCK_INT = np.dtype("<i8")


def hash_bytes_of(hashes: Sequence[str]) -> NDArray:
    """The bytes of query hashes (64 lowercase hex digits each, `hash_query`'s), at once.

    Args:
        hashes: the queries' hashes.

    Returns:
        A (n, 32) ``uint8`` array: per hash, the 32 bytes it encodes (a charge run's
        ``query_hashes`` are its rows' bytes, in order; a digest is a row's first 16).

    Raises:
        PrivacyError: a hash that is not 64 lowercase hex digits.
    """
    joined = "".join(hashes)
    n = len(hashes)
    try:
        # every hash 64 characters (together 64 n), lowercase, hex digits only (unhexlify
        # takes no other character)
        if len(joined) != 64 * n or joined != joined.lower() or \
                (n and set(map(len, hashes)) != {64}):
            raise ValueError
        raw = binascii.unhexlify(joined)
    except (ValueError, binascii.Error):
        raise PrivacyError("the answering door keeps answers by their queries' hashes: "
                           "inputs.query_ids must be 64 lowercase hex digits each "
                           "(hash_query / hash_queries of the query's bytes)") from None
    return np.frombuffer(raw, dtype=np.uint8).reshape(n, 32)


def digests_of(hashes: Sequence[str] | NDArray) -> NDArray:
    """The digests of query hashes (`hash_bytes_of`'s checks), at once.

    Args:
        hashes: the queries' hashes, or their bytes as `hash_bytes_of` returns them.

    Returns:
        An ``S16`` array: per hash, the first 16 bytes it encodes.

    Raises:
        PrivacyError: a hash that is not 64 lowercase hex digits.
    """
    full = hashes if isinstance(hashes, np.ndarray) else hash_bytes_of(hashes)
    return np.ascontiguousarray(full[:, :16]).view(DIGEST).reshape(len(full))


def _prefixes(digests: NDArray) -> NDArray:
    """Each ``S16`` digest's first 8 bytes as a number (big-endian, so the numbers sort as
    the digests do): a search key that numpy compares as one integer, not 16 bytes."""
    raw = np.ascontiguousarray(digests).view(np.uint8).reshape(len(digests), 16)
    return np.ascontiguousarray(raw[:, :8]).view(">u8").reshape(len(digests)).astype(np.uint64)


class _Space:
    """One namespace's segments (sorted digests, their prefixes, their labels), newest
    last."""

    __slots__ = ("segments",)

    def __init__(self) -> None:
        self.segments: list[tuple[NDArray, NDArray, NDArray]] = []

    def add(self, digests: NDArray, labels: NDArray) -> None:
        order = np.argsort(digests, kind="stable")
        self.segments.append((digests[order], _prefixes(digests[order]), labels[order]))
        while len(self.segments) > 1 and \
                len(self.segments[-2][0]) < 2 * len(self.segments[-1][0]):
            (d1, p1, l1), (d2, p2, l2) = self.segments[-2], self.segments[-1]
            d, pre, lab = np.concatenate((d1, d2)), np.concatenate((p1, p2)), \
                np.concatenate((l1, l2))
            order = np.argsort(d, kind="stable")
            self.segments[-2:] = [(d[order], pre[order], lab[order])]

    def lookup(self, digests: NDArray, found: NDArray, labels: NDArray) -> None:
        """Mark `found` and set `labels` for every digest held (exactly: a match is a
        digest equal in all 16 bytes).

        The search runs on the prefixes (the first 8 bytes): a segment's prefixes are sorted
        with its digests, so the first position whose prefix is not below a digest's is the
        first of its digests that share the prefix; where that one is another digest (two
        held digests with one prefix, about n^2 / 2^65 of them), those few digests are
        searched again by all 16 bytes."""
        if not len(digests):
            return
        wanted = _prefixes(digests)
        for keys, prefixes, values in self.segments:
            pos = np.searchsorted(prefixes, wanted)
            np.minimum(pos, len(keys) - 1, out=pos)
            same = prefixes[pos] == wanted
            equal = same & (keys[pos] == digests)
            other = np.flatnonzero(same & ~equal & ~found)
            if len(other):
                again = np.minimum(np.searchsorted(keys, digests[other]), len(keys) - 1)
                match = keys[again] == digests[other]
                pos[other[match]] = again[match]
                equal[other[match]] = True
            hit = equal & ~found
            labels[hit] = values[pos[hit]]
            found |= hit

    def __len__(self) -> int:
        return sum(len(d) for d, _, _ in self.segments)


class AnswerIndex:
    """The released answers of one ledger object, by namespace (module docstring).

    ``seen`` is the id of the last block read or written, ``mark`` that block's digests and
    labels (checked at every catch-up: the ledger still holds it, unchanged); ``legacy`` the
    answers of the ``answers``
    table of ledgers written before the blocks (keyed as they were: the first 16 bytes of
    SHA-256(source | mechanism | hash)), read once: that table takes no new rows since.
    """

    def __init__(self) -> None:
        self.seen = 0
        self.mark: tuple[NDArray, NDArray] | None = None
        self.legacy: _Space | None = None
        self._spaces: dict[tuple, _Space] = {}

    def add(self, namespace: tuple, digests: NDArray, labels: NDArray) -> None:
        """Add committed answers of one namespace.

        Args:
            namespace: (source id, mechanism name, parameters, seeded).
            digests: their ``S16`` digests.
            labels: their labels.
        """
        if len(digests):
            self._spaces.setdefault(namespace, _Space()).add(
                np.asarray(digests, dtype=DIGEST), np.asarray(labels, dtype=np.int64))

    def lookup(self, namespace: tuple, digests: NDArray) -> tuple[NDArray, NDArray]:
        """The released labels of `digests` in `namespace`.

        Args:
            namespace: (source id, mechanism name, parameters, seeded).
            digests: ``S16`` digests.

        Returns:
            (found, labels): per digest, whether an answer is held and its label.
        """
        found = np.zeros(len(digests), dtype=bool)
        labels = np.zeros(len(digests), dtype=np.int64)
        space = self._spaces.get(namespace)
        if space is not None and len(digests):
            space.lookup(digests, found, labels)
        return found, labels

    def catch_up(self, store) -> None:
        """Read the blocks committed after ``seen`` (inside the write transaction, under the
        ledger's lock: nothing else is committed until it ends), and the ``answers`` table
        once.

        Args:
            store: the ledger's store (its write transaction open).

        Raises:
            PrivacyError: a damaged block (its arrays disagree with its count).
        """
        # the largest id, block `seen` and the blocks after it in one statement (one
        # snapshot)
        top, blocks = store.blocks_since(self.seen)
        if self.seen:
            first = blocks[0] if blocks and int(blocks[0][0]) == self.seen else None
            if top < self.seen or first is None or not self._is_mark(first):
                # blocks are never removed or changed, so the last block this object read
                # or wrote is there as it was, unless the file or database was replaced (a
                # backup restored) while this object held it open: the index holds answers
                # the ledger no longer records (also where other processes have since
                # written as many blocks again, so the ids alone would not tell)
                raise PrivacyError(f"the ledger {store.name} no longer holds the answers this "
                                   f"process read from it before (was it restored from a "
                                   f"backup while open?); nothing was released: close and "
                                   f"reopen the ledger")
            blocks = blocks[1:]
        if self.legacy is None:
            self.legacy = _Space()
            rows = store.legacy_answers()
            if rows:
                keys = np.array([bytes(k) for k, _ in rows], dtype=DIGEST)
                self.legacy.add(keys, np.array([int(v) for _, v in rows], dtype=np.int64))
        groups: dict[tuple, tuple[list, list]] = {}
        last, mark = self.seen, None
        for block_id, source, mechanism, params, seeded, count, digests, labels in blocks:
            d = np.frombuffer(bytes(digests), dtype=DIGEST)
            lab = np.frombuffer(bytes(labels), dtype=BLOCK_INT)
            if len(d) != int(count) or len(lab) != int(count):
                raise PrivacyError(f"the ledger {store.name} is damaged: answer block "
                                   f"{block_id} holds {len(d)} digests and {len(lab)} labels "
                                   f"for {count} answers")
            pair = groups.setdefault((source, mechanism, params, bool(seeded)), ([], []))
            pair[0].append(d)
            pair[1].append(lab)
            if int(block_id) > last:
                last, mark = int(block_id), (d, lab)
        for namespace, (ds, labs) in groups.items():
            self.add(namespace, np.concatenate(ds), np.concatenate(labs))
        if last != self.seen:
            self.advance(last, *mark)

    def advance(self, block_id: int, digests: NDArray, labels: NDArray) -> None:
        """Record block `block_id` (its digests and labels) as the last one read or written,
        if it is after ``seen``.

        Args:
            block_id: the block's id.
            digests: its ``S16`` digests.
            labels: its labels.
        """
        if block_id > self.seen:
            self.seen = int(block_id)
            self.mark = (np.asarray(digests, dtype=DIGEST),
                         np.asarray(labels, dtype=np.int64))

    def _is_mark(self, row: tuple) -> bool:
        """Whether a block row (as `blocks_since` returns it) holds the marked block's
        digests and labels."""
        if self.mark is None:
            return False
        d = np.frombuffer(bytes(row[6]), dtype=DIGEST)
        lab = np.frombuffer(bytes(row[7]), dtype=BLOCK_INT)
        return bool(np.array_equal(d, self.mark[0])
                    and np.array_equal(lab.astype(np.int64), self.mark[1]))

    def __len__(self) -> int:
        return sum(len(s) for s in self._spaces.values())

"""Subsample-and-aggregate ensembles (AGT Sec. 5.2): partition, train T teachers with AGT,
store them, load and validate them, and certify queries against all of them.

Modules: partition.py (who trains on what, with which seed), train.py (teachers through
agt/parallel.py), store.py (the directory format below, validation on read), certify.py
(every teacher's vote and radius per query).

Partition rule ("index-mod-T"): training record i (its row in the training split) goes to
teacher i mod T; teacher t sees its records in index order. The rule depends on the record
index and T only, so replacing record i changes the data of teacher i mod T and of no other
teacher (same records, same sizes, same seeds: the other teachers' bundles are bit-identical).
Adding or removing a record shifts every later index, so an ensemble certifies the
*replace-one* relation only, whatever its teachers certify on their own parts.

Seeds: teacher t trains with the config's seed + t (init and batch order); nothing else
differs between teachers. Every teacher uses the same k grid in one AGT pass, so each
k_max must be smaller than every teacher's batch, min(batch_size, floor(n / T)).

Storage: a directory with one bounds bundle per teacher (``teacher_000.h5``, ...; the
format of agt/store.py) and ``manifest.json``::

    {"format": "agt-ensemble", "format_version": 1, "n_teachers": T,
     "partition": {"rule": "index-mod-T", "n_train": n, "sizes": [...]},
     "seed_rule": "config seed + teacher index",
     "teachers": [{"index": t, "file": "teacher_000.h5", "seed": s, "n_train": n_t,
                   "dataset_sha256": ..., "bundle_id": ..., "relations": [...],
                   "seconds": ...}, ...],
     "k_values": [...], "relations": ["replace-one"], "config": {...},
     "dataset_sha256": <sha of the whole training split>, "created": ..., "agt_version": ...,
     "execution": {"backend": "serial"|"process"|"ray", "workers": W,
                   "threads_per_teacher": t, "reruns": [{"teacher", "attempt", "reason"}]}}

(``execution`` and ``seconds`` say how this run went; readers do not require them.)

Execution: teachers are independent, so `train_ensemble` runs them through agt/parallel.py:
one after another, in W local processes, or as Ray tasks on a cluster. Every backend runs
the same function (`train_teacher`) with the same per-teacher intra-op thread count
(default 1; the thread count can change float summation order, agt/threads.py), so the
bundles are byte-identical whichever way they were trained.

Teacher bundles certify replace-one only (whatever their own training would allow: adding a
record to the whole dataset shifts the partition) and name their parent ensemble (its
dataset hash, T, the teacher's index), so a teacher used on its own spends the privacy of the
whole training split.

`read_ensemble` checks the manifest and every bundle against it and reports all problems in
one `BundleError`. `EnsembleCertifier` returns, per query, every teacher's vote and
stability radius (owner-only); vote counting, the ensemble answer and the ensemble radius
(AGT Thm 5.3) live in mechanisms/ensemble.py beside their proofs.
"""

import agt._first_use  # noqa: F401 (threading settings before torch loads)
from agt.ensemble.certify import EnsembleCertificate, EnsembleCertifier
from agt.ensemble.partition import (
                                    ENSEMBLE_RELATIONS,
                                    PARTITION_RULE,
                                    SEED_RULE,
                                    check_ensemble_plan,
                                    part_sizes,
                                    partition_indices,
                                    teacher_dataset,
                                    teacher_of,
                                    teacher_parent,
                                    teacher_seed,
)
from agt.ensemble.store import (
                                    FORMAT,
                                    FORMAT_VERSION,
                                    MANIFEST,
                                    Ensemble,
                                    is_ensemble_dir,
                                    read_ensemble,
                                    write_ensemble,
)
from agt.ensemble.train import train_ensemble, train_teacher

__all__ = ["ENSEMBLE_RELATIONS", "FORMAT", "FORMAT_VERSION", "MANIFEST", "PARTITION_RULE",
           "SEED_RULE", "Ensemble", "EnsembleCertificate", "EnsembleCertifier",
           "check_ensemble_plan", "is_ensemble_dir", "part_sizes", "partition_indices",
           "read_ensemble", "teacher_dataset", "teacher_of", "teacher_parent", "teacher_seed",
           "train_ensemble", "train_teacher", "write_ensemble"]

"""Subsample-and-aggregate ensembles (AGT Sec. 5.2): partition, train T teachers with AGT,
store them, load and validate them, and certify queries against all of them.

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
     "dataset_sha256": <sha of the whole training split>, "created": ..., "agt_version": ...}

Teacher bundles certify replace-one only (whatever their own training would allow: adding a
record to the whole dataset shifts the partition) and name their parent ensemble (its
dataset hash, T, the teacher's index), so a teacher used on its own spends the privacy of the
whole training split.

`read_ensemble` checks the manifest and every bundle against it and reports all problems in
one `BundleError`. `EnsembleCertifier` returns, per query, every teacher's vote and
stability radius (owner-only); vote counting, the ensemble answer and the ensemble radius
(AGT Thm 5.3) live in mechanisms/ensemble.py beside their proofs.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from agt.version import __version__
from agt.certify import Certifier
from agt.config import TrainConfig
from agt.data import Dataset, validate_dataset
from agt.errors import BundleError, ConfigError
from agt.io import atomic_directory
from agt.store import Bundle, from_result, read_bundle, write_bundle
from agt.training import REPLACE, train

FORMAT = "agt-ensemble"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTITION_RULE = "index-mod-T"
SEED_RULE = "config seed + teacher index"
ENSEMBLE_RELATIONS = (REPLACE,)


# ------------------------------------------------------------------------------------------
# Partition

def teacher_of(index: int | np.ndarray, n_teachers: int) -> int | np.ndarray:
    """The teacher that trains on training record `index`: index mod T."""
    return index % n_teachers


def part_sizes(n_train: int, n_teachers: int) -> list[int]:
    """Records per teacher under index-mod-T: ceil((n - t) / T) for teacher t."""
    return [(n_train - t + n_teachers - 1) // n_teachers for t in range(n_teachers)]


def partition_indices(n_train: int, n_teachers: int) -> list[np.ndarray]:
    """Record indices of each teacher's part, ascending (disjoint, covering 0..n-1)."""
    _check_count(n_teachers, n_train)
    return [np.arange(t, n_train, n_teachers, dtype=np.int64) for t in range(n_teachers)]


def teacher_seed(base_seed: int, t: int) -> int:
    return int(base_seed) + int(t)


def teacher_dataset(ds: Dataset, t: int, n_teachers: int) -> Dataset:
    """Teacher t's training data (records i with i mod T == t, in index order); the test
    split is kept for evaluation."""
    idx = partition_indices(ds.n_train, n_teachers)[t]
    meta = {"ensemble_parent": ds.name, "teacher": t, "n_teachers": n_teachers,
            "partition": PARTITION_RULE}
    return Dataset(f"{ds.name}[teacher {t}/{n_teachers}]",
                   np.ascontiguousarray(ds.x_train[idx]), np.ascontiguousarray(ds.y_train[idx]),
                   ds.x_test, ds.y_test, ds.n_classes, meta)


def teacher_parent(dataset_sha256: str, n_teachers: int, teacher: int) -> dict:
    """The record a teacher bundle keeps of its ensemble."""
    return {"dataset_sha256": dataset_sha256, "n_teachers": int(n_teachers),
            "teacher": int(teacher), "partition": PARTITION_RULE}


def _check_count(n_teachers: object, n_train: int) -> None:
    if isinstance(n_teachers, bool) or not isinstance(n_teachers, (int, np.integer)) \
            or n_teachers < 1:
        raise ConfigError(f"the number of teachers T must be an integer >= 1, got {n_teachers!r}")
    if n_teachers > n_train:
        raise ConfigError(f"T = {n_teachers} teachers need at least one record each, but the "
                          f"training split has {n_train} records; use T <= {n_train}")


def check_ensemble_plan(cfg: TrainConfig, n_train: int, n_teachers: int) -> None:
    """Raise ConfigError if some teacher could not run the k grid (k must stay below its
    batch size): checked before any teacher is trained."""
    _check_count(n_teachers, n_train)
    smallest = min(part_sizes(n_train, n_teachers))
    batch = cfg.batch_for(smallest)
    cfg.k_values.require_below(
        batch, "every teacher's batch size",
        f" (T = {n_teachers} parts of {n_train} records have {smallest} records at least, "
        f"batch_size {cfg.batch_size}; or use fewer teachers)")


# ------------------------------------------------------------------------------------------
# The stored ensemble

@dataclass
class Ensemble:
    path: Path | None
    manifest: dict
    bundles: list[Bundle]

    @property
    def n_teachers(self) -> int:
        return len(self.bundles)

    @property
    def k_values(self) -> tuple[int, ...]:
        return tuple(self.manifest["k_values"])

    @property
    def relations(self) -> tuple[str, ...]:
        return tuple(self.manifest["relations"])

    @property
    def seeds(self) -> list[int]:
        return [int(e["seed"]) for e in self.manifest["teachers"]]

    @property
    def config(self) -> dict:
        return dict(self.manifest["config"])

    @property
    def spec(self):
        return self.bundles[0].spec

    @property
    def ensemble_id(self) -> str:
        """Stable identifier: hash of the whole training split and every teacher's bundle id."""
        h = hashlib.sha256(self.manifest["dataset_sha256"].encode())
        for b in self.bundles:
            h.update(b.bundle_id.encode())
        return h.hexdigest()[:16]

    @property
    def training_seconds(self) -> list[float]:
        return [float(e.get("seconds", float("nan"))) for e in self.manifest["teachers"]]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def train_ensemble(cfg: TrainConfig, ds: Dataset, n_teachers: int, *,
                   progress: bool = False) -> Ensemble:
    """Train T teachers with AGT on the index-mod-T parts of ``ds`` (one pass each over the
    config's k grid). Returns the ensemble in memory (``path`` None); see `write_ensemble`."""
    validate_dataset(ds)
    check_ensemble_plan(cfg, ds.n_train, n_teachers)
    entries, bundles = [], []
    bar = tqdm(range(n_teachers), desc=f"AGT teachers (T={n_teachers})", unit="teacher",
               disable=not progress)
    dataset_sha = ds.sha256()
    for t in bar:
        seed = teacher_seed(cfg.seed, t)
        tds = teacher_dataset(ds, t, n_teachers)
        result = train(cfg.replace(seed=seed), tds)
        bundle = from_result(result, parent=teacher_parent(dataset_sha, n_teachers, t))
        bundle.relations = ENSEMBLE_RELATIONS
        bundles.append(bundle)
        entries.append({"index": t, "file": f"teacher_{t:03d}.h5", "seed": seed,
                        "n_train": bundle.n_train, "dataset_sha256": bundle.dataset_sha256,
                        "bundle_id": bundle.bundle_id, "relations": list(bundle.relations),
                        "seconds": round(result.seconds, 6)})
    bar.close()
    relations = list(ENSEMBLE_RELATIONS)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "n_teachers": n_teachers,
        "partition": {"rule": PARTITION_RULE, "n_train": ds.n_train,
                      "sizes": part_sizes(ds.n_train, n_teachers)},
        "seed_rule": SEED_RULE, "teachers": entries, "k_values": list(cfg.k_values),
        "relations": relations, "config": cfg.to_json_dict(),
        "dataset_sha256": dataset_sha, "n_classes": int(ds.n_classes), "dataset": ds.name,
        "created": _now(), "agt_version": __version__,
    }
    return Ensemble(None, manifest, bundles)


def _replaceable(path: Path) -> bool:
    """An existing --out may be replaced only if it is an ensemble directory holding nothing
    but its manifest and teacher bundles (never, e.g., a folder with a ledger in it)."""
    if not path.is_dir():
        return False
    present = {p.name for p in path.iterdir()}
    ours = {name for name in present if name == MANIFEST or
            re.fullmatch(r"teacher_\d{3,}\.h5", name)}
    return not present or (MANIFEST in present and present == ours)


def write_ensemble(ensemble: Ensemble, path: str | Path) -> Path:
    """Write the ensemble directory atomically (agt.io.atomic_directory): teachers and
    manifest go to a fresh temporary directory that then replaces ``path``. An existing
    ``path`` is replaced only if it holds an ensemble and nothing else."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a directory; an ensemble is written "
                          f"as a directory, give another --out")
    if path.exists() and not _replaceable(path):
        raise ConfigError(f"{path} is a non-empty directory that is not an agt ensemble "
                          f"(or holds other files); refusing to overwrite it")

    def fill(tmp: Path) -> None:
        for entry, bundle in zip(ensemble.manifest["teachers"], ensemble.bundles):
            write_bundle(bundle, tmp / entry["file"])
        (tmp / MANIFEST).write_text(json.dumps(ensemble.manifest, indent=1, sort_keys=True))

    atomic_directory(path, fill, _replaceable)
    ensemble.path = path
    for entry, bundle in zip(ensemble.manifest["teachers"], ensemble.bundles):
        bundle.path = path / entry["file"]
    return path


# ------------------------------------------------------------------------------------------
# Loading and validation

def _is_int(value: Any, low: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def _manifest_problems(m: Any) -> list[str]:
    """Every structural problem of a manifest (before any bundle is opened)."""
    if not isinstance(m, dict):
        return [f"the manifest must be a JSON object, got {type(m).__name__}"]
    if m.get("format") != FORMAT:
        return [f"not an agt ensemble manifest (format is {m.get('format')!r}, expected {FORMAT!r})"]
    if m.get("format_version") != FORMAT_VERSION:
        return [f"format_version {m.get('format_version')!r} is not supported (this agt reads "
                f"version {FORMAT_VERSION})"]
    problems = []
    missing = [k for k in ("n_teachers", "partition", "teachers", "k_values", "relations",
                           "config", "dataset_sha256") if k not in m]
    if missing:
        return [f"missing key(s) {missing}"]
    T = m["n_teachers"]
    if not _is_int(T, 1):
        problems.append(f"n_teachers must be an integer >= 1, got {T!r}")
        T = None
    part = m["partition"]
    sizes = None
    if not isinstance(part, dict):
        problems.append("partition must be an object with rule, n_train and sizes")
    else:
        if part.get("rule") != PARTITION_RULE:
            problems.append(f"unknown partition rule {part.get('rule')!r} (this agt knows "
                            f"{PARTITION_RULE!r})")
        n = part.get("n_train")
        if not _is_int(n, 1):
            problems.append(f"partition.n_train must be an integer >= 1, got {n!r}")
        elif T is not None:
            if T > n:
                problems.append(f"n_teachers {T} exceeds partition.n_train {n}")
            else:
                sizes = part_sizes(n, T)
                if part.get("sizes") != sizes:
                    problems.append(f"partition.sizes {part.get('sizes')!r} do not match the "
                                    f"{PARTITION_RULE} rule for n_train={n}, T={T} ({sizes})")
    kv = m["k_values"]
    if not isinstance(kv, list) or not kv or not all(_is_int(k, 0) for k in kv) or \
            kv != sorted(set(kv)) or kv[0] != 0:
        problems.append(f"k_values must be a non-empty ascending list of distinct integers "
                        f"starting at 0, got {kv!r}")
    rel = m["relations"]
    if not isinstance(rel, list) or not rel or not all(r in ENSEMBLE_RELATIONS for r in rel):
        problems.append(f"relations must be a non-empty list drawn from {list(ENSEMBLE_RELATIONS)} "
                        f"(index partitioning certifies replace-one only), got {rel!r}")
    if not isinstance(m["config"], dict):
        problems.append("config must be an object (the training config)")
    if not isinstance(m["dataset_sha256"], str):
        problems.append("dataset_sha256 must be a string")
    teachers = m["teachers"]
    if not isinstance(teachers, list):
        problems.append("teachers must be a list of teacher entries")
    else:
        if T is not None and len(teachers) != T:
            problems.append(f"n_teachers is {T} but {len(teachers)} teacher entries are listed")
        files = []
        for t, e in enumerate(teachers):
            where = f"teachers[{t}]"
            if not isinstance(e, dict):
                problems.append(f"{where} must be an object")
                continue
            if e.get("index") != t:
                problems.append(f"{where}.index is {e.get('index')!r}, expected {t}")
            f = e.get("file")
            if not isinstance(f, str) or not f or Path(f).name != f or f in (".", ".."):
                problems.append(f"{where}.file must be a plain file name inside the ensemble "
                                f"directory, got {f!r}")
            else:
                files.append(f)
            if not _is_int(e.get("seed"), 0):
                problems.append(f"{where}.seed must be an integer >= 0, got {e.get('seed')!r}")
            nt = e.get("n_train")
            if not _is_int(nt, 1):
                problems.append(f"{where}.n_train must be an integer >= 1, got {nt!r}")
            elif sizes is not None and t < len(sizes) and nt != sizes[t]:
                problems.append(f"{where}.n_train is {nt}, the partition gives teacher {t} "
                                f"{sizes[t]} records")
            for key in ("dataset_sha256", "bundle_id"):
                if not isinstance(e.get(key), str):
                    problems.append(f"{where}.{key} must be a string")
        if len(set(files)) != len(files):
            problems.append("teacher files must be distinct")
    return problems


def read_ensemble(path: str | Path) -> Ensemble:
    """Read an ensemble directory; validate the manifest and every teacher bundle against it.
    Raises one BundleError listing every problem found."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"ensemble not found: {path}")
    if not path.is_dir():
        raise BundleError(f"{path} is not an ensemble directory (a directory with "
                          f"{MANIFEST} and teacher bundles); for a single bundle use its .h5 "
                          f"with a single-* mechanism")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{path}: missing {MANIFEST}; not an agt ensemble directory")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{mpath}: malformed JSON ({exc})") from None
    problems = _manifest_problems(manifest)
    if problems:
        raise BundleError(f"{mpath}: " + "; ".join(problems))
    bundles: list[Bundle] = []
    specs = set()
    for t, e in enumerate(manifest["teachers"]):
        where = f"teacher {t} ({e['file']})"
        try:
            b = read_bundle(path / e["file"])
        except BundleError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if list(b.k_values) != manifest["k_values"]:
            problems.append(f"{where}: k_values {b.k_values[0]}..{b.k_values[-1]} "
                            f"({len(b.k_values)} values) differ from the manifest's")
        if b.n_train != e["n_train"]:
            problems.append(f"{where}: trained on {b.n_train} records, the manifest says "
                            f"{e['n_train']}")
        if b.dataset_sha256 != e["dataset_sha256"]:
            problems.append(f"{where}: dataset_sha256 differs from the manifest's (a bundle "
                            f"of another part or dataset)")
        elif b.bundle_id != e["bundle_id"]:
            problems.append(f"{where}: nominal parameters differ from the manifest's bundle_id")
        if b.config.get("seed") != e["seed"]:
            problems.append(f"{where}: trained with seed {b.config.get('seed')!r}, the "
                            f"manifest says {e['seed']}")
        if tuple(b.relations) != ENSEMBLE_RELATIONS:
            problems.append(f"{where}: a teacher bundle must certify {list(ENSEMBLE_RELATIONS)} "
                            f"only, it claims {list(b.relations)}")
        if b.parent != teacher_parent(manifest["dataset_sha256"], manifest["n_teachers"], t):
            problems.append(f"{where}: its parent record does not name this ensemble "
                            f"(teacher {t} of {manifest['n_teachers']})")
        specs.add(b.spec.to_json())
        bundles.append(b)
    if len(specs) > 1:
        problems.append("the teachers have different model architectures")
    if problems:
        raise BundleError(f"ensemble {path}: " + "; ".join(problems))
    return Ensemble(path, manifest, bundles)


def is_ensemble_dir(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


# ------------------------------------------------------------------------------------------
# Certification

@dataclass(frozen=True)
class EnsembleCertificate:
    """Per-query certification of an ensemble (Q queries, T teachers), owner-only.

    teacher_predictions / teacher_radii / teacher_max_k: (Q, T) nominal votes, stability
    radii (grid index, -1 where k = 0 does not certify) and largest certified k of every
    teacher. Votes, the ensemble answer and the ensemble radius are computed from these by
    mechanisms/ensemble.py; the provenance fields are those of `agt.certify.Certificate`.
    """

    teacher_predictions: np.ndarray
    teacher_radii: np.ndarray | None
    teacher_max_k: np.ndarray | None
    k_values: tuple[int, ...]
    contiguous: bool
    n_classes: int = 2
    source_id: str = ""
    dataset_sha256: str = ""
    relations: tuple[str, ...] = ENSEMBLE_RELATIONS
    smooth_radii: bool = True
    selection: str = "exact"
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def n_teachers(self) -> int:
        return int(self.teacher_predictions.shape[1])


class EnsembleCertifier:
    """Certify queries against every teacher (agt/certify.py)."""

    def __init__(self, ensemble: Ensemble, device: str = "cpu"):
        self.ensemble = ensemble
        self.certifiers = [Certifier(b, device=device) for b in ensemble.bundles]

    def predict_teachers(self, x) -> np.ndarray:
        """(Q, T) nominal votes (no certification)."""
        return np.stack([c.predict(x) for c in self.certifiers], axis=1).astype(np.int64)

    def certify(self, x, radii: bool = True) -> EnsembleCertificate:
        """Every teacher's certificate; ``radii=False``: votes only (radii None)."""
        t0 = time.perf_counter()
        certs = [c.certify(x, radii=radii) for c in self.certifiers]
        ens = self.ensemble

        def stack(field):
            if not radii:
                return None
            return np.stack([getattr(c, field) for c in certs], axis=1).astype(np.int64)

        return EnsembleCertificate(
            np.stack([c.prediction for c in certs], axis=1).astype(np.int64),
            stack("radius"), stack("max_certified_k"),
            certs[0].k_values, certs[0].contiguous, ens.spec.n_classes, ens.ensemble_id,
            ens.manifest["dataset_sha256"], tuple(ens.relations),
            all(c.smooth_radii for c in certs), certs[0].selection,
            {"seconds": time.perf_counter() - t0})

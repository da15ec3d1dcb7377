"""The stored ensemble: a directory of teacher bundles (agt/store.py format) and
``manifest.json`` (layout in agt/ensemble/__init__.py), written atomically and read back with
every structural problem reported in one BundleError."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agt.ensemble.partition import ENSEMBLE_RELATIONS, PARTITION_RULE, part_sizes, teacher_parent
from agt.errors import BundleError, ConfigError
from agt.io import atomic_directory
from agt.store import Bundle, read_bundle, write_bundle

FORMAT = "agt-ensemble"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class Ensemble:
    """T teachers trained on disjoint parts of one private dataset (owner-only).

    `train_ensemble` returns one, `write_ensemble` / `read_ensemble` store it as a directory
    of teacher bundles and a manifest (docs/reference/formats.md).

    Attributes:
        path: the directory it was read from or written to (None in memory).
        manifest: the JSON manifest (teachers, k grid, relations, dataset hash, execution).
        bundles: the teachers' bundles, in teacher order.
    """
    path: Path | None
    manifest: dict
    bundles: list[Bundle]

    @property
    def n_teachers(self) -> int:
        """The number of teachers T."""
        return len(self.bundles)

    @property
    def k_values(self) -> tuple[int, ...]:
        """The k grid every teacher shares."""
        return tuple(self.manifest["k_values"])

    @property
    def relations(self) -> tuple[str, ...]:
        """The neighbouring relations the ensemble's radii hold under."""
        return tuple(self.manifest["relations"])

    @property
    def seeds(self) -> list[int]:
        """Each teacher's training seed, in teacher order."""
        return [int(e["seed"]) for e in self.manifest["teachers"]]

    @property
    def config(self) -> dict:
        """The training configuration every teacher used (a copy)."""
        return dict(self.manifest["config"])

    @property
    def spec(self):
        """The model architecture every teacher shares."""
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
        """Each teacher's training time in seconds (NaN where not recorded)."""
        return [float(e.get("seconds", float("nan"))) for e in self.manifest["teachers"]]


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
    """Write the ensemble directory atomically (agt.io.atomic_directory).

    Teachers and manifest go to a fresh temporary directory that then replaces `path`. An
    existing `path` is replaced only if it holds an ensemble and nothing else.

    Args:
        ensemble: the ensemble to store (owner-only).
        path: the directory to write.

    Returns:
        The path written.

    Raises:
        ConfigError: `path` is a file, or a directory holding something else.
    """
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
        return [f"not an agt ensemble manifest (format is {m.get('format')!r}, "
                f"expected {FORMAT!r})"]
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
    """Read an ensemble directory; validate the manifest and every teacher bundle.

    Args:
        path: a directory written by `write_ensemble` (``agt train --ensemble``).

    Returns:
        The `Ensemble`.

    Raises:
        BundleError: one error listing every problem found (missing files, a teacher that
            does not match the manifest, damage).
    """
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

"""HDF5 bounds bundle: write, read, validate (docs/reference/formats.md).

Layout (format_version 2)::

    /                 attrs: format="agt-bounds", format_version=2, config (JSON),
                      model (JSON spec), k_values (int64, ascending, from 0), dataset_sha256,
                      created (UTC ISO), agt_version, relations (JSON list of the
                      neighbouring relations certified), dtype (nominal), n_train,
                      bound_dtype="float64", rounding (how rounding is accounted for),
                      selection (the top-k rule whose proof applies: "exact" has a nesting
                      proof, "threshold" is sound but has none), parent (JSON: for a
                      teacher of an ensemble, {dataset_sha256, n_teachers, teacher,
                      partition}; "null" otherwise), content_sha256 (integrity hash)
    /init/<param>     initial parameters (nominal dtype)
    /nominal/<param>  parameters after nominal training (the k = 0 model that is served)
    /bounds/<k>/lower/<param>, /bounds/<k>/upper/<param>   valid bounds at distance k
    /order            (epochs, n) int64: record indices in the order each epoch used them

Format version 3 is version 2 plus an input scale (agt/scaling.py), written only for a
bundle trained on scaled inputs (others stay version 2, byte for byte, so older readers
keep reading them and refuse a bundle whose queries they would not scale)::

    /                 attrs: input_scale (JSON: {source, shape})
    /input_scale/shift, /input_scale/scale   float64: queries are mapped (x - shift) / scale

Bounds are stored in float64 exactly as computed (no down-cast, so no rounding on write).
Files are written through a unique temporary name and renamed (agt/io.py), so a failed run
leaves no partial file.

Integrity: ``content_sha256`` is the SHA-256 of every attribute but itself (canonical JSON)
and of every dataset (path, dtype, shape, bytes) in a fixed order. The reader recomputes it
and refuses a mismatch: a flipped bit that would narrow a box, or an edited attribute, makes
the bundle claim more than was proven. Any other damage (truncation, garbage) is refused
with one BundleError, never a traceback.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from agt.config import (
    BOUND_METHODS,
    GRADED_SINCE,
    SMOOTH_BOUND_METHODS,
    SMOOTH_PLACEMENTS,
    SMOOTH_SELECTIONS,
)
from agt.errors import BundleError, ConfigError, DataError
from agt.io import atomic_write
from agt.kgrid import KGrid
from agt.models import ModelSpec
from agt.scaling import InputScale
from agt.version import __version__

FORMAT = "agt-bounds"
FORMAT_VERSION = 2
#: the version of a bundle that records an input scale (readable by this agt, not by older)
SCALED_FORMAT_VERSION = 3
SCALE_PATHS = ("input_scale/shift", "input_scale/scale")
ROUNDING_NOTE = ("float64 bounds widened outward by a-priori rounding-error bounds of the "
                 "nominal dtype and of float64 (agt/interval.py)")
RELATIONS = ("replace-one", "add-remove")
SELECTIONS = ("exact", "threshold")
#: what a bundle written before the bound_method attribute existed used
LEGACY_BOUND_METHOD = "interval"
#: the L2 radius per k of bound method "stability" (agt/stability.py)
BALL_PATH = "stability_radius"
_STRING_ATTRS = ("format", "config", "model", "dataset_sha256", "created", "agt_version",
                 "relations", "dtype", "bound_dtype", "rounding", "selection", "parent",
                 "content_sha256")
_INT_ATTRS = ("format_version", "n_train")


def _version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of an agt version string; (0,) when it does not parse."""
    parts = []
    for piece in str(version).split(".")[:3]:
        lead = re.match(r"\d+", piece)
        if lead is None:
            break
        parts.append(int(lead.group()[:6]))
    return tuple(parts) if parts else (0,)


@dataclass
class Bundle:
    """A trained model's bounds: the served parameters and a box per k (owner-only).

    `agt.train` returns one, `write_bundle` / `read_bundle` store it (HDF5, formats 2 and
    3, docs/reference/formats.md).

    Attributes:
        path: the file it was read from or written to (None in memory).
        spec: the model architecture.
        config: the training configuration (JSON mapping).
        k_values: the k grid, ascending from 0.
        init, nominal: initial and served parameters (name -> tensor).
        lower, upper: name -> (K, *shape) float64 bounds for every k of the grid.
        order: (epochs, n) record indices in the order each epoch used them.
        relations: the neighbouring relations the bounds hold under.
        dataset_sha256: hash of the private training records.
        dtype: the nominal dtype; n_train: the number of training records.
        input_scale: the public input scale applied to every query, if any.
    """
    path: Path | None
    spec: ModelSpec
    config: dict
    k_values: tuple[int, ...]
    init: dict[str, torch.Tensor]
    nominal: dict[str, torch.Tensor]
    lower: dict[str, torch.Tensor]      # name -> (K, *shape) float64
    upper: dict[str, torch.Tensor]
    order: np.ndarray
    relations: tuple[str, ...]
    dataset_sha256: str
    dtype: str
    n_train: int
    created: str = ""
    agt_version: str = __version__
    selection: str = "exact"
    parent: dict | None = field(default=None)
    bound_method: str = LEGACY_BOUND_METHOD
    ball_radius: np.ndarray | None = None   # (K,) L2 radii, bound method "stability" only
    input_scale: InputScale | None = None   # applied to every query (agt/scaling.py)

    @property
    def bundle_id(self) -> str:
        """Stable identifier: dataset hash + nominal parameter hash."""
        h = hashlib.sha256(self.dataset_sha256.encode())
        for name in sorted(self.nominal):
            h.update(name.encode())
            h.update(self.nominal[name].detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    @property
    def k_grid(self) -> KGrid:
        """The k grid as a `KGrid`."""
        return KGrid(tuple(self.k_values))

    @property
    def smooth_radii(self) -> bool:
        """Whether radii from these bounds satisfy r(D') >= r(D) - 1 (a nesting proof
        exists for the selection rule, the bound method and the placement that computed
        them)."""
        since = SMOOTH_PLACEMENTS.get(self.config.get("k_placement", "per-batch"))
        return self.selection in SMOOTH_SELECTIONS and \
            self.bound_method in SMOOTH_BOUND_METHODS and \
            since is not None and _version_tuple(self.agt_version) >= since and \
            self.graded_boxes

    @property
    def graded_boxes(self) -> bool:
        """Whether the boxes' computed nesting is proven: no interval pass (k_boxes: ball),
        or passes graded by k (agt/interval.py; from agt.config.GRADED_SINCE on)."""
        if self.config.get("k_boxes", "interval") != "interval":
            return True
        return _version_tuple(self.agt_version) >= GRADED_SINCE

    @property
    def protected_dataset_sha256(self) -> str:
        """The private dataset a release from this bundle spends privacy of: the ensemble's
        whole training split for a teacher, else the bundle's own training data."""
        return self.parent["dataset_sha256"] if self.parent else self.dataset_sha256

    def box(self, j: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The box of grid index `j`.

        Args:
            j: an index into `k_values`.

        Returns:
            The pair (lower, upper), each mapping a parameter name to its bounds at
            distance ``k_values[j]``.
        """
        return ({n: t[j] for n, t in self.lower.items()}, {n: t[j] for n, t in self.upper.items()})


def from_result(result, parent: dict | None = None,
                input_scale: InputScale | None = None) -> Bundle:
    """A bundle from a training result.

    Args:
        result: an `agt.training.TrainResult` with bounds.
        parent: a teacher's ensemble record, None for a single model.
        input_scale: the public input scale the model was trained behind, if any.

    Returns:
        The `Bundle` (not yet written).

    Raises:
        BundleError: the result has no bounds.
    """
    if result.lower is None:
        raise BundleError("this training result has no bounds (trained with with_bounds=False)")
    return Bundle(None, result.spec, result.config.to_json_dict(), tuple(result.k_values),
                  {k: v.detach().cpu() for k, v in result.init.items()},
                  {k: v.detach().cpu() for k, v in result.nominal.items()},
                  {k: v.detach().cpu() for k, v in result.lower.items()},
                  {k: v.detach().cpu() for k, v in result.upper.items()},
                  result.order, tuple(result.relations), result.dataset_sha256,
                  result.config.dtype, result.n_train,
                  _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  selection=result.config.selection, parent=parent,
                  bound_method=result.config.bound_method,
                  ball_radius=None if result.ball_radius is None
                  else np.asarray(result.ball_radius, dtype=np.float64),
                  input_scale=input_scale)


def _attrs(bundle: Bundle) -> dict[str, Any]:
    scaled = bundle.input_scale is not None
    attrs = {
        "format": FORMAT, "format_version": SCALED_FORMAT_VERSION if scaled else FORMAT_VERSION,
        "config": json.dumps(bundle.config, sort_keys=True), "model": bundle.spec.to_json(),
        "k_values": np.asarray(bundle.k_values, dtype=np.int64),
        "dataset_sha256": bundle.dataset_sha256,
        "created": bundle.created or _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "agt_version": bundle.agt_version, "relations": json.dumps(list(bundle.relations)),
        "dtype": bundle.dtype, "n_train": int(bundle.n_train), "bound_dtype": "float64",
        "rounding": ROUNDING_NOTE, "selection": bundle.selection,
        "parent": json.dumps(bundle.parent, sort_keys=True),
        "bound_method": bundle.bound_method,
    }
    if scaled:
        attrs["input_scale"] = json.dumps(bundle.input_scale.to_record(), sort_keys=True)
    return attrs


def dataset_paths(names, k_values, ball: bool = False, scaled: bool = False) -> list[str]:
    """Every dataset path of a bundle, in the fixed order the content hash uses."""
    names = sorted(names)
    paths = [f"{group}/{n}" for group in ("init", "nominal") for n in names]
    paths += [f"bounds/{k}/{side}/{n}" for k in k_values for side in ("lower", "upper")
              for n in names]
    return paths + ["order"] + ([BALL_PATH] if ball else []) + \
        (list(SCALE_PATHS) if scaled else [])


def _datasets(bundle: Bundle):
    """(path, array) of every dataset, in the order of `dataset_paths`."""
    j_of = {k: j for j, k in enumerate(bundle.k_values)}
    for path in dataset_paths(bundle.nominal, bundle.k_values, bundle.ball_radius is not None,
                              bundle.input_scale is not None):
        parts = path.split("/")
        if path in SCALE_PATHS:
            yield path, getattr(bundle.input_scale, parts[1])
        elif path == BALL_PATH:
            yield path, np.asarray(bundle.ball_radius, dtype=np.float64)
        elif parts[0] in ("init", "nominal"):
            yield path, getattr(bundle, parts[0])[parts[1]].detach().cpu().numpy()
        elif parts[0] == "bounds":
            values = bundle.lower if parts[2] == "lower" else bundle.upper
            yield path, values[parts[3]][j_of[int(parts[1])]].to(torch.float64).numpy()
        else:
            yield path, np.asarray(bundle.order, dtype=np.int64)


def _content_hash(attrs: dict[str, Any], datasets) -> str:
    h = hashlib.sha256(b"agt-bounds-content-v2\0")
    meta = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in attrs.items()
            if k != "content_sha256"}
    h.update(json.dumps(meta, sort_keys=True, default=str).encode())
    for path, arr in datasets:
        arr = np.ascontiguousarray(arr)
        h.update(f"\0{path}|{arr.dtype.str}|{arr.shape}\0".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def write_bundle(bundle: Bundle, path: str | Path) -> Path:
    """Write `bundle` as HDF5 (format 2, or 3 with an input scale) and set its path.

    The file is written under a temporary name and renamed, so a failed write leaves no
    partial bundle; ``content_sha256`` covers every attribute and dataset.

    Args:
        bundle: the bundle to store (owner-only).
        path: the ``.h5`` file to write (replaced if it exists).

    Returns:
        The path written.
    """
    path = Path(path)
    attrs = _attrs(bundle)
    attrs["content_sha256"] = _content_hash(attrs, _datasets(bundle))

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            for key, value in attrs.items():
                f.attrs[key] = value
            for name, arr in _datasets(bundle):
                f.create_dataset(name, data=arr)

    atomic_write(path, write)
    bundle.path = path
    return path


# -- reading -------------------------------------------------------------------------------

def _read_attrs(f, where) -> dict[str, Any]:
    out: dict[str, Any] = {}
    problems = []
    for key in _STRING_ATTRS + _INT_ATTRS + ("k_values",):
        if key not in f.attrs:
            problems.append(f"missing root attribute '{key}'")
            continue
        value = f.attrs[key]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if key in _STRING_ATTRS and not isinstance(value, str):
            problems.append(f"root attribute '{key}' must be a string")
        elif key in _INT_ATTRS:
            if isinstance(value, (str, bytes)) or np.ndim(value) != 0 or \
                    np.asarray(value).dtype.kind not in "iu":
                problems.append(f"root attribute '{key}' must be an integer")
            else:
                value = int(value)
        elif key == "k_values":
            arr = np.asarray(value)
            if arr.dtype.kind not in "iu" or arr.ndim != 1:
                problems.append("k_values must be a 1-D integer array")
            else:
                value = arr.astype(np.int64)
        out[key] = value
    # optional (absent from bundles written before it existed: LEGACY_BOUND_METHOD), and
    # input_scale, present exactly in format version 3
    for key in ("bound_method", "input_scale"):
        if key not in f.attrs:
            continue
        value = f.attrs[key]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if not isinstance(value, str):
            problems.append(f"root attribute '{key}' must be a string")
        out[key] = value
    if problems:
        raise BundleError(f"{where}: " + "; ".join(problems))
    return out


def _parse_meta(attrs: dict[str, Any], where) -> dict[str, Any]:
    problems = []
    try:
        spec = ModelSpec.from_json(attrs["model"])
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        raise BundleError(f"{where}: malformed model attribute ({exc})") from None
    try:
        config = json.loads(attrs["config"])
        relations = json.loads(attrs["relations"])
        parent = json.loads(attrs["parent"])
    except ValueError as exc:
        raise BundleError(f"{where}: malformed JSON attribute ({exc})") from None
    if not isinstance(config, dict):
        problems.append("config must be a JSON object")
    if not isinstance(relations, list) or not relations or \
            not all(r in RELATIONS for r in relations) or len(set(relations)) != len(relations):
        problems.append(f"relations must be a non-empty JSON list drawn from {RELATIONS}, got "
                        f"{attrs['relations']!r}")
    if parent is not None and not (isinstance(parent, dict) and
                                   isinstance(parent.get("dataset_sha256"), str)):
        problems.append("parent must be null or an object with the ensemble's dataset_sha256")
    if attrs["dtype"] not in ("float32", "float64"):
        problems.append(f"dtype must be float32 or float64, got {attrs['dtype']!r}")
    if attrs["selection"] not in SELECTIONS:
        problems.append(f"selection must be one of {SELECTIONS}, got {attrs['selection']!r}")
    if attrs.get("bound_method", LEGACY_BOUND_METHOD) not in BOUND_METHODS:
        problems.append(f"bound_method must be one of {BOUND_METHODS}, got "
                        f"{attrs['bound_method']!r}")
    k = attrs["k_values"]
    if len(k) == 0 or k[0] != 0 or np.any(np.diff(k) <= 0):
        problems.append("k_values must be unique, ascending and start at 0")
    if attrs["n_train"] < 1:
        problems.append("n_train must be >= 1")
    if problems:
        raise BundleError(f"{where}: " + "; ".join(problems))
    return {"spec": spec, "config": config, "relations": tuple(relations), "parent": parent,
            "k_values": tuple(int(v) for v in k)}


def read_bundle(path: str | Path) -> Bundle:
    """Read, verify (content hash) and validate a bundle.

    Args:
        path: a bundle file written by `write_bundle` (format 2 or 3).

    Returns:
        The `Bundle`, its boxes checked (lower <= nominal <= upper, nested in k).

    Raises:
        BundleError: with a one-line reason for anything that is not an intact agt bundle
            (missing, a directory, damaged, altered, another format version).
    """
    path = Path(path)
    if path.is_dir():
        what = ("an ensemble directory (agt train --ensemble): give one of its "
                "teacher_NNN.h5 files" if (path / "manifest.json").is_file() else "a directory")
        raise BundleError(f"{path} is {what}, not a bounds file")
    if not path.is_file():
        raise BundleError(f"bounds file not found: {path}")
    try:
        return _read(path)
    except BundleError:
        raise
    except Exception as exc:  # h5py raises KeyError, OSError, RuntimeError... on damaged files
        raise BundleError(f"{path}: cannot read the bundle, the file is damaged or not an agt "
                          f"bounds bundle ({type(exc).__name__})") from None


def _read(path: Path) -> Bundle:
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise BundleError(f"cannot read {path} as HDF5 ({exc.__class__.__name__}); is it an "
                          f"agt bounds bundle?") from None
    with f:
        found = f.attrs.get("format")
        found = found.decode(errors="replace") if isinstance(found, bytes) else found
        if not isinstance(found, str) or found != FORMAT:
            raise BundleError(f"{path}: not an agt bounds bundle (root attribute format is "
                              f"{found!r}, expected {FORMAT!r})")
        version = f.attrs.get("format_version")
        if version not in (FORMAT_VERSION, SCALED_FORMAT_VERSION):
            raise BundleError(f"{path}: format_version {version!r} is not supported (this agt "
                              f"reads versions {FORMAT_VERSION} and {SCALED_FORMAT_VERSION}; "
                              f"retrain to write a new bundle)")
        attrs = _read_attrs(f, path)
        meta = _parse_meta(attrs, path)
        spec = meta["spec"]
        expected = spec.param_shapes
        for group in ("init", "nominal", "bounds"):
            if not isinstance(f.get(group), h5py.Group):
                raise BundleError(f"{path}: missing group /{group}")
        init = _read_params(f["init"], expected, f"{path}:/init")
        nominal = _read_params(f["nominal"], expected, f"{path}:/nominal")
        lower, upper = {n: [] for n in expected}, {n: [] for n in expected}
        for k in meta["k_values"]:
            key = str(k)
            kg = f["bounds"].get(key)
            if not isinstance(kg, h5py.Group) or not isinstance(kg.get("lower"), h5py.Group) \
                    or not isinstance(kg.get("upper"), h5py.Group):
                raise BundleError(f"{path}: missing or malformed /bounds/{key} (needs groups "
                                  f"lower and upper)")
            lo = _read_params(kg["lower"], expected, f"{path}:/bounds/{key}/lower")
            hi = _read_params(kg["upper"], expected, f"{path}:/bounds/{key}/upper")
            for n in expected:
                if lo[n].dtype != torch.float64 or hi[n].dtype != torch.float64:
                    raise BundleError(f"{path}: bounds must be float64 (/bounds/{key}/*/{n})")
                lower[n].append(lo[n])
                upper[n].append(hi[n])
        if len(f["bounds"].keys()) != len(meta["k_values"]):
            raise BundleError(f"{path}: /bounds holds other groups than the k_values")
        lower = {n: torch.stack(v) for n, v in lower.items()}
        upper = {n: torch.stack(v) for n, v in upper.items()}
        if not isinstance(f.get("order"), h5py.Dataset):
            raise BundleError(f"{path}: missing /order (the record order of each epoch)")
        order = np.asarray(f["order"])
        n_train = attrs["n_train"]
        if order.ndim != 2 or order.shape[1] != n_train or order.dtype.kind not in "iu" or \
                any(not np.array_equal(np.sort(row), np.arange(n_train)) for row in order):
            raise BundleError(f"{path}: /order must be (epochs, n_train) with every row a "
                              f"permutation of the record indices")
        ball = None
        method = attrs.get("bound_method", LEGACY_BOUND_METHOD)
        if (method == "stability") != (BALL_PATH in f):
            raise BundleError(f"{path}: /{BALL_PATH} must be present exactly when bound_method "
                              f"is stability (bound_method {method!r})")
        if BALL_PATH in f:
            ball = np.asarray(f[BALL_PATH])
            if ball.dtype != np.float64 or ball.shape != (len(meta["k_values"]),):
                raise BundleError(f"{path}: /{BALL_PATH} must be float64 with one radius per k")
        scale = _read_input_scale(f, attrs, version == SCALED_FORMAT_VERSION, path)
    bundle = Bundle(path, spec, meta["config"], meta["k_values"], init, nominal, lower, upper,
                    order, meta["relations"], attrs["dataset_sha256"], attrs["dtype"], n_train,
                    attrs["created"], attrs["agt_version"], attrs["selection"], meta["parent"],
                    method, ball, scale)
    recomputed = _content_hash({k: v for k, v in attrs.items() if k != "content_sha256"},
                               _datasets(bundle))
    if recomputed != attrs["content_sha256"]:
        raise BundleError(f"{path}: content hash mismatch; the bundle was modified after it was "
                          f"written and its bounds cannot be trusted")
    validate_bundle(bundle)
    return bundle


def _read_input_scale(f, attrs: dict, scaled: bool, where) -> InputScale | None:
    """The recorded input scale: present (attribute and both arrays) exactly in version 3."""
    present = "input_scale" in attrs or "input_scale" in f
    if present != scaled:
        raise BundleError(f"{where}: an input scale (/input_scale and its attribute) belongs "
                          f"to format_version {SCALED_FORMAT_VERSION} and only there")
    if not scaled:
        return None
    try:
        record = json.loads(attrs["input_scale"])
        arrays = [np.asarray(f[p]) for p in SCALE_PATHS]
        if not isinstance(record, dict) or any(a.dtype != np.float64 for a in arrays):
            raise ValueError("not a float64 shift and scale with a JSON record")
        return InputScale(arrays[0], arrays[1], str(record.get("source", "")))
    except (KeyError, ValueError, TypeError, DataError) as exc:
        raise BundleError(f"{where}: malformed input scale ({exc})") from None


def _read_params(group, expected: dict, where: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in expected.items():
        ds = group.get(name)
        if not isinstance(ds, h5py.Dataset):
            raise BundleError(f"{where}: missing parameter '{name}'")
        value = np.asarray(ds)
        if tuple(value.shape) != tuple(shape):
            raise BundleError(f"{where}/{name}: shape {value.shape}, model needs {tuple(shape)}")
        if value.dtype.kind != "f":
            raise BundleError(f"{where}/{name}: must hold floats, got {value.dtype}")
        out[name] = torch.from_numpy(np.ascontiguousarray(value))
    extra = set(group.keys()) - set(expected)
    if extra:
        raise BundleError(f"{where}: unexpected parameter(s) {sorted(extra)}")
    return out


def validate_bundle(bundle: Bundle) -> None:
    """lower <= nominal <= upper for every k, no NaN, a finite served model, and boxes
    nested in k."""
    where = bundle.path or "bundle"
    for name, nom in bundle.nominal.items():
        lo, hi = bundle.lower[name], bundle.upper[name]
        nom64 = nom.to(torch.float64).unsqueeze(0)
        if torch.isnan(lo).any() or torch.isnan(hi).any() or torch.isnan(nom64).any():
            raise BundleError(f"{where}: NaN in parameter '{name}'")
        if not bool(torch.isfinite(nom64).all()):
            raise BundleError(f"{where}: the served parameter '{name}' is infinite (a run "
                              "that overflowed); retrain with a smaller learning rate")
        bad = ~((lo <= nom64) & (nom64 <= hi))
        if bool(bad.any()):
            j = int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0])
            raise BundleError(f"{where}: nominal '{name}' outside its bounds at "
                              f"k={bundle.k_values[j]}; the bundle is corrupt or unsound")
        if lo.shape[0] > 1 and (bool((lo[1:] > lo[:-1]).any()) or bool((hi[1:] < hi[:-1]).any())):
            raise BundleError(f"{where}: bounds of '{name}' are not nested in k")
    scale = bundle.input_scale
    if scale is not None and scale.shift.ndim and \
            scale.shift.shape != tuple(bundle.spec.input_shape or ()):
        raise BundleError(f"{where}: input scale of shape {scale.shift.shape} for a model with "
                          f"inputs {bundle.spec.input_shape}")
    ball = bundle.ball_radius
    if ball is not None:
        if np.isnan(ball).any() or (ball < 0).any() or (ball[1:] < ball[:-1]).any() or \
                (bundle.k_values[0] == 0 and ball[0] != 0.0):
            raise BundleError(f"{where}: /{BALL_PATH} must be >= 0, 0 at k = 0 and "
                              f"non-decreasing in k")

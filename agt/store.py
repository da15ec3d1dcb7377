"""HDF5 bounds bundle: write, read, validate (DESIGN.md section 4).

Layout::

    /                 attrs: format="agt-bounds", format_version=1, config (JSON),
                      model (JSON spec), k_values (int64, ascending), dataset_sha256,
                      created (UTC ISO), agt_version, relations (JSON list of the
                      neighbouring relations certified), dtype (nominal), n_train,
                      bound_dtype="float64", rounding (how rounding is accounted for)
    /init/<param>     initial parameters (nominal dtype)
    /nominal/<param>  parameters after nominal training (the k = 0 model that is served)
    /bounds/<k>/lower/<param>, /bounds/<k>/upper/<param>   valid bounds at distance k
    /order            (epochs, n) int64: record indices in the order each epoch used them

Bounds are stored in float64 exactly as computed (no down-cast, so no rounding on write).
Files are written to a temporary name and renamed, so a failed run leaves no partial file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from agt import __version__
from agt.errors import BundleError
from agt.models import ModelSpec

FORMAT = "agt-bounds"
FORMAT_VERSION = 1
ROUNDING_NOTE = ("float64 bounds widened outward by a-priori rounding-error bounds of the "
                 "nominal dtype and of float64 (agt/interval.py)")


@dataclass
class Bundle:
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

    @property
    def bundle_id(self) -> str:
        """Stable identifier: dataset hash + nominal parameter hash."""
        import hashlib
        h = hashlib.sha256(self.dataset_sha256.encode())
        for name in sorted(self.nominal):
            h.update(name.encode())
            h.update(self.nominal[name].detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def box(self, j: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return ({n: t[j] for n, t in self.lower.items()}, {n: t[j] for n, t in self.upper.items()})


def from_result(result) -> Bundle:
    """Bundle from an agt.training.TrainResult."""
    if result.lower is None:
        raise BundleError("this training result has no bounds (trained with with_bounds=False)")
    return Bundle(None, result.spec, result.config.to_json_dict(), tuple(result.k_values),
                  {k: v.detach().cpu() for k, v in result.init.items()},
                  {k: v.detach().cpu() for k, v in result.nominal.items()},
                  {k: v.detach().cpu() for k, v in result.lower.items()},
                  {k: v.detach().cpu() for k, v in result.upper.items()},
                  result.order, tuple(result.relations), result.dataset_sha256,
                  result.config.dtype, result.n_train,
                  _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def write_bundle(bundle: Bundle, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        with h5py.File(tmp, "w") as f:
            a = f.attrs
            a["format"] = FORMAT
            a["format_version"] = FORMAT_VERSION
            a["config"] = json.dumps(bundle.config, sort_keys=True)
            a["model"] = bundle.spec.to_json()
            a["k_values"] = np.asarray(bundle.k_values, dtype=np.int64)
            a["dataset_sha256"] = bundle.dataset_sha256
            a["created"] = bundle.created or _dt.datetime.now(_dt.timezone.utc).isoformat()
            a["agt_version"] = bundle.agt_version
            a["relations"] = json.dumps(list(bundle.relations))
            a["dtype"] = bundle.dtype
            a["n_train"] = int(bundle.n_train)
            a["bound_dtype"] = "float64"
            a["rounding"] = ROUNDING_NOTE
            for group, params in (("init", bundle.init), ("nominal", bundle.nominal)):
                g = f.create_group(group)
                for name, value in params.items():
                    g.create_dataset(name, data=value.numpy())
            bg = f.create_group("bounds")
            for j, k in enumerate(bundle.k_values):
                kg = bg.create_group(str(k))
                lo, hi = kg.create_group("lower"), kg.create_group("upper")
                for name in bundle.nominal:
                    lo.create_dataset(name, data=bundle.lower[name][j].to(torch.float64).numpy())
                    hi.create_dataset(name, data=bundle.upper[name][j].to(torch.float64).numpy())
            f.create_dataset("order", data=np.asarray(bundle.order, dtype=np.int64))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    bundle.path = path
    return path


def _attr(f, key: str):
    if key not in f.attrs:
        raise BundleError(f"{f.filename}: missing root attribute '{key}'; not an agt bounds bundle")
    value = f.attrs[key]
    return value.decode() if isinstance(value, bytes) else value


def _str_attr(f, key: str) -> str:
    value = _attr(f, key)
    if not isinstance(value, str):
        raise BundleError(f"{f.filename}: root attribute '{key}' must be a string")
    return value


def _int_attr(f, key: str) -> int:
    value = _attr(f, key)
    try:
        if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
            raise TypeError
        out = int(value)
        if out != value:
            raise TypeError
        return out
    except (TypeError, ValueError):
        raise BundleError(f"{f.filename}: root attribute '{key}' must be an integer") from None


def read_bundle(path: str | Path) -> Bundle:
    """Read and validate a bundle; raises BundleError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise BundleError(f"bounds file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise BundleError(f"cannot read {path} as HDF5 ({exc.__class__.__name__}); is it an "
                          f"agt bounds bundle?") from None
    with f:
        found = _attr(f, "format") if "format" in f.attrs else None
        if not isinstance(found, str) or found != FORMAT:
            raise BundleError(f"{path}: not an agt bounds bundle (root attribute format is "
                              f"{found!r}, expected {FORMAT!r})")
        version = _int_attr(f, "format_version")
        if version != FORMAT_VERSION:
            raise BundleError(f"{path}: format_version {version} is not supported "
                              f"(this agt reads version {FORMAT_VERSION})")
        try:
            spec = ModelSpec.from_json(_attr(f, "model"))
            config = json.loads(_attr(f, "config"))
            relations = tuple(json.loads(_attr(f, "relations")))
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleError(f"{path}: malformed model/config/relations attribute ({exc})") from None
        raw_k = np.asarray(_attr(f, "k_values"))
        if raw_k.dtype.kind not in "iu":
            raise BundleError(f"{path}: k_values must be an integer array")
        k_values = tuple(int(k) for k in raw_k.reshape(-1))
        dtype = _str_attr(f, "dtype")
        if dtype not in ("float32", "float64"):
            raise BundleError(f"{path}: dtype must be float32 or float64, got {dtype!r}")
        n_train = _int_attr(f, "n_train")
        if not k_values or list(k_values) != sorted(set(k_values)) or k_values[0] != 0:
            raise BundleError(f"{path}: k_values must be unique, ascending and start at 0")
        for group in ("init", "nominal", "bounds"):
            if not isinstance(f.get(group), h5py.Group):
                raise BundleError(f"{path}: missing group /{group}")
        expected = spec.param_shapes
        init = _read_params(f["init"], expected, f"{path}:/init")
        nominal = _read_params(f["nominal"], expected, f"{path}:/nominal")
        lower, upper = {n: [] for n in expected}, {n: [] for n in expected}
        for k in k_values:
            key = str(k)
            kg = f["bounds"].get(key)
            if not isinstance(kg, h5py.Group) or not isinstance(kg.get("lower"), h5py.Group) \
                    or not isinstance(kg.get("upper"), h5py.Group):
                raise BundleError(f"{path}: missing or malformed /bounds/{key} (needs groups "
                                  f"lower and upper)")
            lo = _read_params(kg["lower"], expected, f"{path}:/bounds/{key}/lower")
            hi = _read_params(kg["upper"], expected, f"{path}:/bounds/{key}/upper")
            for n in expected:
                lower[n].append(lo[n].to(torch.float64))
                upper[n].append(hi[n].to(torch.float64))
        lower = {n: torch.stack(v) for n, v in lower.items()}
        upper = {n: torch.stack(v) for n, v in upper.items()}
        if not isinstance(f.get("order"), h5py.Dataset):
            raise BundleError(f"{path}: missing /order (the record order of each epoch)")
        order = np.asarray(f["order"])
        if order.ndim != 2 or order.shape[1] != n_train or order.dtype.kind not in "iu" or \
                any(not np.array_equal(np.sort(row), np.arange(n_train)) for row in order):
            raise BundleError(f"{path}: /order must be (epochs, n_train) with every row a "
                              f"permutation of the record indices")
        bundle = Bundle(path, spec, config, k_values, init, nominal, lower, upper, order,
                        relations, _str_attr(f, "dataset_sha256"), dtype, n_train,
                        _str_attr(f, "created"), _str_attr(f, "agt_version"))
    validate_bundle(bundle)
    return bundle


def _read_params(group, expected: dict, where: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in expected.items():
        if name not in group:
            raise BundleError(f"{where}: missing parameter '{name}'")
        value = np.asarray(group[name])
        if tuple(value.shape) != tuple(shape):
            raise BundleError(f"{where}/{name}: shape {value.shape}, model needs {tuple(shape)}")
        out[name] = torch.from_numpy(value)
    extra = set(group.keys()) - set(expected)
    if extra:
        raise BundleError(f"{where}: unexpected parameter(s) {sorted(extra)}")
    return out


def validate_bundle(bundle: Bundle) -> None:
    """lower <= nominal <= upper for every k, no NaN, and boxes nested in k."""
    where = bundle.path or "bundle"
    for name, nom in bundle.nominal.items():
        lo, hi = bundle.lower[name], bundle.upper[name]
        nom64 = nom.to(torch.float64).unsqueeze(0)
        if torch.isnan(lo).any() or torch.isnan(hi).any() or torch.isnan(nom64).any():
            raise BundleError(f"{where}: NaN in parameter '{name}'")
        bad = ~((lo <= nom64) & (nom64 <= hi))
        if bool(bad.any()):
            j = int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0])
            raise BundleError(f"{where}: nominal '{name}' outside its bounds at "
                              f"k={bundle.k_values[j]}; the bundle is corrupt or unsound")
        if lo.shape[0] > 1 and (bool((lo[1:] > lo[:-1]).any()) or bool((hi[1:] < hi[:-1]).any())):
            raise BundleError(f"{where}: bounds of '{name}' are not nested in k")

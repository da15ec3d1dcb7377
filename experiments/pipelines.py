"""Dataset pipelines of `agt reproduce`: the private training set, the queries, and the AGT
training config every experiment of one run shares.

blobs     generated (runs anywhere): configs/blobs.yaml as is.
octmnist  MedMNIST ``octmnist.npz`` from --data-dir (paper App. E.2). The private set is
          drusen vs normal, class-balanced (configs/octmnist.yaml); the conv layers are
          *pre-trained on public data* first: the whole network (conv + dense head, one logit,
          abnormal vs normal) is trained with Adam on the public classes CNV, DME and normal
          (`octmnist_public_split`, class-balanced, with every private record excluded), its
          state dict is saved as a .pt file and becomes the config's ``pretrained``; AGT then
          fine-tunes the dense head (``frozen_layers: 5``) on the private set. Queries: the
          drusen test images (the class the pre-trained model never saw).
imdb      768-d review embeddings ``imdb_embeddings.npz`` from --data-dir (App. E.3),
          MLP 768-100-1 (configs/imdb.yaml).

A missing file fails before any work with the loader's one-line `DataError`, which says how
to obtain it. Quick runs may subsample the private set (`pipeline.max_train`, stratified by
label, file order kept, seeded) and the test split (`pipeline.max_test`, the first records).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agt.config import TrainConfig, load_config
from agt.data import Dataset, load_dataset, octmnist_public_split, validate_dataset
from agt.errors import DataError
from agt.io import atomic_write
from agt.models import init_params
from agt.tensors import predicted_classes
from experiments.plan import Plan, display_path

PRETRAINED_NAME = "octmnist_pretrained.pt"


@dataclass(frozen=True)
class Prepared:
    """The shared inputs of one reproduce run."""

    config: TrainConfig                  # AGT config of the private model(s)
    dataset: Dataset                     # private training split + test split (the queries)
    config_overrides: dict = field(default_factory=dict)   # changes to the config file
    info: dict = field(default_factory=dict)               # provenance, pre-training stats


def subsample_train(ds: Dataset, n: int | None, seed: int) -> Dataset:
    """At most n training records, stratified by label (proportional, at least one per
    class), in file order, chosen by a generator seeded with `seed`."""
    if n is None or n >= ds.n_train:
        return ds
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(ds.y_train, return_counts=True)
    take = np.maximum(1, np.floor(n * counts / counts.sum()).astype(int))
    while take.sum() > n:
        take[np.argmax(take)] -= 1
    while take.sum() < n:
        room = counts - take
        take[np.argmax(room)] += 1
    keep = np.sort(np.concatenate([
        rng.choice(np.flatnonzero(ds.y_train == c), size=int(m), replace=False)
        for c, m in zip(classes, take)]))
    source = ds.source_index[keep] if ds.source_index is not None else keep.astype(np.int64)
    meta = {**ds.meta, "subsample": {"max_train": int(n), "seed": int(seed),
                                     "n_before": ds.n_train}}
    return validate_dataset(Dataset(ds.name, np.ascontiguousarray(ds.x_train[keep]),
                                    np.ascontiguousarray(ds.y_train[keep]), ds.x_test,
                                    ds.y_test, ds.n_classes, meta, source))


def limit_test(ds: Dataset, n: int | None) -> Dataset:
    if n is None or ds.x_test is None or n >= ds.n_test:
        return ds
    y = None if ds.y_test is None else ds.y_test[:n]
    return Dataset(ds.name, ds.x_train, ds.y_train, ds.x_test[:n], y, ds.n_classes,
                   {**ds.meta, "max_test": int(n)}, ds.source_index)


def _with_data_dir(cfg: TrainConfig, data_dir: str | Path | None) -> TrainConfig:
    if data_dir is None:
        return cfg
    data = {k: v for k, v in dict(cfg.raw["data"]).items() if k != "path"}
    data["data_dir"] = str(Path(data_dir).expanduser().resolve())
    return cfg.replace(data=data)


def prepare(plan: Plan, *, data_dir: str | Path | None, seed: int | None, out_dir: Path,
            progress: bool = False) -> Prepared:
    """Load the training config and the private data of `plan.dataset` (pre-training the
    OctMNIST conv layers on the public classes first)."""
    overrides = dict(plan.train_overrides)
    if seed is not None:
        overrides["seed"] = int(seed)
    cfg = load_config(plan.train_config, overrides or None)
    if plan.dataset != "blobs":
        cfg = _with_data_dir(cfg, data_dir)
        if data_dir is not None:
            overrides["data"] = {**cfg.raw["data"], "data_dir": display_path(data_dir)}
    base = plan.train_config.parent
    ds = load_dataset(cfg.data.name, cfg.data.options, base_dir=base)
    if ds.x_test is None or ds.y_test is None or ds.n_test == 0:
        raise DataError(f"dataset '{ds.name}' has no labelled test split; the experiments "
                        f"evaluate on it")
    p = plan.pipeline
    ds = limit_test(subsample_train(ds, p.max_train, cfg.seed), p.max_test)
    info: dict[str, Any] = {"dataset": ds.name, "n_train": ds.n_train, "n_test": ds.n_test,
                            "dataset_sha256": ds.sha256(),
                            "meta": _json_meta(ds.meta)}
    if plan.dataset == "octmnist":
        path, stats = pretrain_octmnist(cfg, ds, plan, base, out_dir / "pipeline", progress)
        cfg = cfg.replace(pretrained=str(path))
        overrides["pretrained"] = display_path(path)
        info["pretraining"] = stats
    return Prepared(cfg, ds, overrides, info)


def _json_meta(meta: dict) -> dict:
    out = {}
    for k, v in meta.items():
        if k == "source":
            out[k] = display_path(v)
        elif isinstance(v, (str, int, float, bool, type(None), list, dict)):
            out[k] = v
    return out


# ------------------------------------------------------------------------------------------
# OctMNIST pre-training on the public classes

def _accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, chunk: int = 2048) -> float:
    with torch.no_grad():
        z = torch.cat([model(torch.as_tensor(x[i:i + chunk], dtype=torch.float32))
                       for i in range(0, len(x), chunk)])
    return float(np.mean(predicted_classes(z).numpy() == y))


def pretrain_octmnist(cfg: TrainConfig, private: Dataset, plan: Plan, base: Path,
                      out_dir: Path, progress: bool = False) -> tuple[Path, dict]:
    """Train the whole network (abnormal vs normal, one logit) on the public classes with
    Adam and save its state dict; returns the .pt path and the pre-training statistics.

    Public set: `octmnist_public_split` (CNV, DME, normal; class-balanced) of the same file,
    minus every record of the private set (its `source_index`), so no record is both public
    and private; at most `pipeline.max_public` records (stratified). Initialisation:
    `init_params(spec, cfg.seed)`, the same as AGT's. Binary labels: 1 = abnormal."""
    p = plan.pipeline
    opts = dict(cfg.data.options)
    public = octmnist_public_split(path=opts.get("path"), data_dir=opts.get("data_dir"),
                                   base_dir=base, labels="binary", balance=True, seed=cfg.seed,
                                   exclude_indices=private.source_index)
    public = subsample_train(public, p.max_public, cfg.seed)
    if len(np.unique(public.y_train)) < 2:
        raise DataError(f"the OctMNIST public split has one class only after excluding the "
                        f"{private.n_train} private records "
                        f"({public.meta.get('train_class_counts')});"
                        f" the file has too few normal images for both sets")
    spec = cfg.model.with_input_shape(public.feature_shape)
    model = spec.build(torch.float32)
    model.load_state_dict(init_params(spec, cfg.seed, torch.float32))
    opt = torch.optim.Adam(model.parameters(), lr=p.pretrain_learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    x = torch.as_tensor(public.x_train, dtype=torch.float32)
    y = torch.as_tensor(public.y_train, dtype=torch.float32)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    t0 = time.perf_counter()
    n, b = x.shape[0], p.pretrain_batch_size
    steps = p.pretrain_epochs * ((n + b - 1) // b)
    bar = tqdm(total=steps, desc="OctMNIST pre-training (public)", unit="step",
               disable=not progress, leave=False)
    model.train()
    losses = []
    for _ in range(p.pretrain_epochs):
        order = torch.randperm(n, generator=gen)
        epoch_loss = 0.0
        for i in range(0, n, b):
            idx = order[i:i + b]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx])[:, 0], y[idx])
            loss.backward()
            opt.step()
            epoch_loss += float(loss.detach()) * len(idx)
            bar.update(1)
        losses.append(epoch_loss / n)
    bar.close()
    model.eval()
    stats = {
        "public_records": public.n_train,
        "public_class_counts": public.meta.get("train_class_counts"),
        "excluded_private_records": public.meta.get("n_excluded"),
        "epochs": p.pretrain_epochs, "batch_size": b, "learning_rate": p.pretrain_learning_rate,
        "optimizer": "adam", "loss": "binary_cross_entropy (1 = abnormal)",
        "epoch_losses": losses, "seconds": time.perf_counter() - t0,
        "public_test_accuracy": (_accuracy(model, public.x_test, public.y_test)
                                 if public.n_test else None),
        "private_test_accuracy_before_finetuning": _accuracy(model, private.x_test,
                                                             private.y_test),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PRETRAINED_NAME
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    atomic_write(path, lambda p: torch.save(state, p))
    stats["state_dict"] = display_path(path)
    return path, stats

"""Small generated files in exactly the formats of the real data (see `agt.data`).

They stand in for MedMNIST's ``octmnist.npz`` and the IMDB embedding file in tests and in
end-to-end runs on machines without the real data. The content is synthetic but learnable:
each class has its own pattern, so a model trained on it does better than chance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["write_fake_octmnist", "write_fake_imdb_embeddings"]

_SIDE = 28


def _class_template(c: int) -> np.ndarray:
    """A 28 x 28 template in [0, 1] for OctMNIST-like class c (0 CNV, 1 DME, 2 drusen, 3 normal).

    All classes share a bright retina-like band; abnormal classes add a class-specific mark:
    CNV a bulge above the band, DME a dark cyst inside it, drusen bumps along its lower edge.
    """
    rows, cols = np.mgrid[0:_SIDE, 0:_SIDE].astype(np.float64)
    centre_row = 15.0 + 1.5 * np.sin(cols / 6.0)
    img = 0.15 + 0.6 * np.exp(-((rows - centre_row) ** 2) / 6.0)
    if c == 0:  # CNV: a bright bulge above the band, in the middle
        img += 0.5 * np.exp(-((rows - 9.0) ** 2 + (cols - 14.0) ** 2) / 10.0)
    elif c == 1:  # DME: a dark round cyst inside the band
        img -= 0.5 * np.exp(-((rows - 15.0) ** 2 + (cols - 14.0) ** 2) / 8.0)
    elif c == 2:  # drusen: small bumps under the band
        for cc in (6.0, 14.0, 22.0):
            img += 0.45 * np.exp(-((rows - 20.0) ** 2 + (cols - cc) ** 2) / 3.0)
    return img


def _fake_oct_split(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    labels = np.arange(n) % 4  # every class present once n >= 4
    rng.shuffle(labels)
    templates = np.stack([_class_template(c) for c in range(4)])
    img = templates[labels]
    shift = rng.integers(-2, 3, size=n)  # small vertical jitter per image
    for i in range(n):
        img[i] = np.roll(img[i], shift[i], axis=0)
    img = img * rng.uniform(0.8, 1.2, size=(n, 1, 1)) + 0.08 * rng.standard_normal(img.shape)
    images = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
    return images, labels.astype(np.uint8).reshape(n, 1)


def write_fake_octmnist(path: str | Path, n_train: int = 400, n_val: int = 80,
                        n_test: int = 80, seed: int = 0) -> Path:
    """Write a MedMNIST-format ``octmnist.npz``: ``{train,val,test}_{images,labels}``.

    Images are N x 28 x 28 uint8, labels N x 1 uint8 in 0..3 (0 CNV, 1 DME, 2 drusen,
    3 normal), classes in near-equal numbers. A folder path gets ``octmnist.npz`` appended.
    Returns the file written.
    """
    for name, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if int(n) < 0:
            raise ValueError(f"{name} must be >= 0, got {n}")
    p = Path(path)
    if p.is_dir():
        p = p / "octmnist.npz"
    p.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        images, labels = _fake_oct_split(rng, int(n))
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = labels
    with open(p, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    return p


def write_fake_imdb_embeddings(path: str | Path, n_train: int = 400, n_test: int = 100,
                               dim: int = 768, seed: int = 0, class_offset: float = 2.0) -> Path:
    """Write an ``imdb_embeddings.npz``: x_train (n, dim) float32, y_train (n,) in {0, 1},
    x_test, y_test.

    Two Gaussian classes: a shared random mean (GPT-2 mean-pooled states are far from 0),
    +- `class_offset` along a random unit direction (class means 2 * class_offset apart),
    unit-variance isotropic noise; the Bayes error is Phi(-class_offset) (2.3% at 2.0).
    Labels alternate then get shuffled, so classes are balanced. A folder path gets
    ``imdb_embeddings.npz`` appended. Returns the file written.
    """
    if int(n_train) < 0 or int(n_test) < 0 or int(dim) < 1:
        raise ValueError(f"need n_train, n_test >= 0 and dim >= 1, got {n_train}, {n_test}, {dim}")
    p = Path(path)
    if p.is_dir():
        p = p / "imdb_embeddings.npz"
    p.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = 0.5 * rng.standard_normal(dim)
    direction = rng.standard_normal(dim)
    direction /= np.linalg.norm(direction)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % 2
        rng.shuffle(y)
        sign = np.where(y == 1, 1.0, -1.0)[:, None]
        x = base + class_offset * sign * direction + rng.standard_normal((n, dim))
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = split(int(n_train))
    x_test, y_test = split(int(n_test))
    with open(p, "wb") as fh:
        np.savez(fh, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return p

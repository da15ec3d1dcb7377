"""The IMDB embedding tool: review reading, pooling and the npz it writes (GPT-2 weights
cannot be downloaded here; the model path runs with a tiny random GPT-2 when transformers is
installed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agt.data import load_dataset
from agt.data.embed_imdb import main, mean_pool, read_reviews, split_and_save
from agt.errors import DataError


def make_reviews(root, n=6):
    for split in ("train", "test"):
        for name in ("pos", "neg"):
            d = root / split / name
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{i}_7.txt").write_text(f"{name} review {i} of {split}")


def test_read_reviews_and_labels(tmp_path):
    make_reviews(tmp_path)
    texts, labels = read_reviews(tmp_path)
    assert len(texts) == 24 and labels.sum() == 12
    assert all(("pos" in t) == bool(lab) for t, lab in zip(texts, labels))
    with pytest.raises(DataError, match="aclImdb"):
        read_reviews(tmp_path / "missing")


def test_mean_pool_ignores_padding():
    hidden = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = mean_pool(hidden, mask)
    torch.testing.assert_close(out[0], hidden[0, :2].mean(0))
    torch.testing.assert_close(out[1], hidden[1, 0])


def test_saved_file_loads_as_imdb_dataset(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 768)).astype(np.float32)
    y = rng.integers(0, 2, size=50)
    path = split_and_save(x, y, tmp_path / "imdb_embeddings.npz", 0.1, seed=0)
    ds = load_dataset("imdb", {"data_dir": str(tmp_path)})
    assert ds.x_train.shape == (45, 768) and ds.x_test.shape == (5, 768)
    assert path.exists() and not list(tmp_path.glob("*.partial*"))


def test_embed_batches_and_pools_with_any_tokenizer_and_model():
    """embed() with stand-ins for a transformers tokenizer/model (no weights here)."""
    from types import SimpleNamespace

    from agt.data.embed_imdb import embed

    class Tokenizer:
        pad_token = None
        eos_token = "<eos>"

        def __call__(self, texts, return_tensors, padding, truncation, max_length):
            ids = [[len(w) for w in t.split()][:max_length] for t in texts]
            width = max(len(i) for i in ids)
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
            ids = torch.tensor([i + [0] * (width - len(i)) for i in ids])
            return {"input_ids": ids, "attention_mask": mask}

    class Model:
        def eval(self):
            return self

        def __call__(self, input_ids, attention_mask):
            hidden = input_ids.to(torch.float32).unsqueeze(-1).expand(-1, -1, 768)
            return SimpleNamespace(last_hidden_state=hidden)

    texts = ["aa b", "ccc dddd ee", "f"]
    x = embed(texts, Tokenizer(), Model(), batch_size=2, max_tokens=8, progress=False)
    assert x.shape == (3, 768)
    np.testing.assert_allclose(x[:, 0], [1.5, 3.0, 1.0])


def test_cli_reports_missing_transformers_or_reviews(tmp_path, capsys):
    rc = main(["--reviews", str(tmp_path / "nope"), "--out", str(tmp_path / "o.npz")])
    assert rc == 2
    assert capsys.readouterr().err.startswith("agt: error:")
    assert not (tmp_path / "o.npz").exists()

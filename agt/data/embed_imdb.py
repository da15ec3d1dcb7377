"""Embed IMDB reviews with GPT-2 into the ``imdb_embeddings.npz`` format (agt/data/imdb.py).

    python -m agt.data.embed_imdb --reviews aclImdb --out DIR/imdb_embeddings.npz
                             [--model gpt2] [--max-reviews 40000] [--test-fraction 0.1]

Reads the Stanford ``aclImdb`` folder (``{train,test}/{pos,neg}/*.txt``), pools all reviews,
shuffles them with ``--seed``, keeps ``--max-reviews`` (the paper used about 40,000 with a
90/10 split), and embeds each review as the mean over its tokens of GPT-2's last hidden
states (768-d; truncated to ``--max-tokens``). Needs the optional extra
``pip install -e ".[embeddings]"`` (transformers) and GPT-2 weights available to
``transformers`` (a model name it can download, or a local directory via ``--model``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from agt.errors import AGTError, DataError
from agt.io import atomic_write


def read_reviews(root: str | Path) -> tuple[list[str], np.ndarray]:
    """All reviews of an aclImdb folder and their labels (1 = positive), in a fixed order."""
    root = Path(root)
    texts, labels = [], []
    for split in ("train", "test"):
        for name, label in (("neg", 0), ("pos", 1)):
            folder = root / split / name
            if not folder.is_dir():
                raise DataError(f"{folder} not found: --reviews must be the aclImdb folder with "
                                f"train/pos, train/neg, test/pos, test/neg")
            for path in sorted(folder.glob("*.txt")):
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
                labels.append(label)
    if not texts:
        raise DataError(f"no reviews found under {root}")
    return texts, np.asarray(labels, dtype=np.int64)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states (b, t, d) over the tokens where mask (b, t) is 1."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def embed(texts: list[str], tokenizer, model, batch_size: int = 16, max_tokens: int = 512,
          progress: bool = True) -> np.ndarray:
    from tqdm.auto import tqdm

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    out = []
    with torch.no_grad():
        for i in tqdm(range(0, len(texts), batch_size), desc="embedding", disable=not progress):
            enc = tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True,
                            truncation=True, max_length=max_tokens)
            hidden = model(**enc).last_hidden_state
            out.append(mean_pool(hidden, enc["attention_mask"]).float().numpy())
    return np.concatenate(out)


def split_and_save(x: np.ndarray, y: np.ndarray, out: Path, test_fraction: float,
                   seed: int) -> Path:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    def write(path: Path) -> None:
        with open(path, "wb") as fh:
            np.savez(fh, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])

    return atomic_write(out, write)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agt.data.embed_imdb",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--reviews", required=True, help="the aclImdb folder")
    ap.add_argument("--out", required=True, help="output imdb_embeddings.npz")
    ap.add_argument("--model", default="gpt2", help="transformers model name or local directory")
    ap.add_argument("--max-reviews", type=int, default=40_000)
    ap.add_argument("--test-fraction", type=float, default=0.1)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        try:
            from transformers import AutoModel, AutoTokenizer
        except ImportError:
            raise DataError(
                'embedding needs transformers: pip install -e ".[embeddings]"') from None
        texts, labels = read_reviews(args.reviews)
        rng = np.random.default_rng(args.seed)
        keep = np.sort(rng.permutation(len(texts))[:args.max_reviews])
        texts = [texts[i] for i in keep]
        labels = labels[keep]
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            model = AutoModel.from_pretrained(args.model)
        except OSError as exc:
            raise DataError(f"cannot load GPT-2 '{args.model}' ({exc.__class__.__name__}); pass "
                            f"--model DIR with downloaded weights") from None
        x = embed(texts, tokenizer, model, args.batch_size, args.max_tokens)
        path = split_and_save(x, labels, Path(args.out), args.test_fraction, args.seed)
    except AGTError as exc:
        print(f"agt: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {len(labels)} reviews, {x.shape[1]}-d embeddings")
    return 0


if __name__ == "__main__":
    sys.exit(main())

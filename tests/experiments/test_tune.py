"""`agt tune` and experiments/tune.py on tiny generated data: the written config trains with
`agt train`; the search picks the best-scoring (candidate, release) pair; the private file is
never opened; bad input is refused in one line before anything is written."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from agt.cli import main
from agt.config import config_from_dict, load_config
from agt.errors import ConfigError, DataError
from experiments import tune as tune_module
from experiments.public_tuning import budgeted_mechanism
from experiments.tune import (
    ReleaseBudget,
    auto_k_max,
    extrapolated_radius,
    grid_spec,
    load_public,
    parse_override,
    search_space,
    split_public,
    tune,
)

TEMPLATE = """\
model: [{linear: {in: 4, out: 2}}]
loss: cross_entropy
data: {name: npz, path: private.npz}
learning_rate: 1.0
n_epochs: 2
batch_size: full
clip_gamma: 0.1
k_values: "0..3"
device: cpu
"""


def _records(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, 4)) + 1.5 * (2 * y[:, None] - 1)
    return x, y


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    x, y = _records(48, 0)
    np.savez(d / "public.npz", x_train=x[:36], y_train=y[:36], x_test=x[36:], y_test=y[36:])
    xp, yp = _records(40, 1)
    np.savez(d / "private.npz", x_train=xp[:30], y_train=yp[:30], x_test=xp[30:],
             y_test=yp[30:])
    (d / "template.yaml").write_text(TEMPLATE)
    return d


class _Opens:
    """Paths the interpreter opens while `watching` (a PEP 578 audit hook: it sees numpy's
    and Python's opens, so a read of the private npz cannot pass unseen)."""

    hooked = False
    watching = False
    seen: list[str] = []

    @classmethod
    def hook(cls, event, args):
        if cls.watching and event == "open" and args and isinstance(args[0], (str, Path)):
            cls.seen.append(str(Path(args[0]).resolve()))


def _watch_opens() -> type[_Opens]:
    if not _Opens.hooked:
        sys.addaudithook(_Opens.hook)      # hooks cannot be removed: it idles when not watching
        _Opens.hooked = True
    _Opens.seen = []
    return _Opens


def test_tune_writes_a_config_that_trains_and_never_opens_the_private_file(files, capsys):
    d = files
    private = str((d / "private.npz").resolve())
    opens = _watch_opens()
    opens.watching = True
    try:
        code = main(["tune", "--public", str(d / "public.npz"), "--config",
                     str(d / "template.yaml"), "--queries", "10", "--epsilon-total", "5",
                     "--space", "none", "--grid", "learning_rate=0.5,2", "--grid",
                     "k_values=auto;0..3", "--max-k", "6", "--splits", "1", "--json",
                     "--out", str(d / "tuned.yaml")])
    finally:
        opens.watching = False
    assert code == 0
    assert str((d / "public.npz").resolve()) in opens.seen       # the hook does see opens
    assert private not in opens.seen
    out = json.loads(capsys.readouterr().out)
    chosen = out["chosen"]
    assert len(out["candidates"]) == 5          # the template's settings + 2 x 2
    tuned = load_config(d / "tuned.yaml")
    assert tuned.data.options["path"] == private   # carried over as an absolute path
    row = out["candidates"][[r["settings"] for r in out["candidates"]].index(
        chosen["settings"])]
    assert tuned.learning_rate == row["resolved"]["learning_rate"]
    assert grid_spec(tuned.k_values) == row["resolved"]["k_values"]
    assert chosen["mechanism"] == row["best_mechanism"] and chosen["score"] == row["score"]
    # the written config is one agt train takes; now the private file is read (by train)
    opens.watching = True
    try:
        assert main(["train", "--config", str(d / "tuned.yaml"), "--out",
                     str(d / "tuned.h5"), "--quiet"]) == 0
    finally:
        opens.watching = False
    assert private in opens.seen
    assert "# Written by agt tune" in (d / "tuned.yaml").read_text()


def test_the_search_picks_the_best_scoring_pair(files, monkeypatch):
    """With a scorer whose values are known, the chosen (settings, release) pair is the
    one with the best mean over the splits; ties go to the earlier candidate."""
    table = {0.5: {"exp-radius": [0.6, 0.7], "gs": [0.9, 0.1]},
             1.0: {"exp-radius": [0.8, 0.7], "gs": [0.5, 0.5]},      # 0.75: best
             2.0: {"exp-radius": [0.7, 0.8], "gs": [0.5, 0.5]}}      # 0.75: a tie, later
    calls = []

    def scores(cfg, data, releases, **kw):
        calls.append((cfg.learning_rate, data.name))
        split = int(data.name.rsplit("-", 1)[1])
        return {m: table[cfg.learning_rate].get(m, [0.0, 0.0])[split] for m in releases}

    monkeypatch.setattr(tune_module, "release_scores", scores)
    template = load_config(files / "template.yaml")
    result = tune(load_public(files / "public.npz"), template, ReleaseBudget(10, 5.0),
                  space={"learning_rate": [0.5, 2.0]}, splits=2)
    # the template (lr 1) first, then the space: every valid candidate on every split
    assert [r["resolved"]["learning_rate"] for r in result.candidates] == [1.0, 0.5, 2.0]
    assert sorted(calls) == sorted((lr, f"public-split-{s}") for lr in (1.0, 0.5, 2.0)
                                   for s in (0, 1))
    assert result.settings == {} and result.mechanism == "exp-radius"
    assert result.score == pytest.approx(0.75)
    assert result.config.learning_rate == 1.0
    assert result.candidates[1]["scores"] == {"exp-radius": pytest.approx(0.65),
                                              "gs": pytest.approx(0.5),
                                              "ss-argmax": 0.0, "ss-cauchy": 0.0}
    # a release that cannot serve a candidate (None) is never chosen for it
    monkeypatch.setattr(tune_module, "release_scores",
                        lambda cfg, data, releases, **kw: {m: (None if m == "exp-radius"
                                                               else 0.3) for m in releases})
    other = tune(load_public(files / "public.npz"), template, ReleaseBudget(10, 5.0),
                 space={"learning_rate": [-1.0]}, splits=1)
    assert other.mechanism == "ss-argmax"
    # a candidate the config validation refuses stays in the table with its reason
    assert "learning_rate must be > 0" in other.candidates[1]["error"]
    assert other.candidates[1]["score"] is None


def test_public_split_is_a_seeded_partition(files):
    public = load_public(files / "public.npz")
    assert public.n_train == 48 and public.x_test is None
    a, b = split_public(public, 0.25, 0, 0), split_public(public, 0.25, 0, 1)
    assert a.n_test == 12 and a.n_train == 36
    rows = {tuple(r) for r in np.concatenate([a.x_train, a.x_test])}
    assert rows == {tuple(r) for r in public.x_train}
    assert not np.array_equal(a.x_test, b.x_test)
    np.testing.assert_array_equal(split_public(public, 0.25, 0, 0).x_test, a.x_test)
    with pytest.raises(ConfigError, match="too few"):
        split_public(load_public(files / "public.npz").__class__(
            "p", public.x_train[:2], public.y_train[:2], None, None, 2), 0.25, 0, 0)


def test_auto_k_grid_follows_the_exact_law():
    """exp-radius gives the certified answer with probability 1 / (1 + (C-1) e^(-eps(r+1)));
    the auto grid ends at the first r where that reaches 0.99, capped."""
    planned = budgeted_mechanism("exp-radius", 2.0, 0.0, 10)
    eps = planned.epsilon
    expect = math.ceil(math.log(99 * 2) / eps - 1)      # C = 3
    assert auto_k_max({"exp-radius": planned}, 3, 500) == expect
    assert auto_k_max({"exp-radius": planned}, 3, 10) == 10
    assert grid_spec([0, 1, 2, 5, 7, 8]) == "0..2,5,7..8"


def test_search_space_and_overrides():
    template = config_from_dict({"model": [{"linear": {"in": 4, "out": 2}}],
                                 "loss": "cross_entropy", "learning_rate": 2.0,
                                 "clip_gamma": 0.1})
    space = search_space(template, "small")
    assert space["learning_rate"] == [1.0, 2.0, 4.0]
    assert space["k_values"] == ["auto"] and space["bound_method"] == ["served-k0"]
    assert search_space(template, "none", input_norm_bound=1.0)["bound_method"] == [
        "served-k0", "stability"]
    assert parse_override("k_values=auto;0..5") == ("k_values", ["auto", "0..5"])
    assert parse_override("batch-size=full,32") == ("batch_size", ["full", 32])
    for bad, match in (("momentum=0.9", "cannot tune"), ("learning_rate", "KEY=V1"),
                       ("n_epochs=two", "not a number"), ("clip_gamma=", "at least one")):
        with pytest.raises(ConfigError, match=match):
            parse_override(bad)
    with pytest.raises(ConfigError, match="unknown search space"):
        search_space(template, "huge")


def test_bad_input_is_refused_in_one_line(files, capsys):
    d = files
    base = ["tune", "--config", str(d / "template.yaml"), "--queries", "10",
            "--epsilon-total", "1", "--space", "none", "--splits", "1"]
    np.savez(d / "wide.npz", x_train=np.zeros((20, 5)), y_train=np.arange(20) % 2)
    cases = [
        (["--public", str(d / "missing.npz")], "not found"),
        (["--public", str(d / "private.npz")], "private training file"),
        (["--public", str(d / "wide.npz")], "do not fit the template's model"),
        (["--public", str(d / "public.npz"), "--grid", "momentum=0.5"], "cannot tune"),
        (["--public", str(d / "public.npz"), "--validation-fraction", "0"], "(0, 1)"),
    ]
    for extra, match in cases:
        out = d / "bad.yaml"
        assert main(base + extra + ["--out", str(out)]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("agt: error:") and match in err and "\n" not in err, err
        assert not out.exists()
    assert main(base + ["--public", str(d / "public.npz"), "--out", str(d / "x.csv")]) == 2
    assert "must end in .yaml" in capsys.readouterr().err


def test_a_class_the_public_records_lack_is_kept(files, monkeypatch):
    """A three-class template tuned on public records of two classes trains and scores on
    three classes (the model's), never on the public labels' count."""
    seen = []
    monkeypatch.setattr(tune_module, "release_scores", lambda cfg, data, releases, **kw: (
        seen.append(data.n_classes) or {m: 0.5 for m in releases}))
    template = config_from_dict({"model": [{"linear": {"in": 4, "out": 3}}],
                                 "loss": "cross_entropy", "k_values": "0..3"})
    result = tune(load_public(files / "public.npz"), template, ReleaseBudget(10, 5.0),
                  space={}, splits=1)
    assert seen == [3] and result.mechanism == "exp-radius"
    wide = config_from_dict({"model": [{"linear": {"in": 4, "out": 1}}],
                             "loss": "binary_cross_entropy"})
    three = load_public(files / "public.npz")
    three = three.__class__("p", three.x_train, np.arange(48) % 3, None, None, 3)
    with pytest.raises(DataError, match="3 classes but the template's model predicts 2"):
        tune(three, wide, ReleaseBudget(10, 5.0), space={}, splits=1)


def test_radii_are_extrapolated_to_the_private_size(files, monkeypatch):
    """Given N, a full-batch candidate trains on a contiguous grid reaching the private
    grid's largest k / (N / n) and its radii k* become the private grid index of
    floor(k* N / n); -1 stays -1."""
    grid = (0, 1, 2, 3, 4, 5, 10, 20)
    np.testing.assert_array_equal(
        extrapolated_radius(np.array([-1, 0, 1, 2, 4, 9]), 2.5, grid), [-1, 0, 2, 5, 6, 7])
    seen = []

    def scores(cfg, data, releases, radius_map=None, **kw):
        seen.append((tuple(cfg.k_values), radius_map(np.array([-1, 3]))))
        return {m: 0.5 for m in releases}

    monkeypatch.setattr(tune_module, "release_scores", scores)
    template = load_config(files / "template.yaml")
    result = tune(load_public(files / "public.npz"), template, ReleaseBudget(10, 5.0),
                  space={}, splits=1, private_records=72)       # 36 public training records
    (k_values, mapped), = seen
    assert k_values == (0, 1, 2) and list(mapped) == [-1, 3]     # 0..3 / 2, radius 3 -> k 6
    assert tuple(result.config.k_values) == (0, 1, 2, 3)          # the written grid
    assert "extrapolated" in result.notes[0]

"""CLI: ``agt train --ensemble T`` and ``agt teacher-labels`` (budget, ledger, labels file,
student)."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from agt.cli import main
from agt.data import load_dataset
from agt.ensemble import read_ensemble
from mechanisms.accounting import per_query_epsilon
from mechanisms.ledger import Ledger, hash_query


class _no_exit:
    value = None

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False

CONFIG = """\
model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, variant: overlapping, n_samples: 501, test_fraction: 0.2, seed: 0}
learning_rate: 0.5
lr_decay: 0.1
clip_gamma: 0.5
n_epochs: 2
k_values: "0..20"
device: cpu
"""
Q = 40
MECHS = ("lnmax", "ens-ss-laplace", "ens-ss-cauchy", "ens-ptr", "ens-ptr-votes", "ens-ptr-gs",
         "ens-exp-radius", "ens-svt", "gs", "ss-cauchy", "ss-laplace", "exp-radius", "ptr", "svt")
PURE = ("lnmax", "ens-ss-cauchy", "gs", "ss-cauchy", "exp-radius", "ens-exp-radius")
SESSIONS = ("svt", "ens-svt")


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ens_cli")
    (d / "blobs.yaml").write_text(CONFIG)
    ds = load_dataset("blobs", {"variant": "overlapping", "n_samples": 300, "seed": 9})
    np.savez(d / "public.npz", x=ds.x_train[:Q], y=ds.y_train[:Q], x_test=ds.x_test,
             y_test=ds.y_test)
    np.savez(d / "public_nolabels.npz", x=ds.x_train[:Q])
    rc = main(["train", "--config", str(d / "blobs.yaml"), "--ensemble", "3",
               "--out", str(d / "ens"), "--quiet"])
    assert rc == 0
    return d


def labels_args(workdir, tmp_path, mech, eps=1.0, delta=1e-5, out="labels.npz", ledger="l.db",
                *extra):
    return ["teacher-labels", "--ensemble", workdir / "ens", "--public", workdir / "public.npz",
            "--mechanism", mech, "--epsilon-total", eps, "--delta-total", delta,
            "--out", tmp_path / out, "--ledger", tmp_path / ledger, "--insecure-seed", 1, *extra]


def releases(path):
    with Ledger.open(path) as ledger:
        return ledger.entries()


# -- agt train --ensemble -----------------------------------------------------------------

def test_train_ensemble_command(workdir, capsys, tmp_path):
    rc, out, err = run(capsys, "train", "--config", workdir / "blobs.yaml", "--ensemble", 4,
                       "--out", tmp_path / "e4")
    assert rc == 0, err
    assert "trained 4 teachers on blobs: n=401 split by record index mod 4 (100..101 records" in out
    assert "relations replace-one" in out and "test accuracy (nominal vote)" in out
    assert "AGT teachers (T=4)" in err                 # progress bar over teachers
    ens = read_ensemble(tmp_path / "e4")
    assert ens.n_teachers == 4 and ens.k_values == tuple(range(21))


@pytest.mark.parametrize("argv,message", [
    (["--ensemble", 3, "--out", "x.h5"], "written as a directory"),
    (["--ensemble", 5, "--k-values", "0..80"], "k value 80 must be smaller than every teacher"),
    (["--ensemble", -2], "expected an integer"),
    (["--ensemble", 0], "expected an integer >= 1"),
    (["--ensemble", 900], "at least one record each"),
])
def test_train_ensemble_command_errors(workdir, capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = [a if a != "x.h5" else tmp_path / "x.h5" for a in argv]
    if "--out" not in argv:
        argv += ["--out", tmp_path / "ens"]
    with pytest.raises(SystemExit) if message.startswith("expected") else _no_exit() as info:
        rc, _, err = run(capsys, "train", "--config", workdir / "blobs.yaml", "--quiet", *argv)
    if info is not None and getattr(info, "value", None) is not None:   # argparse usage error
        err = capsys.readouterr().err
        assert info.value.code == 2 and message in err
    else:
        assert rc == 2 and message in err and err.startswith("agt: error:")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_train_ensemble_in_parallel_gives_the_serial_ensemble(workdir, capsys, tmp_path):
    serial = read_ensemble(workdir / "ens")
    rc, out, err = run(capsys, "train", "--config", workdir / "blobs.yaml", "--ensemble", 3,
                       "--workers", 2, "--threads", 1, "--out", tmp_path / "p")
    assert rc == 0, err
    assert "execution: process, 2 worker(s), 1 thread(s) per teacher" in out
    assert "AGT teachers (T=3)" in err and "3/3" in err
    parallel = read_ensemble(tmp_path / "p")
    assert parallel.ensemble_id == serial.ensemble_id
    assert [b.bundle_id for b in parallel.bundles] == [b.bundle_id for b in serial.bundles]


def test_a_teachers_user_error_is_one_line_and_writes_nothing(workdir, capsys, tmp_path):
    """Every teacher fails with the same ConfigError (its pretrained file is missing): reported
    once, never retried, and no ensemble directory appears."""
    body = (workdir / "blobs.yaml").read_text() + f"pretrained: {tmp_path / 'missing.pt'}\n"
    (tmp_path / "c.yaml").write_text(body)
    rc, out, err = run(capsys, "train", "--config", tmp_path / "c.yaml", "--ensemble", 3,
                       "--out", tmp_path / "e", "--quiet")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("agt: error: pretrained file not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


@pytest.mark.parametrize("argv,message", [
    (["--workers", 2], "give --ensemble T"),
    (["--ensemble", 3, "--workers", 2, "--threads", 100000], r"exceeds the \d+ core"),
    (["--ensemble", 3, "--ray-address", "local", "--threads", 100000],
     r"exceeds the \d+ core|needs Ray"),
    (["--threads", 100000], r"1 worker\(s\) x 100000 thread\(s\) \(--threads\)"),
])
def test_parallel_options_refused_before_any_work(workdir, capsys, tmp_path, argv, message):
    rc, out, err = run(capsys, "train", "--config", workdir / "blobs.yaml", "--quiet",
                       "--out", tmp_path / "e", *argv)
    assert rc == 2 and re.search(message, err) and err.startswith("agt: error:")
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_ray_address_without_ray_is_a_one_line_error(workdir, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    rc, _, err = run(capsys, "train", "--config", workdir / "blobs.yaml", "--ensemble", 3,
                     "--ray-address", "auto", "--out", tmp_path / "e", "--quiet")
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("agt: error: the Ray backend needs Ray, which is not installed: "
                          "pip install -e \".[distributed]\"")
    assert list(tmp_path.iterdir()) == []


# -- agt teacher-labels -------------------------------------------------------------------

@pytest.mark.parametrize("mech", MECHS)
def test_teacher_labels_every_mechanism_records_every_label(workdir, tmp_path, capsys, mech):
    # these three answer (almost) nothing on this grid, so the check before spending refuses
    # them (tests/agt/cli/test_plan.py); here the owner overrides it to test the recording
    force = ("--force",) if mech in ("ens-ptr-votes", "ens-svt", "svt") else ()
    rc, out, err = run(capsys, *labels_args(workdir, tmp_path, mech, 200.0, 1e-5,
                                            "labels.npz", "l.db", *force))
    assert rc == 0, err
    f = np.load(tmp_path / "labels.npz")
    labels = f["labels"]
    assert labels.shape == (Q,) and labels.dtype == np.int64
    assert set(np.unique(labels)) <= ({-1, 0, 1} if "ptr" in mech or mech in SESSIONS
                                      else {0, 1})
    assert str(f["mechanism"]) == mech and str(f["relation"]) == "replace-one"
    single = not (mech == "lnmax" or mech.startswith("ens-"))
    assert int(f["n_queries"]) == Q and int(f["n_teachers"]) == (1 if single else 3)
    # owner-only values are never written: no votes or radii, no hash of the private data
    # or of the models, no query hashes
    assert not {"votes", "radius", "radii", "teacher_predictions", "source_id",
                "dataset_sha256", "query_hash", "ledger_mechanism"} & set(f.files)
    assert bool(f["seeded"]) and "insecure_seed" not in f.files   # the seed would undo the noise
    x = np.load(workdir / "public.npz")["x"]
    rows = releases(tmp_path / "l.db")
    if mech in SESSIONS:     # one session: one ledger entry for all Q labels, the whole budget
        assert len(rows) == 1 and "session of 40 queries" in rows[0].note
        assert not bool(f["guarantee_per_query"])
        assert (float(f["epsilon_per_query"]), float(f["delta_per_query"])) == (200.0, 1e-5)
        assert "the whole session" in out
        return
    # the ledger holds one release per label, for the query it labelled, in order
    assert len(rows) == Q
    assert [r.query_hash for r in rows] == [hash_query(x[i]) for i in range(Q)]
    assert {r.mechanism for r in rows} == {mech}
    assert all("relation=replace-one" in r.note and r.seeded for r in rows)
    eps_q = float(f["epsilon_per_query"])
    delta_q = 0.0 if mech in PURE else 1e-5 / (2 * Q)
    assert float(f["delta_per_query"]) == delta_q
    assert eps_q == per_query_epsilon(200.0, 1e-5, Q, delta_q, "best")
    with Ledger.open(tmp_path / "l.db") as ledger:
        assert ledger.spent().fits(200.0, 1e-5)
        assert ledger.per_query == (eps_q, delta_q)   # "best" fixes the plan's guarantee
    # with a large budget the labels are mostly the (accurate) ensemble answers (not for PTR
    # on votes alone: 3 teachers give a distance of at most 1, below any useful threshold)
    answered = labels >= 0
    y = np.load(workdir / "public.npz")["y"]
    if mech != "ens-ptr-votes":
        assert answered.mean() > 0.8 and (labels[answered] == y[answered]).mean() > 0.8
        assert "label accuracy on the answered public queries" in out
    # stdout carries no owner-only number either
    assert "radius" not in out.replace(mech, "") and "vote" not in out.replace(mech, "")


def test_refuses_past_the_total_budget(workdir, tmp_path, capsys):
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", eps=1.0, delta=0.0))
    assert rc == 0, err
    assert len(releases(tmp_path / "l.db")) == Q
    # the budget is spent: a second labelling run on the same ledger is refused
    rc, out, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", eps=1.0, delta=0.0,
                                            out="again.npz"))
    assert rc == 2 and "over the budget" in err and "nothing was released" in err
    assert not (tmp_path / "again.npz").exists()
    assert len(releases(tmp_path / "l.db")) == Q
    # a ledger created with another budget is not silently re-budgeted
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", eps=5.0, delta=0.0,
                                          out="again.npz"))
    assert rc == 2 and "other settings" in err
    assert not (tmp_path / "again.npz").exists() and len(releases(tmp_path / "l.db")) == Q


def test_a_standard_ledger_plans_from_what_is_left(workdir, tmp_path, capsys):
    ens = read_ensemble(workdir / "ens")
    with Ledger.open(tmp_path / "l.db", 2.0, 1e-5, dataset_sha256=ens.manifest["dataset_sha256"]
                     ) as ledger:
        assert ledger.accountant.name == "standard"
    rc, out, err = run(capsys, *labels_args(workdir, tmp_path, "ens-ss-cauchy", eps=2.0))
    assert rc == 0, err
    f = np.load(tmp_path / "labels.npz")
    assert float(f["epsilon_per_query"]) == pytest.approx(2.0 / Q)
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "ens-ss-cauchy", eps=2.0,
                                          out="again.npz"))
    assert rc == 2 and "budget is spent" in err
    assert len(releases(tmp_path / "l.db")) == Q


def test_a_ledger_of_another_dataset_is_refused(workdir, tmp_path, capsys):
    with Ledger.open(tmp_path / "l.db", 100.0, 1e-5, dataset_sha256="ef" * 32):
        pass
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", eps=100.0))
    assert rc == 2 and "one ledger per private dataset" in err
    assert releases(tmp_path / "l.db") == [] and not (tmp_path / "labels.npz").exists()


def test_spend_is_committed_before_any_noise(workdir, tmp_path, capsys, monkeypatch):
    from mechanisms.ensemble import NoisyArgmax

    def boom(*a, **k):
        raise RuntimeError("noise source failed")
    monkeypatch.setattr(NoisyArgmax, "_draw", boom)
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax"))
    # one line that says the budget is spent; the failure's own text is not repeated (it
    # may hold private values)
    assert rc == 2 and "budget is spent" in err and "noise source failed" not in err
    assert len(releases(tmp_path / "l.db")) == Q             # recorded: the safe side
    assert not (tmp_path / "labels.npz").exists()


def test_seeded_runs_reproduce_and_unseeded_runs_are_recorded_as_such(workdir, tmp_path, capsys):
    for name in ("a", "b"):
        rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "ens-ss-laplace", eps=20.0,
                                              out=f"{name}.npz", ledger=f"{name}.db"))
        assert rc == 0, err
    assert np.array_equal(np.load(tmp_path / "a.npz")["labels"],
                          np.load(tmp_path / "b.npz")["labels"])
    argv = labels_args(workdir, tmp_path, "lnmax", eps=20.0, out="c.npz", ledger="c.db")
    argv = argv[:argv.index("--insecure-seed")] + argv[argv.index("--insecure-seed") + 2:]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    assert not bool(np.load(tmp_path / "c.npz")["seeded"])
    assert not any(r.seeded for r in releases(tmp_path / "c.db")) and "INSECURE" not in out
    with pytest.raises(SystemExit):                           # the old flag is gone
        main([str(a) for a in labels_args(workdir, tmp_path, "lnmax") + ["--seed", "3"]])


def test_default_ledger_is_the_datasets_own(workdir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGT_LEDGER_DIR", str(tmp_path / "ledgers"))
    argv = ["teacher-labels", "--ensemble", workdir / "ens", "--public", workdir / "public.npz",
            "--mechanism", "lnmax", "--epsilon-total", 1.0, "--delta-total", 1e-6,
            "--out", tmp_path / "l.npz"]
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    ens = read_ensemble(workdir / "ens")
    from mechanisms import default_ledger_path
    path = default_ledger_path(ens.manifest["dataset_sha256"])
    assert path.parent == tmp_path / "ledgers" and len(releases(path)) == Q
    assert "ledger" not in np.load(tmp_path / "l.npz").files
    # its file name is a keyed hash of the dataset's hash, the same for every release from
    # this dataset and another for a neighbour: not in what a release prints (a review's find)
    assert "the dataset's default ledger: spent" in out and path.stem not in out + err
    # a single teacher of the ensemble spends the same dataset's budget: the same ledger
    argv2 = ["teacher-labels", "--ensemble", workdir / "ens" / "teacher_001.h5", "--public",
             workdir / "public.npz", "--mechanism", "gs", "--epsilon-total", 1.0,
             "--delta-total", 1e-6, "--out", tmp_path / "m.npz"]
    rc, out, err = run(capsys, *argv2)
    assert rc == 2 and "budget" in err and len(releases(path)) == Q
    assert path.stem not in out + err
    # nor in the refusal of other settings (a review's find)
    rc, out, err = run(capsys, *argv, "--relation", "add-remove", "--overwrite")
    assert rc == 2 and "this dataset's default ledger" in err and path.stem not in out + err
    # a new default ledger without a budget is refused without its name either
    argv3 = ["predict", "--bounds", workdir / "ens" / "teacher_001.h5", "--data",
             workdir / "public.npz", "--mechanism", "gs", "--epsilon", 1.0,
             "--out", tmp_path / "n.csv"]
    monkeypatch.setenv("AGT_LEDGER_DIR", str(tmp_path / "other-ledgers"))
    rc, out, err = run(capsys, *argv3)
    assert rc == 2 and "this dataset's default ledger is a new ledger" in err
    assert not any(p.suffix == ".db" for p in (tmp_path / "other-ledgers").iterdir())
    assert ".db" not in out + err


def test_ptr_abstains_at_small_epsilon_and_reports(workdir, tmp_path, capsys):
    # expected to answer nothing: refused before spending unless the owner overrides
    args = labels_args(workdir, tmp_path, "ens-ptr-votes", 1.0, 1e-5, "labels.npz", "l.db",
                       "--train-student")
    rc, out, err = run(capsys, *args)
    assert rc == 2 and "refused before spending" in err and not (tmp_path / "l.db").exists()
    rc, out, err = run(capsys, *args, "--force")
    assert rc == 0, err
    f = np.load(tmp_path / "labels.npz")
    assert str(f["mechanism"]) == "ens-ptr-votes"
    assert (f["labels"] == -1).all() and not f["answered"].any()   # eps_q ~ 0.02: no answer
    assert "answered 0 of 40" in out and "no student trained" in out


def test_train_student_reports_test_accuracy(workdir, tmp_path, capsys):
    rc, out, err = run(capsys, *labels_args(workdir, tmp_path, "ens-ss-cauchy", 400.0, 1e-5,
                                            "labels.npz", "l.db", "--train-student",
                                            "--radius-rule", "tight"))
    assert rc == 0, err
    line = next(s for s in out.splitlines() if s.startswith("student"))
    assert f"{Q} labels" in line
    assert float(line.rsplit("test accuracy ", 1)[1].split()[0]) > 0.8
    assert "min-cost" in str(np.load(tmp_path / "labels.npz")["guarantee"])
    # a public file without x_test/y_test: trained, no accuracy
    argv = labels_args(workdir, tmp_path, "lnmax", 400.0, 1e-5, "b.npz", "b.db", "--train-student")
    argv[argv.index(workdir / "public.npz")] = workdir / "public_nolabels.npz"
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    assert "no x_test/y_test, so no test accuracy" in out


def test_single_mechanisms_take_a_bundle_or_a_teacher(workdir, tmp_path, capsys):
    argv = labels_args(workdir, tmp_path, "gs", 10.0, 0.0, "a.npz", "a.db", "--teacher", 2)
    rc, _, err = run(capsys, *argv)
    assert rc == 0, err
    argv = labels_args(workdir, tmp_path, "ss-cauchy", 10.0, 1e-6, "b.npz", "b.db")
    argv[argv.index(workdir / "ens")] = workdir / "ens" / "teacher_001.h5"
    rc, out, err = run(capsys, *argv)
    assert rc == 0, err
    f = np.load(tmp_path / "b.npz")
    assert str(f["mechanism"]) == "ss-cauchy" and float(f["delta_per_query"]) == 0.0
    assert int(f["n_teachers"]) == 1
    # a teacher bundle on its own states replace-one, never add-remove (item 3)
    assert str(f["relation"]) == "replace-one"
    argv = labels_args(workdir, tmp_path, "ss-cauchy", 10.0, 1e-6, "c.npz", "c.db",
                       "--relation", "add-remove")
    argv[argv.index(workdir / "ens")] = workdir / "ens" / "teacher_001.h5"
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and "no add-remove guarantee" in err


def _swap(argv, old, new):
    argv[argv.index(old)] = new
    return argv


@pytest.mark.parametrize("mech,change,message", [
    ("lnmax", lambda a, w, t: _swap(a, w / "ens", w / "ens" / "teacher_000.h5"),
     "needs an ensemble directory"),
    ("lnmax", lambda a, w, t: _swap(a, w / "ens", t / "nothing"), "ensemble not found"),
    ("gs", lambda a, w, t: a + ["--teacher", 3], "--teacher 3 is out of range"),
    ("ens-ss-laplace", lambda a, w, t: _swap(a, 1e-5, 0.0), "needs a delta budget"),
    ("ens-ptr", lambda a, w, t: a + ["--per-query-delta", 0.01], "per-query delta"),
    ("lnmax", lambda a, w, t: a + ["--per-query-delta", 1e-9], "takes no per-query delta"),
    ("lnmax", lambda a, w, t: _swap(a, t / "labels.npz", t / "labels.csv"),
     "--out must end in .npz"),
    ("lnmax", lambda a, w, t: a + ["--student-config", "s.yaml"], "needs --train-student"),
])
def test_teacher_labels_bad_input(workdir, tmp_path, capsys, mech, change, message):
    argv = change(labels_args(workdir, tmp_path, mech), workdir, tmp_path)
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and message in err, err
    assert not (tmp_path / "labels.npz").exists() and not (tmp_path / "labels.csv").exists()
    if (tmp_path / "l.db").exists():
        assert releases(tmp_path / "l.db") == []


def test_multiclass_teachers_get_multiclass_mechanisms_only(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 6))
    y = rng.integers(0, 3, size=90)
    np.savez(tmp_path / "three.npz", x_train=x, y_train=y)
    (tmp_path / "c.yaml").write_text(CONFIG.replace("out: 2", "out: 3").replace(
        'k_values: "0..20"', 'k_values: "0..5"'))
    rc, out, err = run(capsys, "train", "--config", tmp_path / "c.yaml", "--data",
                       tmp_path / "three.npz", "--ensemble", 3, "--out", tmp_path / "e", "--quiet")
    assert rc == 0, err
    np.savez(tmp_path / "pub.npz", x=x[:10])
    common = ["teacher-labels", "--ensemble", tmp_path / "e", "--public", tmp_path / "pub.npz",
              "--epsilon-total", 10, "--delta-total", 1e-5, "--ledger", tmp_path / "l.db"]
    for mech in ("ens-ss-cauchy", "gs"):
        rc, _, err = run(capsys, *common, "--mechanism", mech, "--out", tmp_path / "l.npz")
        assert rc == 2 and "at most 2 classes" in err and "3" in err
    assert not (tmp_path / "l.npz").exists()
    rc, _, err = run(capsys, *common, "--mechanism", "lnmax", "--out", tmp_path / "ok.npz")
    assert rc == 0, err
    assert set(np.unique(np.load(tmp_path / "ok.npz")["labels"])) <= {0, 1, 2}


def test_teacher_option_is_refused_for_ensemble_mechanisms(workdir, tmp_path, capsys):
    """--teacher picks the model of a single-model mechanism; given with an ensemble
    mechanism it was silently ignored."""
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax"), "--teacher", "3")
    assert rc == 2 and "--teacher applies to single-model mechanisms" in err
    assert not (tmp_path / "l.db").exists() or not releases(tmp_path / "l.db")


def test_teacher_labels_cannot_write_over_its_ledger(workdir, tmp_path, capsys):
    """--out naming the ledger would replace it by the labels after the spend (a review's
    find, with --overwrite): refused before anything is spent."""
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", 20.0, 1e-5, "l.npz",
                                          "l.npz"), "--overwrite")
    assert rc == 2 and "is the file given as --ledger" in err
    assert not (tmp_path / "l.npz").exists()
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "lnmax", 20.0, 1e-5, "l.npz",
                                          "ledger.db"), "--overwrite")
    assert rc == 0, err      # another name is fine
    assert len(releases(tmp_path / "ledger.db")) == Q


def test_refused_first_releases_create_no_ledger(workdir, tmp_path, capsys):
    """A new user's review: a refused first release (over the budget, a bad student config,
    settings that do not go together) still created the ledger, whose budget, accountant
    and fixed per-query guarantee then bound every later call; the advice to lower the
    per-query epsilon could never help. Now the release is tried on an in-memory ledger of
    the same settings first, and a refusal leaves no file."""
    bad_student = tmp_path / "student.yaml"
    bad_student.write_text(CONFIG.replace("in: 6", "in: 7"))
    predict = ["predict", "--bounds", workdir / "ens" / "teacher_000.h5", "--data",
               workdir / "public.npz", "--split", "test", "--mechanism", "exp-radius",
               "--epsilon", 1.0, "--out", tmp_path / "p.csv"]
    refusals = [
        (predict + ["--ledger", tmp_path / "a.db", "--budget-epsilon", 5.0], "a.db",
         "at most 5 of these queries fit"),
        (predict + ["--ledger", tmp_path / "b.db", "--budget-epsilon", 50.0,
                    "--budget-delta", 1e-6, "--accountant", "advanced"], "b.db",
         "charges every query its fixed (1.0, 0.0)"),
        (labels_args(workdir, tmp_path, "lnmax", 10.0, 0.0, "s.npz", "c.db",
                     "--train-student", "--student-config", bad_student), "c.db",
         "expects 7 input features"),
        (labels_args(workdir, tmp_path, "ens-ss-laplace", 10.0, 0.0, "t.npz", "d.db"), "d.db",
         "delta"),
    ]
    for argv, ledger, phrase in refusals:
        rc, out, err = run(capsys, *argv)
        assert rc == 2 and phrase in err, err
        assert not (tmp_path / ledger).exists(), argv
    assert not any(p.suffix in (".csv", ".npz") for p in tmp_path.iterdir())
    # the same first releases within what they ask for go through
    rc, _, err = run(capsys, *predict, "--ledger", tmp_path / "a.db", "--budget-epsilon", 500.0)
    assert rc == 0, err


def test_release_commands_offer_only_what_they_can_release(workdir, tmp_path, capsys):
    """teacher-labels offered the convex baselines (their inputs never come from bundles)
    and predict a --radius-rule no single-model mechanism takes: usage errors now."""
    for argv in (labels_args(workdir, tmp_path, "model-sens"),
                 ["predict", "--bounds", workdir / "ens" / "teacher_000.h5", "--data",
                  workdir / "public.npz", "--mechanism", "gs", "--epsilon", 1.0,
                  "--radius-rule", "tight", "--out", tmp_path / "p.csv"]):
        with pytest.raises(SystemExit) as stop:
            main([str(a) for a in argv])
        assert stop.value.code == 2
    assert not list(tmp_path.iterdir())


# -- PATE under the rdp accountant ----------------------------------------------------------

@pytest.mark.parametrize("mech", ("gnmax", "confident-gnmax", "lnmax"))
def test_teacher_labels_under_the_rdp_accountant(workdir, tmp_path, capsys, mech):
    extra = ("--threshold", 2) if mech == "confident-gnmax" else ()
    rc, out, err = run(capsys, *labels_args(workdir, tmp_path, mech, 20.0, 1e-5, "labels.npz",
                                            "l.db", "--accountant", "rdp", *extra))
    assert rc == 0, err
    f = np.load(tmp_path / "labels.npz")
    labels = f["labels"]
    assert str(f["accountant"]) == "rdp" and labels.shape == (Q,)
    assert set(np.unique(labels)) <= ({-1, 0, 1} if mech == "confident-gnmax" else {0, 1})
    # only labels and public metadata: no votes, radii, costs or sensitivities
    assert not {"votes", "radii", "data_dependent", "sensitivity"} & set(f.files)
    with Ledger.open(tmp_path / "l.db") as ledger:
        assert ledger.is_rdp and len(ledger.entries()) == Q
        spent = ledger.spent()
        assert spent.method == "rdp" and spent.fits(20.0, 1e-5)
        assert spent.epsilon > 0.9 * 20.0          # the plan uses the budget it was given
    # the budget is spent: a second run is refused before anything is drawn
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, mech, 20.0, 1e-5, "again.npz",
                                          "l.db", "--accountant", "rdp", *extra))
    assert rc == 2 and ("budget" in err) and not (tmp_path / "again.npz").exists()
    assert len(releases(tmp_path / "l.db")) == Q


def test_rdp_ledger_refuses_a_mechanism_without_a_curve(workdir, tmp_path, capsys):
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "ens-ptr-votes", 20.0, 1e-5,
                                          "labels.npz", "l.db", "--accountant", "rdp"))
    assert rc == 2 and "Renyi" in err
    assert not (tmp_path / "labels.npz").exists() and not (tmp_path / "l.db").exists()


def test_threshold_is_confident_gnmax_only(workdir, tmp_path, capsys):
    rc, _, err = run(capsys, *labels_args(workdir, tmp_path, "gnmax", 20.0, 1e-5, "labels.npz",
                                          "l.db", "--threshold", 2))
    assert rc == 2 and "--threshold applies to confident-gnmax" in err

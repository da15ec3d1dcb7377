"""Hardening: every subcommand with malformed values of each option exits 2 with
one error line (ours, `agt: error: ...`, or argparse's usage error), never a traceback, and
leaves no new file and no spend; predictable failures are found before any privacy is spent;
damaged bundles are refused cleanly and never read as narrower boxes; interrupts and pipes
end cleanly."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from agt.cli import main
from agt.errors import BundleError
from agt.store import from_result, read_bundle, write_bundle
from agt.training import train
from mechanisms import Ledger
from tests.helpers import LOGISTIC_CE, blobs, config, restamp

ROOT = Path(__file__).resolve().parents[3]

CONFIG = """\
model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, n_samples: 400, test_fraction: 0.25, seed: 0}
learning_rate: 0.5
n_epochs: 2
clip_gamma: 0.1
k_values: "0..5"
device: cpu
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "c.yaml").write_text(CONFIG)
    ds = blobs(200, seed=3)
    write_bundle(from_result(train(config(LOGISTIC_CE, k_values="0..10"), ds)), d / "b.h5")
    np.savez(d / "q.npz", x_test=ds.x_test[:10], y_test=ds.y_test[:10])
    np.savez(d / "pub.npz", x=ds.x_test[:10])
    assert main(["train", "--config", str(d / "c.yaml"), "--ensemble", "2", "--out",
                 str(d / "ens"), "--quiet", "--k-values", "0..3"]) == 0
    (d / "afile").write_text("not a folder")
    (d / "dir.csv").mkdir()
    (d / "garbage.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(4000))
    (d / "garbage.npz").write_bytes(os.urandom(300))
    with Ledger.open(d / "l.db", 100.0, 1e-3):
        pass
    (d / "foreign.db").unlink(missing_ok=True)
    import sqlite3
    with sqlite3.connect(d / "foreign.db") as conn:
        conn.execute("CREATE TABLE t (x)")
    return d


def listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size if p.is_file() else -1
            for p in root.rglob("*") if not p.name.endswith("-journal")}


def ledger_rows(d: Path) -> int:
    with Ledger.open(d / "l.db") as ledger:
        return len(ledger.entries())


def assert_refused(capsys, d: Path, argv: list) -> str:
    before, rows = listing(d), ledger_rows(d)
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:        # argparse's usage error
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, f"{argv}: exit {rc}, stderr {err!r}"
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("agt: error:") or (last.startswith("agt ") and ": error:" in last), err
    if last.startswith("agt: error:"):
        assert len(err.strip().splitlines()) == 1, err
    assert listing(d) == before, f"{argv} changed files"
    assert ledger_rows(d) == rows, f"{argv} spent budget"
    return last


BAD_NUMBERS = ["", "abc", "nan", "inf", "-1", "1e400"]


def cases(d: Path):
    """(name, argv) for malformed values of every option of every subcommand."""
    q, b, e = d / "q.npz", d / "b.h5", d / "ens"
    out = d / "new" / "o.csv"
    predict = ["predict", "--bounds", b, "--data", q, "--mechanism", "gs", "--epsilon", "1",
               "--ledger", d / "l.db", "--out", out]
    labels = ["teacher-labels", "--ensemble", e, "--public", d / "pub.npz", "--mechanism",
              "lnmax", "--epsilon-total", "5", "--delta-total", "0", "--ledger", d / "l.db",
              "--out", d / "new" / "l.npz"]
    train_ = ["train", "--config", d / "c.yaml", "--out", d / "new" / "b.h5", "--quiet"]
    certify = ["certify", "--bounds", b, "--data", q, "--out", d / "new" / "c.csv"]

    def swap(argv, flag, value):
        argv = list(argv)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return argv

    for flag in ("--epsilon",):
        for v in BAD_NUMBERS + ["0"]:
            yield f"predict {flag} {v!r}", swap(predict, flag, v)
    for flag in ("--delta", "--budget-delta"):
        for v in BAD_NUMBERS + ["1", "2"]:
            yield f"predict {flag} {v!r}", swap(predict, flag, v)
    for v in BAD_NUMBERS + ["0"]:
        yield f"predict --budget-epsilon {v!r}", swap(predict, "--budget-epsilon", v)
    for v in ["-1", "abc", "1e3", ""]:
        yield f"predict --insecure-seed {v!r}", swap(predict, "--insecure-seed", v)
    for flag, values in (("--bounds", [d / "missing.h5", d / "garbage.h5", d, q, ""]),
                         ("--data", [d / "missing.npz", d / "garbage.npz", b, ""]),
                         ("--out", [d / "afile" / "o.csv", d, d / "dir.csv", d / "o.txt", "",
                                    d / "b.h5"]),
                         ("--ledger", [d / "foreign.db", d / "afile" / "l.db", d]),
                         ("--mechanism", ["gnmax", "", "lnmax"]),
                         ("--split", ["nosuch", ""]),
                         ("--relation", ["bounded"]),
                         ("--accountant", ["rdp"])):
        for v in values:
            yield f"predict {flag} {v!s}", swap(predict, flag, v)
    yield "predict ss-laplace without delta", swap(predict, "--mechanism", "ss-laplace")
    long_name = "a" * 300
    for name, argv, suffix in (("predict", predict, ".csv"), ("certify", certify, ".csv"),
                               ("train", train_, ".h5")):
        yield f"{name} --out name too long", swap(argv, "--out", d / (long_name + suffix))
    for flag in ("--epsilon-total",):
        for v in BAD_NUMBERS + ["0"]:
            yield f"labels {flag} {v!r}", swap(labels, flag, v)
    for flag in ("--delta-total", "--per-query-delta"):
        for v in BAD_NUMBERS + ["1"]:
            yield f"labels {flag} {v!r}", swap(labels, flag, v)
    for flag, values in (("--ensemble", [d / "missing", b, d / "afile", ""]),
                         ("--public", [d / "missing.npz", d / "garbage.npz", ""]),
                         ("--out", [d / "afile" / "l.npz", d, d / "l.csv", ""]),
                         ("--teacher", ["-1", "abc", "7"]),
                         ("--radius-rule", ["sum"]),
                         ("--student-config", [d / "missing.yaml"]),
                         ("--insecure-seed", ["-3"])):
        for v in values:
            argv = swap(labels, flag, v)
            if flag == "--teacher":
                argv = swap(argv, "--mechanism", "gs")
            yield f"labels {flag} {v!s}", argv
    yield ("labels student config without --train-student",
           labels + ["--student-config", d / "c.yaml"])
    yield "labels bad student config", labels + ["--train-student", "--student-config", q]
    for flag, values in (("--config", [d / "missing.yaml", q, d, ""]),
                         ("--data", [d / "missing.npz", d / "garbage.npz", ""]),
                         # (k above n is no refusal under batch_size full: n is private
                         # under add-remove, agt/kgrid.py)
                         ("--k-values", ["", "-1", "0..1000000000000000", "5..1", "a",
                                         "0..99999999"]),
                         ("--out", [d / "afile" / "b.h5", d, d / "b.txt", ""]),
                         ("--ensemble", ["0", "-2", "abc", "100000"]),
                         ("--device", ["tpu"])):
        for v in values:
            yield f"train {flag} {v!s}", swap(train_, flag, v)
    for flag, values in (("--bounds", [d / "missing.h5", d / "garbage.h5", ""]),
                         ("--data", [d / "missing.npz", ""]),
                         ("--out", [d / "afile" / "c.csv", d, d / "c.txt", ""]),
                         ("--plot", [d / "p.xyz", d / "afile" / "p.png"]),
                         ("--split", [""])):
        for v in values:
            yield f"certify {flag} {v!s}", swap(certify, flag, v)
    for v in (d / "missing.h5", d / "garbage.h5", d, q):
        yield f"inspect {v}", ["inspect", v]
    for argv in (["reproduce", "blobs", "--seed", "-1"], ["reproduce", "mnist"],
                 ["reproduce", "blobs", "--only", ","], ["reproduce", "blobs", "--only", "nope"],
                 ["reproduce", "blobs", "--plan", d / "missing.yaml"],
                 ["reproduce", "blobs", "--seed", "abc"]):
        yield " ".join(map(str, argv)), argv + ["--out", d / "new" / "art", "--quiet"]


def test_every_malformed_option_is_a_clean_refusal(world, capsys):
    seen = {}
    for name, argv in cases(world):
        seen[name] = assert_refused(capsys, world, argv)
    assert len(seen) > 120
    # spot checks that the refusals are the intended ones
    assert "k_values" in seen["train --k-values 0..1000000000000000"]
    assert "another application" in seen[f"predict --ledger {world / 'foreign.db'}"]
    assert "is a directory" in seen[f"predict --out {world / 'dir.csv'}"]
    assert "is a file, not a folder" in seen[f"predict --out {world / 'afile' / 'o.csv'}"]
    assert "plot must end in" in seen[f"certify --plot {world / 'p.xyz'}"]
    assert "damaged or not an agt" in seen[f"predict --bounds {world / 'garbage.h5'}"] or \
        "cannot read" in seen[f"predict --bounds {world / 'garbage.h5'}"]
    assert "--out" in seen[f"predict --out {world / 'b.h5'}"]


@pytest.mark.parametrize("key,value,message", [
    ("seed", 10**30, "seed"), ("n_epochs", 10**12, "n_epochs"),
    ("model", [{"linear": {"in": 6, "out": 10**12}}], "out"),
    ("k_values", "0..1000000000000000", "k_values"), ("batch_size", 0, "batch_size"),
    ("pretrained", "garbage.pt", "pretrained"),
])
def test_impossible_config_values_are_one_line_errors(world, capsys, tmp_path, key, value,
                                                      message):
    import yaml
    raw = yaml.safe_load(CONFIG)
    raw[key] = value
    (tmp_path / "garbage.pt").write_bytes(os.urandom(200))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    before = listing(tmp_path)
    rc = main(["train", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "b.h5"),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("agt: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1 and listing(tmp_path) == before


def test_refusals_say_what_is_wrong(world, capsys, tmp_path):
    """A new user's review: numpy's hint to load a non-npz file with allow_pickle (which runs
    code from the file), "bounds file not found" for an ensemble directory, a duplicate
    config key silently overriding the first, and a traceback for a name too long."""
    d = world
    last = assert_refused(capsys, d, ["certify", "--bounds", d / "b.h5", "--data",
                                      d / "garbage.npz", "--out", d / "new" / "c.csv"])
    assert "not a numpy .npz archive" in last and "pickle" not in last
    last = assert_refused(capsys, d, ["inspect", d / "ens"])
    assert "ensemble directory" in last and "teacher_NNN.h5" in last
    twice = tmp_path / "twice.yaml"
    twice.write_text(CONFIG + "\nlearning_rate: 3\n")
    last = assert_refused(capsys, d, ["train", "--config", twice, "--out",
                                      d / "new" / "t.h5", "--quiet"])
    assert "'learning_rate' appears twice" in last
    last = assert_refused(capsys, d, ["certify", "--bounds", d / "b.h5", "--data",
                                      d / "q.npz", "--out", d / ("b" * 300 + ".csv")])
    assert "cannot be used (File name too long)" in last


def test_an_npz_of_pickled_objects_is_a_one_line_error(world, capsys, tmp_path):
    """An .npz whose arrays hold Python objects would need pickle to load (running code from
    the file): `train --data` and `certify --data` refuse it in one line, not numpy's
    traceback."""
    d = world
    objects = tmp_path / "objects.npz"
    np.savez(objects, x_train=np.array([{"a": 1}, None], dtype=object),
             y_train=np.array([0, 1]), x_test=np.array([None, None], dtype=object))
    last = assert_refused(capsys, d, ["train", "--config", d / "c.yaml", "--data", objects,
                                      "--out", d / "new" / "t.h5", "--quiet"])
    assert "holds Python objects" in last and "x_train" in last
    last = assert_refused(capsys, d, ["certify", "--bounds", d / "b.h5", "--data", objects,
                                      "--out", d / "new" / "c.csv"])
    assert "holds Python objects" in last and "x_test" in last


def test_relative_pretrained_path_resolves_against_the_config(tmp_path, monkeypatch, capsys):
    """Item 6: data.path and pretrained both resolve against the config's folder."""
    spec_dir = tmp_path / "cfg"
    spec_dir.mkdir()
    state = {"0.weight": torch.zeros(2, 6), "0.bias": torch.zeros(2)}
    torch.save(state, spec_dir / "init.pt")
    ds = blobs(100, seed=1)
    np.savez(spec_dir / "d.npz", x_train=ds.x_train, y_train=ds.y_train)
    (spec_dir / "c.yaml").write_text(CONFIG.replace(
        "data: {name: blobs, n_samples: 400, test_fraction: 0.25, seed: 0}",
        "data: {name: npz, path: d.npz}") + "pretrained: init.pt\n")
    monkeypatch.chdir(tmp_path)                       # elsewhere: relative paths must not
    rc = main(["train", "--config", str(spec_dir / "c.yaml"), "--out", str(tmp_path / "b.h5"),
               "--quiet"])
    assert rc == 0, capsys.readouterr().err
    assert torch.equal(read_bundle(tmp_path / "b.h5").init["0.weight"], torch.zeros(2, 6,
                                                                                     dtype=torch.float64))


def test_test_labels_outside_the_models_classes_are_refused(tmp_path, capsys):
    ds = blobs(100, seed=1)
    y_test = ds.y_test.copy()
    y_test[0] = 5
    np.savez(tmp_path / "d.npz", x_train=ds.x_train, y_train=ds.y_train, x_test=ds.x_test,
             y_test=y_test)
    (tmp_path / "c.yaml").write_text(CONFIG)
    rc = main(["train", "--config", str(tmp_path / "c.yaml"), "--data", str(tmp_path / "d.npz"),
               "--out", str(tmp_path / "b.h5"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "y_test has labels up to 5" in err
    assert not (tmp_path / "b.h5").exists()


# -- predictable failures before the spend (item 1) ----------------------------------------

def test_an_unwritable_output_is_found_before_any_spend(world, capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for out in (world / "afile" / "p.csv", ro / "p.csv"):
            if os.geteuid() == 0 and out.parent == ro:
                continue                              # root writes anywhere
            assert_refused(capsys, world, ["predict", "--bounds", world / "b.h5", "--data",
                                           world / "q.npz", "--mechanism", "gs", "--epsilon",
                                           "1", "--ledger", world / "l.db", "--out", out])
    finally:
        ro.chmod(0o755)


def predict_on_a_copied_ledger(world, tmp_path, capsys) -> tuple[int, str]:
    """`agt predict` (gs, eps 1) of the world's queries on a copy of its ledger in tmp_path,
    writing tmp_path/p.csv: (exit status, stderr)."""
    shutil.copy(world / "l.db", tmp_path / "l.db")
    rc = main(["predict", "--bounds", str(world / "b.h5"), "--data", str(world / "q.npz"),
               "--mechanism", "gs", "--epsilon", "1", "--ledger", str(tmp_path / "l.db"),
               "--out", str(tmp_path / "p.csv")])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("failure,rc,phrase", [
    (OSError(28, "No space left on device"), 2, "No space left"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_a_failure_or_interrupt_after_the_spend_says_the_budget_was_spent(
        world, capsys, tmp_path, monkeypatch, failure, rc, phrase):
    import agt.io as io

    def failing_write(path, writer, **options):
        raise failure
    monkeypatch.setattr(io, "atomic_write", failing_write)
    got_rc, err = predict_on_a_copied_ledger(world, tmp_path, capsys)
    assert got_rc == rc and "budget spent" in err and phrase in err
    with Ledger.open(tmp_path / "l.db") as ledger:
        assert len(ledger.entries()) == 10


def test_an_interrupt_between_the_spend_and_the_write_says_so(world, capsys, tmp_path,
                                                               monkeypatch):
    import agt.cli.predict as predict

    def interrupted(ledger, named):
        raise KeyboardInterrupt
    monkeypatch.setattr(predict, "ledger_line", interrupted)
    rc, err = predict_on_a_copied_ledger(world, tmp_path, capsys)
    assert rc == 130 and "budget spent" in err and not (tmp_path / "p.csv").exists()


def test_a_dangling_link_at_the_output_is_refused_before_any_spend(world, capsys):
    link = world / "dangling.csv"
    link.symlink_to(world / "missing-target.csv")
    try:
        assert_refused(capsys, world, ["predict", "--bounds", world / "b.h5", "--data",
                                       world / "q.npz", "--mechanism", "gs", "--epsilon", "1",
                                       "--ledger", world / "l.db", "--out", link])
    finally:
        link.unlink()


def test_refusals_of_inputs_name_no_private_value():
    """Radii and labels are owner-only: a refusal counts offending entries, never shows one."""
    from agt.errors import DataError
    from mechanisms.checks import class_array, privacy_problems, radius_array

    for check in (lambda p: radius_array(np.array([4, 123457, 2**60]), p),
                  lambda p: radius_array(np.array([4, -123457]), p),
                  lambda p: class_array(np.array([1, 123457]), 3, p)):
        problems = privacy_problems()
        check(problems)
        with pytest.raises(DataError) as err:
            problems.raise_if_any()
        assert "123457" not in str(err.value) and str(2**60) not in str(err.value)
        assert "1 entries" in str(err.value)


def test_a_release_file_that_appears_meanwhile_is_kept(tmp_path, capsys):
    """Two releases to one new --out: each passed the check before either wrote; the second
    keeps the first's file and writes its labels beside it instead of replacing it."""
    from agt.cli.ledgers import write_after_spend
    from agt.io import atomic_write

    out = tmp_path / "p.csv"
    out.write_text("first release\n")
    with pytest.raises(FileExistsError):
        atomic_write(out, lambda p: p.write_text("second\n"), replace=False)
    assert out.read_text() == "first release\n" and len(list(tmp_path.iterdir())) == 1
    written = write_after_spend(out, lambda p: p.write_text("second\n"), overwrite=False)
    assert written == tmp_path / "p-1.csv" and written.read_text() == "second\n"
    assert out.read_text() == "first release\n"
    assert "appeared while this release ran" in capsys.readouterr().out
    assert write_after_spend(out, lambda p: p.write_text("third\n"), overwrite=True) == out
    assert out.read_text() == "third\n"


def test_a_ledger_that_forgets_is_refused_before_any_spend(world, capsys):
    assert_refused(capsys, world, ["predict", "--bounds", world / "b.h5", "--data",
                                   world / "q.npz", "--mechanism", "gs", "--epsilon", "1",
                                   "--budget-epsilon", "5", "--ledger", ":memory:",
                                   "--out", world / "never.csv"])
    assert_refused(capsys, world, ["predict", "--bounds", world / "b.h5", "--data",
                                   world / "q.npz", "--mechanism", "gs", "--epsilon", "1",
                                   "--ledger", "", "--out", world / "never.csv"])


# -- bundles: damage is refused, never read as narrower boxes (items 2 and 4) ---------------

def test_flipped_bytes_anywhere_are_refused_or_harmless(world, tmp_path):
    src = world / "b.h5"
    original = read_bundle(src)
    data = bytearray(src.read_bytes())
    rng = np.random.default_rng(0)
    offsets = sorted(set(np.linspace(0, len(data) - 64, 40).astype(int)) |
                     set(rng.integers(0, len(data) - 64, size=40).tolist()))
    refused = 0
    for off in offsets:
        damaged = bytearray(data)
        damaged[off:off + 64] = bytes(b ^ 0xFF for b in damaged[off:off + 64])
        path = tmp_path / f"d{off}.h5"
        path.write_bytes(bytes(damaged))
        try:
            b = read_bundle(path)
        except BundleError as exc:
            assert "\n" not in str(exc)
            refused += 1
            continue
        # read without error: then it must be the same bundle (the damage hit unused bytes)
        for name in original.nominal:
            assert torch.equal(b.lower[name], original.lower[name]), off
            assert torch.equal(b.upper[name], original.upper[name]), off
            assert torch.equal(b.nominal[name], original.nominal[name]), off
    assert refused >= len(offsets) // 4


def test_one_flipped_bit_that_narrows_a_box_is_caught(world, tmp_path):
    path = tmp_path / "n.h5"
    shutil.copy(world / "b.h5", path)
    with h5py.File(path, "a") as f:
        d = f["bounds/5/upper/0.weight"]
        arr = np.asarray(d)
        arr.view(np.uint64)[0, 0] ^= np.uint64(1) << np.uint64(40)   # one mantissa bit
        d[...] = arr
    with pytest.raises(BundleError, match="content hash mismatch"):
        read_bundle(path)


@pytest.mark.parametrize("value", ["[]", '"replace-one"', '["replace-one", "swap"]', "5"])
def test_relations_attribute_is_validated(world, tmp_path, value):
    path = tmp_path / "r.h5"
    shutil.copy(world / "b.h5", path)
    with h5py.File(path, "a") as f:
        f.attrs["relations"] = value
    restamp(path)
    with pytest.raises(BundleError, match="relations"):
        read_bundle(path)


@pytest.mark.parametrize("key,value", [("n_train", "many"), ("dtype", 3), ("selection", "fast"),
                                       ("parent", "[1]"), ("k_values", "0..3")])
def test_every_metadata_attribute_is_type_checked(world, tmp_path, key, value):
    path = tmp_path / "m.h5"
    shutil.copy(world / "b.h5", path)
    with h5py.File(path, "a") as f:
        f.attrs[key] = value
    try:
        restamp(path)
    except (KeyError, ValueError, TypeError):
        pass
    with pytest.raises(BundleError):
        read_bundle(path)


# -- processes: pipes, interrupts, concurrent writers (items 2, 3 and 8) ---------------------

def _cli(*args, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "agt.cli.main", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_inspect_into_a_closed_pipe_is_quiet(world):
    proc = _cli("inspect", world / "b.h5")
    proc.stdout.close()                                   # the reader went away (| head -0)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err


def test_sigterm_during_training_leaves_nothing(tmp_path):
    slow = CONFIG.replace('k_values: "0..5"', 'k_values: "0..20"').replace(
        "n_samples: 400", "n_samples: 20000").replace("n_epochs: 2", "n_epochs: 400")
    (tmp_path / "c.yaml").write_text(slow)
    proc = _cli("train", "--config", tmp_path / "c.yaml", "--out", tmp_path / "o" / "b.h5")
    # wait for the progress bar: it is drawn inside the command, so the handler installed
    # at the start of main() is in place (any earlier output, a library's warning on a
    # loaded machine, says nothing about that), then a moment longer
    first, deadline = "", time.monotonic() + 120
    while "AGT train" not in first:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(proc.stderr.fileno(), 4096).decode(errors="replace") if ready else ""
        assert chunk, f"agt train drew no progress bar in 120 s: {first!r}"
        first += chunk
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = first + err
    assert proc.returncode == 143 and "terminated" in err and "Traceback" not in err
    left = list((tmp_path / "o").glob("*")) if (tmp_path / "o").exists() else []
    assert left == []


def test_concurrent_writers_to_one_output_never_collide(tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG)
    procs = [_cli("train", "--config", tmp_path / "c.yaml", "--out", tmp_path / "same.h5",
                  "--quiet") for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    read_bundle(tmp_path / "same.h5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "same.h5"]


def test_train_keeps_an_existing_bundle_unless_told(world, capsys, tmp_path):
    """A new user's review: `agt train --out` silently replaced a bundle (hours of training)
    and an ensemble directory. Refused before any training now; --overwrite replaces."""
    d = world
    bundle = tmp_path / "b.h5"
    bundle.write_bytes((d / "b.h5").read_bytes())
    before = bundle.read_bytes()
    last = assert_refused(capsys, d, ["train", "--config", d / "c.yaml", "--out", bundle,
                                      "--quiet"])
    assert "exists" in last and "--overwrite" in last and bundle.read_bytes() == before
    ens = tmp_path / "ens"
    ens.mkdir()
    (ens / "manifest.json").write_text("{}")
    last = assert_refused(capsys, d, ["train", "--config", d / "c.yaml", "--ensemble", "2",
                                      "--out", ens, "--quiet"])
    assert "not empty" in last and (ens / "manifest.json").read_text() == "{}"
    assert main(["train", "--config", str(d / "c.yaml"), "--out", str(bundle), "--quiet",
                 "--overwrite"]) == 0
    assert bundle.read_bytes() != before

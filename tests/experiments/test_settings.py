"""The plan loader every study shares (experiments/settings.py): reading a plan file, the
quick: overlay, and building a frozen settings dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agt.errors import ConfigError, Problems
from experiments.plan import load_plan
from experiments.settings import apply_quick, build_settings, overlay, read_plan
from experiments.tradeoffs import load_settings


def test_read_plan_refuses_what_is_not_one_mapping(tmp_path):
    with pytest.raises(ConfigError, match="trade-off plan not found"):
        read_plan(tmp_path / "missing.yaml", "trade-off plan")
    cases = {"twice.yaml": ("a: 1\na: 2\n", "appears twice"),
             "broken.yaml": ("a: [1\n", "cannot read the experiment plan"),
             "list.yaml": ("- 1\n", r"must hold a YAML mapping \(an experiment plan\)")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=message):
            read_plan(tmp_path / name, "experiment plan")
    (tmp_path / "empty.yaml").write_text("")
    assert read_plan(tmp_path / "empty.yaml", "trade-off plan") == {}


def test_overlay_merges_to_its_depth_and_replaces_below():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "b": [1, 2]}
    over = {"a": {"y": {"q": 3}}, "b": [3]}
    assert overlay(base, over, 1) == {"a": {"y": {"q": 3}}, "b": [3]}
    assert overlay(base, over, 2) == {"a": {"x": 1, "y": {"q": 3}}, "b": [3]}
    assert overlay(base, over, 3) == {"a": {"x": 1, "y": {"p": 1, "q": 3}}, "b": [3]}
    assert base == {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "b": [1, 2]}      # unchanged
    # a null section changes nothing; a null setting is a value
    assert overlay({"s": {"k": 1}}, {"s": None}, 3) == {"s": {"k": 1}}
    assert overlay({"s": {"k": 1}}, {"s": {"k": None}}, 2) == {"s": {"k": None}}
    assert overlay({"s": {"k": 1}}, {"s": None}, 1) == {"s": None}


def test_apply_quick_checks_the_section_even_when_not_applied():
    raw = {"a": {"x": 1, "y": 2}, "quick": {"a": {"y": 3}}}
    assert apply_quick(raw, False, "p") == {"a": {"x": 1, "y": 2}}
    assert apply_quick(raw, True, "p") == {"a": {"y": 3}}                  # replaced whole
    assert apply_quick(raw, True, "p", {"a": 1}) == {"a": {"x": 1, "y": 3}}
    assert "quick" in raw
    with pytest.raises(ConfigError, match="quick must be a mapping"):
        apply_quick({"quick": [1]}, False, "p")
    with pytest.raises(ConfigError, match=r"quick may override a and b only, got \['c'\]"):
        apply_quick({"quick": {"c": 1}}, False, "p", {"a": 1, "b": 0})


@dataclass(frozen=True)
class _Demo:
    n: int = 1
    rate: float = 0.5
    names: tuple = ("a",)
    opts: dict = field(default_factory=dict)
    free: object = None

    def validate(self, where: str, problems: Problems) -> None:
        problems.check(self.n > 0, f"{where}.n must be > 0")


def test_build_settings_coerces_and_reports_every_problem_at_once():
    got = build_settings(_Demo, {"n": 2, "rate": "1e-5", "names": ["b", "c"], "free": [1]},
                         "demo")
    assert got == _Demo(2, 1e-5, ("b", "c"), {}, [1])
    with pytest.raises(ConfigError) as err:
        build_settings(_Demo, {"n": 1.5, "rate": True, "names": "b", "nope": 1}, "demo")
    message = str(err.value)
    for part in ("unknown setting(s) ['nope'] in demo", "demo.n must be an integer",
                 "demo.rate must be a finite number", "demo.names must be a list"):
        assert part in message
    with pytest.raises(ConfigError, match="demo.n must be > 0"):
        build_settings(_Demo, {"n": 0}, "demo")
    assert build_settings(_Demo, None, "demo") == _Demo()


def test_both_studies_read_their_plans_through_the_one_loader(tmp_path):
    """The same file problems give the same messages in both loaders."""
    (tmp_path / "twice.yaml").write_text("repeats: 1\nrepeats: 2\n")
    for load in (load_plan, load_settings):
        with pytest.raises(ConfigError, match="appears twice"):
            load(tmp_path / "twice.yaml")
    (tmp_path / "quick.yaml").write_text("dataset: blobs\ntrain_config: x.yaml\nquick: 3\n")
    for load in (load_plan, load_settings):
        with pytest.raises(ConfigError, match="quick must be a mapping of overrides"):
            load(tmp_path / "quick.yaml")


def test_tradeoff_quick_keys_replace_whole_values(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("agt_grid: {learning_rate: [1.0], n_epochs: [2]}\nlambda: 0.01\n"
                    "quick: {agt_grid: {learning_rate: [3.0]}}\n")
    assert load_settings(path).agt_grid == {"learning_rate": [1.0], "n_epochs": [2]}
    quick = load_settings(path, quick=True)
    assert quick.agt_grid == {"learning_rate": [3.0]} and quick.lam == 0.01
    assert load_settings(path, overrides={"lambda": 0.5}).lam == 0.5

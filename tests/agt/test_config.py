"""Config validation (agt/config.py, agt/models.py): unknown keys, impossible values, k grids,
malformed YAML, and the model/data checks that run before any training step."""

from __future__ import annotations

import dataclasses
import math

import pytest

from agt.config import TrainConfig, config_from_dict, load_config, parse_k_values
from agt.data import load_dataset
from agt.errors import AGTError, ConfigError
from agt.models import LAYER_KINDS, ModelSpec
from agt.training import train

BLOBS = {"name": "blobs", "n_samples": 400, "test_fraction": 0.25, "seed": 0}


def base(**changes) -> dict:
    raw = {
        "model": [{"linear": {"in": 6, "out": 2}}],
        "loss": "cross_entropy",
        "data": dict(BLOBS),
        "learning_rate": 0.5,
        "n_epochs": 1,
        "batch_size": 100,
        "clip_gamma": 0.1,
        "k_values": "0..5",
        "device": "cpu",
    }
    raw.update(changes)
    return raw


def config_error(raw) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    msg = str(info.value)
    assert "\n" not in msg, f"error message is not one line: {msg!r}"
    return msg


@pytest.fixture(scope="module")
def blobs():
    return load_dataset("blobs", {k: v for k, v in BLOBS.items() if k != "name"})


# ------------------------------------------------------------------------------------------
# a valid config
# ------------------------------------------------------------------------------------------
def test_valid_config_and_defaults():
    cfg = config_from_dict(base())
    assert isinstance(cfg, TrainConfig)
    assert cfg.loss == "cross_entropy"
    assert cfg.k_values == (0, 1, 2, 3, 4, 5)
    assert cfg.data.name == "blobs" and cfg.data.options["n_samples"] == 400
    assert cfg.optimizer == "sgd" and cfg.momentum == 0.0 and cfg.nesterov is False
    assert cfg.dtype == "float64" and cfg.seed == 0 and cfg.frozen_layers == 0
    assert cfg.model.layers[0].kind == "linear"
    assert (cfg.model.layers[0].in_features, cfg.model.layers[0].out_features) == (6, 2)
    # derived values are never written into the config object
    assert cfg.model.input_shape is None


def test_data_as_plain_name():
    cfg = config_from_dict(base(data="blobs"))
    assert cfg.data.name == "blobs" and cfg.data.options == {}


def test_learning_rate_schedule():
    cfg = config_from_dict(base(learning_rate=2.0, lr_decay=0.6, lr_min=0.001))
    for t in (0, 1, 5, 10_000):
        assert cfg.learning_rate_at(t) == max(2.0 / (1 + 0.6 * t), 0.001)
    assert cfg.learning_rate_at(10_000) == 0.001


def test_sgdm_options_accepted():
    cfg = config_from_dict(base(optimizer="sgdm", momentum=0.9, nesterov=True))
    assert cfg.optimizer == "sgdm" and cfg.momentum == 0.9 and cfg.nesterov
    cfg = config_from_dict(base(optimizer="sgdm", momentum=0.5, dampening=0.3))
    assert cfg.dampening == 0.3


def test_lr_times_l2_equal_one_is_allowed():
    cfg = config_from_dict(base(learning_rate=0.5, l2_reg=2.0))
    assert cfg.l2_reg == 2.0


# ------------------------------------------------------------------------------------------
# keys
# ------------------------------------------------------------------------------------------
def test_unknown_top_level_key_is_named():
    msg = config_error(base(learning_rat=0.1))
    assert "learning_rat" in msg


def test_several_unknown_keys_all_named():
    msg = config_error(base(foo=1, epochs=3))
    assert "foo" in msg and "epochs" in msg


@pytest.mark.parametrize("key", ["model", "loss", "data"])
def test_missing_required_key(key):
    raw = base()
    del raw[key]
    if key == "data":            # optional: Python users pass the data in
        assert config_from_dict(raw).data is None
        return
    msg = config_error(raw)
    assert f"'{key}'" in msg and "missing" in msg


def test_config_must_be_mapping():
    config_error([1, 2, 3])
    config_error(None)


@pytest.mark.parametrize("data", [5, {}, {"n_samples": 10}, ["blobs"]])
def test_bad_data_section(data):
    msg = config_error(base(data=data))
    assert "data" in msg


# ------------------------------------------------------------------------------------------
# model layers
# ------------------------------------------------------------------------------------------
def test_unknown_layer_is_named_and_supported_listed():
    msg = config_error(base(model=[{"conv3d": {"in": 1, "out": 2, "kernel": 3}},
                                   {"linear": {"in": 6, "out": 2}}]))
    assert "conv3d" in msg
    assert "model[0]" in msg
    for kind in LAYER_KINDS:
        assert kind in msg


def test_unknown_layer_not_first():
    msg = config_error(base(model=[{"linear": {"in": 6, "out": 4}}, {"tanh": {}},
                                   {"linear": {"in": 4, "out": 2}}]))
    assert "tanh" in msg and "model[1]" in msg


@pytest.mark.parametrize("model, fragment", [
    ([{"linear": {"in": 6}}], "out"),                                   # missing option
    ([{"linear": {"out": 2}}], "in"),
    ([{"linear": {"in": 6, "out": 2, "kernel": 3}}], "kernel"),         # unknown option
    ([{"linear": {"in": 0, "out": 2}}], "linear.in"),                   # not positive
    ([{"linear": {"in": 6, "out": -2}}], "linear.out"),
    ([{"linear": {"in": "6", "out": 2}}], "linear.in"),                 # not an int
    ([{"linear": {"in": 6.0, "out": 2}}], "linear.in"),
    ([{"linear": {"in": True, "out": 2}}], "linear.in"),
    ([{"linear": {"in": 6, "out": 2, "bias": "yes"}}], "bias"),
    ([{"linear": [6, 2]}], "options"),                                  # options not a mapping
    ([{"linear": {"in": 6, "out": 2}, "relu": {}}], "model[0]"),        # two keys in one entry
    (["linear"], "model[0]"),
    ([{"conv2d": {"in": 1, "out": 4}}], "kernel"),
    ([{"conv2d": {"in": 1, "out": 4, "kernel": 3, "padding": -1}}], "padding"),
    ([{"conv2d": {"in": 1, "out": 4, "kernel": 3, "stride": 0}}], "stride"),
    ([{"relu": {"inplace": True}}, {"linear": {"in": 6, "out": 2}}], "inplace"),
    ([], "model"),                                                      # empty model
    ({"linear": {"in": 6, "out": 2}}, "model"),                         # not a list
    ([{"relu": {}}, {"flatten": {}}], "linear or conv2d"),              # nothing to train
])
def test_bad_layer_options(model, fragment):
    msg = config_error(base(model=model))
    assert fragment in msg


def test_layer_null_options_allowed():
    cfg = config_from_dict(base(model=[{"flatten": None}, {"linear": {"in": 6, "out": 2}}]))
    assert [layer.kind for layer in cfg.model.layers] == ["flatten", "linear"]


@pytest.mark.parametrize("frozen", [1, -1, True, 0.5])
def test_bad_frozen_layers(frozen):
    msg = config_error(base(frozen_layers=frozen))
    assert "frozen_layers" in msg


# ------------------------------------------------------------------------------------------
# impossible values
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, named", [
    ({"learning_rate": 0}, "learning_rate"),
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"learning_rate": -0.1}, "learning_rate"),
    ({"learning_rate": "fast"}, "learning_rate"),
    ({"learning_rate": math.nan}, "learning_rate"),
    ({"learning_rate": math.inf}, "learning_rate"),
    ({"learning_rate": True}, "learning_rate"),
    ({"clip_gamma": -0.5}, "clip_gamma"),
    ({"clip_gamma": 0}, "clip_gamma"),
    ({"lr_decay": -1}, "lr_decay"),
    ({"lr_min": -0.1}, "lr_min"),
    ({"lr_min": 1.0, "learning_rate": 0.5}, "lr_min"),
    ({"l2_reg": -0.1}, "l2_reg"),
    ({"learning_rate": 2.0, "l2_reg": 0.6}, "l2_reg"),            # lr * l2 = 1.2 > 1
    ({"learning_rate": 0.5, "l2_reg": 2.5}, "learning_rate * l2_reg"),
    ({"momentum": 0.9}, "sgdm"),                                  # momentum without sgdm
    ({"optimizer": "sgd", "momentum": 0.5}, "momentum"),
    ({"dampening": 0.1}, "sgdm"),
    ({"nesterov": True}, "sgdm"),
    ({"optimizer": "sgdm", "momentum": 0.9, "nesterov": True, "dampening": 0.1}, "dampening"),
    ({"optimizer": "sgdm", "nesterov": True}, "momentum"),        # nesterov with momentum 0
    ({"optimizer": "sgdm", "momentum": 1.5}, "momentum"),
    ({"optimizer": "sgdm", "momentum": -0.1}, "momentum"),
    ({"optimizer": "sgdm", "momentum": 0.5, "dampening": 2.0}, "dampening"),
    ({"optimizer": "sgdm", "momentum": 0.5, "nesterov": "yes"}, "nesterov"),
    ({"optimizer": "adam"}, "optimizer"),
    ({"loss": "mse"}, "loss"),
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 10.5}, "batch_size"),
    ({"n_epochs": 0}, "n_epochs"),
    ({"n_epochs": "2"}, "n_epochs"),
    ({"seed": -1}, "seed"),
    ({"fragment_size": 0}, "fragment_size"),
    ({"device": "tpu"}, "device"),
    ({"dtype": "float16"}, "dtype"),
    ({"pretrained": 5}, "pretrained"),
])
def test_impossible_values(changes, named):
    msg = config_error(base(**changes))
    assert named in msg


# ------------------------------------------------------------------------------------------
# k grids
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ("0..199", tuple(range(200))),
    ("0,1,2,5", (0, 1, 2, 5)),
    ("0..10,20", tuple(range(11)) + (20,)),
    ("0..10,20,50", tuple(range(11)) + (20, 50)),
    ("5,1,2", (0, 1, 2, 5)),                     # sorted, 0 added
    ("1..3", (0, 1, 2, 3)),                      # 0 added
    ("0..10:5", (0, 5, 10)),
    (" 0 .. 3 , 7 ", (0, 1, 2, 3, 7)),
    ("2,2,1..3", (0, 1, 2, 3)),                  # duplicates removed
    ([0, 1, 2, 5], (0, 1, 2, 5)),
    ([5, 3], (0, 3, 5)),                          # list: 0 added, sorted
    ((4, 1), (0, 1, 4)),
    (7, (0, 7)),
    ("0", (0,)),
])
def test_parse_k_values(spec, expected):
    assert parse_k_values(spec) == expected


@pytest.mark.parametrize("spec", [
    "-1", "0..-3", "a..b", "1.5", "0..5x", "abc", "0;1", "5..1", "0..5:0",
    [-1, 2], [0, 1.5], [0, "1"], [True], -3, 2.0, None, {"k": 1}, True,
])
def test_parse_k_values_rejects(spec):
    with pytest.raises(ConfigError) as info:
        parse_k_values(spec)
    assert "k_values" in str(info.value)


def test_k_values_in_config():
    assert config_from_dict(base(k_values="0..10,20")).k_values == tuple(range(11)) + (20,)
    assert config_from_dict(base(k_values=[3, 1])).k_values == (0, 1, 3)
    raw = base()
    del raw["k_values"]
    assert config_from_dict(raw).k_values == (0,)
    assert "k_values" in config_error(base(k_values="0..5,-2"))
    assert "k_values" in config_error(base(k_values=[0, -4]))
    # the resolved grid is what the config (and hence the bundle) records
    assert config_from_dict(base(k_values="2,1")).to_json_dict()["k_values"] == [0, 1, 2]


# ------------------------------------------------------------------------------------------
# YAML files
# ------------------------------------------------------------------------------------------
GOOD_YAML = """\
model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, n_samples: 400, test_fraction: 0.25, seed: 0}
learning_rate: 0.5
batch_size: 100
clip_gamma: 0.1
k_values: "0..5"
device: cpu
"""


def test_load_config_good(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD_YAML)
    cfg = load_config(path)
    assert cfg.k_values == tuple(range(6)) and cfg.batch_size == 100
    assert cfg == config_from_dict(base())


def test_load_config_overrides(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD_YAML)
    cfg = load_config(path, {"k_values": [0, 3], "device": "cpu"})
    assert cfg.k_values == (0, 3)
    with pytest.raises(ConfigError, match="learning_rate"):
        load_config(path, {"learning_rate": -1.0})


@pytest.mark.parametrize("text, line", [
    (GOOD_YAML + "seed: 0\n  k_values: : 3\n", 10),              # bad nesting
    ("model: [{linear: {in: 6, out: 2}}]\n\tloss: cross_entropy\n", 2),  # tab
    ("model: [{linear: {in: 6, out: 2}}]\nloss: cross_entropy\ndata: {name: blobs\n"
     "learning_rate: 0.1\n", 4),                                 # unclosed flow mapping
])
def test_malformed_yaml_names_line(tmp_path, text, line):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert "malformed YAML" in msg and "broken.yaml" in msg
    assert f"line {line}" in msg


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- 1\n- 2\n", "just a string\n"])
def test_yaml_not_a_mapping(tmp_path, text):
    path = tmp_path / "notmap.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path)                                  # a directory


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "unknown.yaml"
    path.write_text(GOOD_YAML + "epochs: 3\n")
    with pytest.raises(ConfigError, match="epochs"):
        load_config(path)


def test_non_utf8_yaml_is_config_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"model: \xff\xfe\x00\n")
    with pytest.raises(ConfigError):
        load_config(path)


# ------------------------------------------------------------------------------------------
# checks against the data (run before the first training step)
# ------------------------------------------------------------------------------------------
def test_wrong_feature_dimension(blobs):
    cfg = config_from_dict(base(model=[{"linear": {"in": 5, "out": 2}}]))
    assert blobs.feature_shape == (6,)
    with pytest.raises(ConfigError) as info:
        train(cfg, blobs)
    msg = str(info.value)
    assert "model[0]" in msg and "5" in msg and "(6,)" in msg
    with pytest.raises(ConfigError):
        cfg.model.with_input_shape((6,))


def test_wrong_feature_dimension_deeper_layer(blobs):
    cfg = config_from_dict(base(model=[{"linear": {"in": 6, "out": 8}}, {"relu": {}},
                                       {"linear": {"in": 7, "out": 2}}]))
    with pytest.raises(ConfigError, match=r"model\[2\]"):
        train(cfg, blobs)


def test_model_must_end_in_logit_vector():
    spec = ModelSpec.from_config([{"conv2d": {"in": 1, "out": 2, "kernel": 3}}])
    with pytest.raises(ConfigError, match="logits"):
        spec.with_input_shape((1, 8, 8))
    with pytest.raises(ConfigError, match="does not fit"):
        spec.with_input_shape((1, 2, 2))


def test_binary_cross_entropy_with_two_logits(blobs):
    cfg = config_from_dict(base(loss="binary_cross_entropy"))
    with pytest.raises(ConfigError) as info:
        train(cfg, blobs)
    assert "binary_cross_entropy" in str(info.value) and "2" in str(info.value)


def test_cross_entropy_with_one_logit(blobs):
    cfg = config_from_dict(base(model=[{"linear": {"in": 6, "out": 1}}]))
    with pytest.raises(ConfigError, match="cross_entropy"):
        train(cfg, blobs)


def test_binary_cross_entropy_with_one_logit_trains(blobs):
    cfg = config_from_dict(base(loss="binary_cross_entropy",
                                model=[{"linear": {"in": 6, "out": 1}}], k_values="0..2"))
    result = train(cfg, blobs)
    assert result.k_values == (0, 1, 2)
    assert tuple(result.nominal["0.weight"].shape) == (1, 6)


def test_k_larger_than_batch(blobs):
    cfg = config_from_dict(base(k_values="0..500", batch_size=100))
    with pytest.raises(ConfigError, match="batch"):
        train(cfg, blobs)


# ------------------------------------------------------------------------------------------
# configs are immutable; replace validates
# ------------------------------------------------------------------------------------------
def test_replace_returns_new_validated_config():
    cfg = config_from_dict(base())
    new = cfg.replace(learning_rate=0.25, k_values=(0, 2, 4))
    assert new is not cfg
    assert new.learning_rate == 0.25 and new.k_values == (0, 2, 4)
    assert cfg.learning_rate == 0.5 and cfg.k_values == tuple(range(6))       # unchanged
    assert cfg.raw["learning_rate"] == 0.5
    assert new.model == cfg.model and new.loss == cfg.loss
    assert new.to_json_dict()["k_values"] == [0, 2, 4]
    assert cfg.replace(k_values="1..3").k_values == (0, 1, 2, 3)
    # replace re-validates
    with pytest.raises(ConfigError, match="learning_rate"):
        cfg.replace(learning_rate=-1.0)
    with pytest.raises(ConfigError, match="sgdm"):
        cfg.replace(momentum=0.9)
    with pytest.raises(ConfigError, match="bogus"):
        cfg.replace(bogus=1)
    with pytest.raises(ConfigError, match="conv3d"):
        cfg.replace(model=[{"conv3d": {}}])
    # a valid multi-key change that is only consistent as a whole
    m = cfg.replace(optimizer="sgdm", momentum=0.9, nesterov=True)
    assert m.optimizer == "sgdm" and m.nesterov


def test_config_is_frozen():
    cfg = config_from_dict(base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.learning_rate = 1.0  # type: ignore[misc]


def test_json_round_trip():
    cfg = config_from_dict(base(optimizer="sgdm", momentum=0.9, l2_reg=0.01))
    again = config_from_dict(cfg.to_json_dict())
    assert again == cfg


def test_errors_are_value_errors():
    assert issubclass(ConfigError, AGTError) and issubclass(ConfigError, ValueError)


def test_yaml_exponent_without_dot_is_a_number():
    from agt.config import config_from_dict
    cfg = config_from_dict({"model": [{"linear": {"in": 6, "out": 2}}], "loss": "cross_entropy",
                            "data": {"name": "blobs"}, "lr_min": "1e-3"})
    assert cfg.lr_min == 1e-3


def test_empty_k_values_rejected_and_numpy_ints_accepted():
    import numpy as np

    from agt.config import parse_k_values
    with pytest.raises(ConfigError, match="empty"):
        parse_k_values("")
    assert parse_k_values([np.int64(3), 1]) == (0, 1, 3)


def test_yaml_refuses_a_key_given_twice_and_keeps_merge_keys():
    """PyYAML keeps the last of two equal keys silently (a learning_rate appended at the end
    of a config overrode the first); merge keys (<<: *anchor) override by design."""
    import yaml

    from agt.config import load_yaml
    assert load_yaml("base: &b {lr: 1, g: 2}\nrun: {<<: *b, lr: 3}") == {
        "base": {"lr": 1, "g": 2}, "run": {"lr": 3, "g": 2}}
    for text in ("a: 1\na: 2", "~: a\nnull: b", "x: {y: 1, y: 2}", "1: a\n1: b"):
        with pytest.raises(yaml.YAMLError, match="appears twice"):
            load_yaml(text)

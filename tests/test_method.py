"""Methods as data: presets, files with base + overrides, CLI strings, and every validation error."""

from __future__ import annotations

import json
import logging

import pytest
from typer.testing import CliRunner

from conftest import tiny_bert_config
from pretrieve.cli import app
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling import Encoder, PretrainModel
from pretrieve.train.method import (DEFAULT_DECODER_MASKER, PRESETS, TRAINERS, MaskerSpec, MethodConfig, ObjectiveSpec,
                                    load_method_file, method_from_mapping, preset, resolve_method)
from pretrieve.train.run_config import build_pretrain_config


def test_presets_carry_the_papers_defaults():
    assert {"mlm", "bow", "ae", "ar", "retromae", "cpdae", "cpdae-r", "cdmae", "dupmae"} <= set(PRESETS)
    expected = {"mlm": ["mlm"], "bow": ["mlm", "bow"], "ae": ["mlm", "ae"], "ar": ["mlm", "ar"],
                "retromae": ["mlm", "enhanced"]}
    for name, objectives in expected.items():
        config = preset(name)
        assert config.objective_names == objectives
        assert config.encoder_masker == MaskerSpec(kind="wwm", ratio=0.3)
        assert all(spec.weight == 1.0 for spec in config.objectives)
    assert preset("retromae").decoder_masker == MaskerSpec(kind="wwm", ratio=0.5)
    assert preset("ae").decoder_masker.ratio == 0.5
    assert preset("bow").decoder_masker is None and preset("ar").decoder_masker is None
    assert preset("retromae").required_features() == {"mlm_labels", "original", "enhanced_mask"}
    assert preset("bow").required_features() == {"mlm_labels", "bow_targets"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_to_dict_from_dict_round_trip(name):
    config = preset(name)
    assert MethodConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_yaml_file_with_base_and_overrides(tmp_path):
    path = tmp_path / "method.yaml"
    path.write_text(
        "base: retromae\n"
        "name: retromae-bow\n"
        "encoder_masker: {ratio: 0.15}\n"
        "decoder_masker: {kind: token, ratio: 0.6}\n"
        "objectives:\n"
        "  - mlm\n"
        "  - {name: enhanced, weight: 1.0}\n"
        "  - {name: bow, weight: 0.5}\n")
    config = load_method_file(path)
    assert config.name == "retromae-bow"
    assert config.encoder_masker == MaskerSpec(kind="wwm", ratio=0.15)  # kind kept from the base
    assert config.decoder_masker == MaskerSpec(kind="token", ratio=0.6)
    assert [(s.name, s.weight) for s in config.objectives] == [("mlm", 1.0), ("enhanced", 1.0), ("bow", 0.5)]


def test_json_file_with_params_and_shorthands(tmp_path):
    path = tmp_path / "method.json"
    path.write_text(json.dumps({"base": "ae", "objectives": [{"name": "mlm"}, {"name": "ae", "params": {"num_layers": 2}}],
                                "weights": "1,0.5", "encoder_mask": 0.2}))
    config = resolve_method(path)
    assert config.objectives == (ObjectiveSpec("mlm", 1.0), ObjectiveSpec("ae", 0.5, {"num_layers": 2}))
    assert config.encoder_masker.ratio == 0.2 and config.decoder_masker.ratio == 0.5


def test_cli_strings_override_a_preset():
    config = resolve_method("retromae", objectives="mlm,bow,enhanced", weights="1,1,0.5", encoder_mask="0.15",
                            decoder_mask=0.7, decoder_masker="token")
    assert config.name == "custom"
    assert [(s.name, s.weight) for s in config.objectives] == [("mlm", 1.0), ("bow", 1.0), ("enhanced", 0.5)]
    assert config.encoder_masker.ratio == 0.15
    assert config.decoder_masker == MaskerSpec(kind="token", ratio=0.7)
    # objectives alone, without a method; params of a same-name objective are kept from the base
    assert resolve_method(objectives="mlm,bow").objective_names == ["mlm", "bow"]
    kept = resolve_method("ae", objectives="ae,mlm")
    assert kept.objectives[0].params == {"num_layers": 1}
    assert resolve_method("bow", decoder_masker="none").decoder_masker is None


def test_missing_decoder_masker_is_defaulted_and_logged(caplog):
    caplog.set_level(logging.INFO, logger="pretrieve.train.method")
    config = resolve_method("bow", objectives="mlm,ae")
    assert config.decoder_masker == DEFAULT_DECODER_MASKER
    assert any("need a decoder masker" in r.getMessage() for r in caplog.records)
    raw = MethodConfig("x", MaskerSpec(ratio=0.3), (ObjectiveSpec("enhanced"),))
    with pytest.raises(ConfigError, match="need a decoder masker"):
        raw.validate()
    assert raw.resolved().decoder_masker == DEFAULT_DECODER_MASKER


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="nope"), "unknown method 'nope'; presets: mlm, bow, ae, ar, retromae"),
    (dict(method="bow", objectives="mlm,decoder9"), "unknown objective 'decoder9'; known objectives: ae, ar, bow"),
    (dict(method="bow", encoder_masker="pmi2"), "unknown masker 'pmi2'; known maskers: wwm, token"),
    (dict(method="retromae", decoder_masker="span"), "unknown masker 'span'"),
    (dict(method="bow", weights="1,1,1"), "3 weight\\(s\\) given for 2 objective\\(s\\)"),
    (dict(method="bow", weights="1,x"), "expected a number"),
    (dict(method="bow", weights="1,-1"), "weight must be a finite number ≥ 0"),
    (dict(method="bow", weights="0,0"), "at least one objective needs a weight > 0"),
    (dict(method="bow", encoder_mask=1.0), "mask ratio must be in \\[0, 1\\)"),
    (dict(method="bow", encoder_mask=-0.1), "mask ratio must be in \\[0, 1\\)"),
    (dict(method="bow", encoder_mask="lots"), "expected a number"),
    (dict(method="retromae", decoder_mask=0.0), "decoder_masker: mask ratio must be in \\(0, 1\\)"),
    (dict(method="retromae", decoder_mask=1.5), "decoder_masker: mask ratio must be in \\(0, 1\\)"),
    (dict(method="mlm", encoder_mask=0.0), "'mlm' needs encoder masking"),
    (dict(method="bow", objectives="mlm,bow,mlm"), "listed twice"),
    (dict(method=None), "give a method"),
])
def test_validation_errors(kwargs, message):
    method = kwargs.pop("method")
    with pytest.raises(ConfigError, match=message):
        resolve_method(method, **kwargs)


def test_bow_without_encoder_masking_is_allowed():
    config = resolve_method(objectives="bow", encoder_mask=0)
    assert config.encoder_masker.ratio == 0


def test_file_errors(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("base: bow\nobjectives: [mlm,\n")
    with pytest.raises(InputError) as info:
        load_method_file(bad_yaml)
    assert info.value.path == str(bad_yaml) and info.value.line is not None
    with pytest.raises(InputError, match="not found"):
        resolve_method(tmp_path / "missing.yaml")
    unknown_field = tmp_path / "field.yaml"
    unknown_field.write_text("base: bow\nviews: 2\n")
    with pytest.raises(ConfigError, match="unknown field\\(s\\) views"):
        load_method_file(unknown_field)
    unknown_param = tmp_path / "param.yaml"
    unknown_param.write_text("base: ae\nobjectives: [mlm, {name: ae, params: {layers: 2}}]\n")
    with pytest.raises(ConfigError, match="has no parameter\\(s\\) layers; it accepts: num_layers"):
        load_method_file(unknown_param)
    unknown_base = tmp_path / "base.yaml"
    unknown_base.write_text("base: condenser\n")
    with pytest.raises(ConfigError, match="unknown method 'condenser'"):
        load_method_file(unknown_base)
    no_objectives = tmp_path / "none.yaml"
    no_objectives.write_text("name: x\n")
    with pytest.raises(ConfigError, match="give 'objectives' or a 'base' preset"):
        load_method_file(no_objectives)
    masker_without_ratio = {"name": "x", "encoder_masker": {"kind": "wwm"}, "objectives": ["mlm"]}
    with pytest.raises(ConfigError, match="'ratio' is required"):
        MethodConfig.from_dict(masker_without_ratio)
    bad_probs = {"name": "x", "encoder_masker": {"ratio": 0.3, "replace_probs": [0.5, 0.1, 0.1]}, "objectives": ["mlm"]}
    with pytest.raises(ConfigError, match="replace_probs"):
        MethodConfig.from_dict(bad_probs)


def test_bottleneck_from_the_pretrain_command_and_config(tmp_path):
    paths = {"model": str(tmp_path), "corpus": "corpus.jsonl", "out": str(tmp_path / "out")}
    flag = build_pretrain_config({}, paths, {"method": "bow", "bottleneck": "mean"})
    assert flag.method == resolve_method("bow", bottleneck="mean")
    for file_values in ({"method": "bow", "bottleneck": "mean"}, {"method": {"base": "bow", "bottleneck": "mean"}}):
        assert build_pretrain_config(file_values, paths, {}).method.bottleneck == "mean"
    assert build_pretrain_config({}, paths, {"method": "bow"}).method.bottleneck == "cls"
    with pytest.raises(ConfigError, match="bottleneck must be one of cls, mean, got 'max'"):
        build_pretrain_config({}, paths, {"method": "bow", "bottleneck": "max"})
    assert "--bottleneck" in CliRunner().invoke(app, ["pretrain", "--help"], terminal_width=200).output


def test_tsdae_is_a_known_method_with_its_own_trainer(tmp_path):
    config = preset("tsdae")
    assert config.trainer == "tsdae" and TRAINERS["tsdae"] == "pretrieve.train.tsdae"
    assert config.objectives == () and config.decoder_masker is None
    assert config.to_dict()["trainer"] == "tsdae" and "trainer" not in preset("bow").to_dict()
    assert method_from_mapping({"base": "tsdae", "bottleneck": "mean"}).bottleneck == "mean"
    for bad, message in [({"objectives": ["mlm"]}, "takes no objectives"), ({"encoder_mask": 0.3}, "encoder_masker"),
                         ({"trainer": "simcse"}, "unknown trainer 'simcse'")]:
        with pytest.raises(ConfigError, match=message):
            method_from_mapping({"base": "tsdae", **bad})
    with pytest.raises(ConfigError, match="own trainer"):
        PretrainModel(Encoder.from_config(tiny_bert_config()), config)

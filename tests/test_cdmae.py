"""CDMAE (paper 003): the preset, the linear bottleneck projection head, tiny runs on SciFact, PMI masking with
another decoder, and the command line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import tiny_bert_config
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder, build_objective
from pretrieve.modeling.pretrain_model import PretrainModel
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.method import MaskerSpec, MethodConfig, preset, resolve_method


def test_cdmae_preset_follows_the_paper():
    method = preset("cdmae")
    assert method.encoder_masker == MaskerSpec(kind="wwm", ratio=0.3)          # encoder masking unchanged
    assert method.decoder_masker.kind == "pmi" and method.decoder_masker.ratio == 0.5     # §4.1
    assert method.decoder_masker.params == {"window": 4, "sigma": 1.0, "whole_word": False, "statistics": None}
    assert [(s.name, s.weight, s.params) for s in method.objectives] == [
        ("mlm", 1.0, {}), ("ae", 1.0, {"num_layers": 2, "projection": True})]   # eq. 9, 2-layer decoder, eq. 4
    assert method.required_features() == {"mlm_labels", "decoder"}


def test_cdmae_random_differs_from_cdmae_only_in_the_decoder_masker(tokenizer):
    pmi, rand = preset("cdmae").to_dict(), preset("cdmae-random").to_dict()
    assert rand["decoder_masker"] == {"kind": "wwm", "ratio": pmi["decoder_masker"]["ratio"],
                                      "replace_probs": pmi["decoder_masker"]["replace_probs"]}
    assert {**rand, "name": "cdmae", "decoder_masker": pmi["decoder_masker"]} == pmi
    torch.manual_seed(0)
    heads = {name: {k: v.shape for k, v in PretrainModel(Encoder.from_config(tiny_bert_config()),
                                                         preset(name)).head_state_dict().items()}
             for name in ("cdmae", "cdmae-random")}
    assert heads["cdmae"] == heads["cdmae-random"] and "ae.projection.weight" in heads["cdmae"]
    # its decoder input is masked by whole words at random: no statistics needed, ~half the words hidden
    method = preset("cdmae-random")
    collator = PretrainCollator(tokenizer, method, {"mlm_labels", "decoder"}, max_len=32, seed=0)
    text = "the cell cycle of budding yeast is regulated by cyclin dependent kinases"
    batch = collator([{"input_ids": tokenizer(text)["input_ids"]}], generator=torch.Generator().manual_seed(0))
    decoded = batch["decoder_labels"] != -100
    assert 0.4 <= float(decoded.sum()) / (len(tokenizer(text)["input_ids"]) - 2) <= 0.6


def test_projection_head_is_the_decoder_bottleneck(tokenizer):
    torch.manual_seed(0)
    encoder = Encoder.from_config(tiny_bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    plain = build_objective("ae", encoder, num_layers=2).eval()
    projected = build_objective("ae", encoder, num_layers=2, projection=True).eval()
    projected.decoder.load_state_dict(plain.decoder.state_dict())
    assert set(projected.head_state_dict()) - set(plain.head_state_dict()) == {"projection.weight", "projection.bias"}
    ids = tokenizer(["the cell cycle of yeast", "dense vectors"], padding=True, return_tensors="pt")
    labels = torch.full_like(ids["input_ids"], -100)
    labels[:, 1] = ids["input_ids"][:, 1]
    masked = ids["input_ids"].clone()
    masked[:, 1] = tokenizer.mask_token_id
    batch = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"], "decoder_input_ids": masked,
             "decoder_labels": labels}
    enc = encoder(ids["input_ids"], ids["attention_mask"])
    with torch.no_grad():
        projected.projection.weight.copy_(torch.eye(32))
        projected.projection.bias.zero_()
        assert float(projected(batch, enc, encoder).loss) == pytest.approx(float(plain(batch, enc, encoder).loss),
                                                                           rel=1e-6)
        projected.projection.weight.mul_(0.5)
        assert float(projected(batch, enc, encoder).loss) != pytest.approx(float(plain(batch, enc, encoder).loss),
                                                                           rel=1e-6)
    projected.train()
    projected(batch, encoder(ids["input_ids"], ids["attention_mask"]), encoder).loss.backward()
    assert projected.projection.weight.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="projection"):
        build_objective("ae", encoder, projection="yes")


@pytest.fixture(scope="module")
def scifact_stats_dir(scifact, tokenizer, tmp_path_factory) -> tuple[Path, Path]:
    """SciFact tokenized at max_len 48 in a shared cache, and its PMI statistics directory."""
    from pretrieve.data.pretrain_text import TokenizedCorpus
    from pretrieve.masking.pmi import corpus_statistics

    cache = tmp_path_factory.mktemp("cdmae-cache")
    corpus = TokenizedCorpus.build(scifact, tokenizer, 48, cache, show_progress=False)
    corpus_statistics(corpus, len(tokenizer), 4)
    return cache, Path(corpus.tokens.filename).parent.with_name(Path(corpus.tokens.filename).parent.name + "-pmi-L4")


def with_statistics(method: MethodConfig, stats_dir: Path) -> MethodConfig:
    spec = method.decoder_masker
    return replace(method, decoder_masker=replace(spec, params={**spec.params, "statistics": str(stats_dir)}))


def run(model_dir, corpus, out, method, cache, steps):
    from pretrieve.train.loop import read_logs
    from pretrieve.train.pretrainer import PretrainConfig, pretrain

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # shared 2-core machine: avoid oversubscription stalls
    try:
        config = PretrainConfig(model=str(model_dir), corpus=str(corpus), out=str(out), method=method, max_len=48,
                                batch_size=8, lr=2e-3, max_steps=steps, warmup_ratio=0.05, log_every=10,
                                save_every=0, show_progress=False, cache_dir=str(cache))
        return pretrain(config), read_logs(out)
    finally:
        torch.set_num_threads(previous)


def test_cdmae_lowers_its_losses_on_scifact(scifact, tiny_mlm_dir, scifact_stats_dir, tmp_path):
    cache, stats_dir = scifact_stats_dir
    final, logs = run(tiny_mlm_dir, scifact, tmp_path / "run", with_statistics(preset("cdmae"), stats_dir), cache, 120)
    first, last = logs[0], logs[-1]
    for key in ("loss", "loss/mlm", "loss/ae"):
        assert last[key] < 0.9 * first[key], (key, first[key], last[key])
    assert first["tokens/ae"] > 1.5 * first["tokens/mlm"]                      # 0.5 vs 0.3 of the tokens
    from transformers import AutoModel

    AutoModel.from_pretrained(final)
    reloaded = PretrainModel.load(final)
    assert reloaded.objectives["ae"].projection is not None


def test_pmi_masking_combines_with_enhanced_decoding(scifact, tiny_mlm_dir, scifact_stats_dir, tmp_path):
    cache, stats_dir = scifact_stats_dir
    method = with_statistics(resolve_method(objectives="mlm,enhanced", decoder_masker="pmi"), stats_dir)
    _, logs = run(tiny_mlm_dir, scifact, tmp_path / "run", method, cache, 10)
    assert logs[-1]["step"] == 10 and all(0 < logs[-1][k] < 20 for k in ("loss/mlm", "loss/enhanced"))


def test_cli_pretrain_with_a_cdmae_method_file(scifact, tiny_mlm_dir, scifact_stats_dir, tmp_path):
    from typer.testing import CliRunner

    from pretrieve.cli import app

    cache, stats_dir = scifact_stats_dir
    method_file = tmp_path / "cdmae.yaml"
    method_file.write_text(f"base: cdmae\ndecoder_masker: {{params: {{statistics: {stats_dir}}}}}\n")
    config_file = tmp_path / "run.yaml"
    config_file.write_text(f"cache_dir: {cache}\nshow_progress: false\n")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = CliRunner().invoke(app, [
            "pretrain", "--model", str(tiny_mlm_dir), "--corpus", str(scifact), "--out", str(tmp_path / "out"),
            "--method", str(method_file), "--config", str(config_file), "--max-len", "48", "--batch-size", "4",
            "--steps", "3", "--save-every", "0", "--log-every", "1"])
    finally:
        torch.set_num_threads(previous)
    assert result.exit_code == 0, result.output
    import json

    saved = json.loads((tmp_path / "out" / "final" / "method.json").read_text())
    masker = saved["decoder_masker"]
    assert masker["kind"] == "pmi" and masker["params"]["statistics"] == str(stats_dir)
    assert saved["objectives"][1] == {"name": "ae", "weight": 1.0, "params": {"num_layers": 2, "projection": True}}

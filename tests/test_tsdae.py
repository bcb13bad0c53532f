"""TSDAE arm (train/tsdae.py): whole-word deletion noise, a few loop steps on a tiny random BERT that change the
weights, and an export that loads with AutoModel / AutoModelForMaskedLM and as a pretrieve encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from pretrieve.analysis.probe import export_checkpoint_encoder
from pretrieve.data.pretrain_text import TokenizedCorpus
from pretrieve.errors import ConfigError, InputError
from pretrieve.masking.vocab import VocabInfo
from pretrieve.modeling import Encoder
from pretrieve.train.settings import LoopConfig
from pretrieve.train.loop import read_logs, train
from pretrieve.train.method import preset, resolve_method, trainer_module
from pretrieve.train.pretrainer import pretrain
from pretrieve.train.run_config import build_pretrain_config
from pretrieve.train.tsdae import DeletionNoiseCollator, build, delete_words

TEXT = "the unbelievably resilient tardigrade survives dehydration, radiation and vacuum"


@pytest.fixture(scope="module")
def continuation(tokenizer) -> torch.Tensor:
    return VocabInfo.from_tokenizer(tokenizer).is_continuation


def words_of(continuation: torch.Tensor, ids: list[int]) -> list[tuple[int, ...]]:
    words: list[list[int]] = []
    for token in ids[1:-1]:
        if words and bool(continuation[token]):
            words[-1].append(token)
        else:
            words.append([token])
    return [tuple(word) for word in words]


def test_deletion_removes_whole_words_at_the_tsdae_ratio(tokenizer, continuation):
    ids = tokenizer(TEXT)["input_ids"]
    words = words_of(continuation, ids)
    assert any(len(word) > 1 for word in words) and ("," in tokenizer.convert_ids_to_tokens(ids))   # pieces, punct
    kept_total, runs = 0, 400
    for seed in range(runs):
        damaged = delete_words(ids, continuation, 0.6, torch.Generator().manual_seed(seed))
        assert damaged[0] == ids[0] and damaged[-1] == ids[-1]
        kept = words_of(continuation, damaged)
        assert kept and set(kept) <= set(words)                  # whole words only, at least one
        position = iter(words)                                   # ... in their original order
        assert all(any(word == candidate for candidate in position) for word in kept)
        kept_total += len(kept)
    assert kept_total / (runs * len(words)) == pytest.approx(0.4, abs=0.03)
    same = [delete_words(ids, continuation, 0.6, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert same[0] == same[1]                                    # a function of the generator


def test_collator_pads_damaged_inputs_and_clean_targets(tokenizer):
    examples = [{"input_ids": tokenizer(text)["input_ids"]} for text in (TEXT, "short one")]
    batch = DeletionNoiseCollator(tokenizer)(examples, generator=torch.Generator().manual_seed(0))
    assert batch["target_input_ids"][0].tolist() == examples[0]["input_ids"]
    assert batch["target_attention_mask"].sum(1).tolist() == [len(e["input_ids"]) for e in examples]
    assert batch["attention_mask"].sum(1)[0] < len(examples[0]["input_ids"])
    pad = batch["input_ids"][batch["attention_mask"] == 0]
    assert bool((pad == tokenizer.pad_token_id).all())
    with pytest.raises(ConfigError, match="not a TSDAE method"):
        build("unused", preset("bow"), tokenizer)
    # the pre-training run and the probe export reach this module through the method's trainer
    assert trainer_module(preset("tsdae")).build is build


@pytest.fixture(scope="module")
def tsdae_run(tiny_mlm_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tsdae")
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(f"{TEXT} {i} times in experiment number {i * 7}" for i in range(40)) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_mlm_dir))
    dataset = TokenizedCorpus.build(corpus, tokenizer, 32, tmp / "cache", show_progress=False, num_proc=1)
    torch.manual_seed(0)
    model, collator = build(tiny_mlm_dir, preset("tsdae"), tokenizer)

    def export(unwrapped, directory: Path) -> None:   # what the pre-training entry point's export does
        unwrapped.save(directory)
        tokenizer.save_pretrained(directory)

    config = LoopConfig(batch_size=8, lr=1e-3, max_steps=6, warmup_ratio=0.0, log_every=1, save_every=3,
                        show_progress=False, seed=3)
    final = train(model, dataset, collator, config, tmp / "out", export, {"config": {"method": "tsdae"}})
    return final, model, tmp / "out"


def test_a_few_steps_train_the_tied_encoder_and_the_export_loads(tsdae_run, tiny_mlm_dir):
    final, model, out = tsdae_run
    logs = read_logs(out)
    assert len(logs) == 6 and all(torch.isfinite(torch.tensor(row["loss"])) for row in logs)
    assert logs[-1]["loss"] < logs[0]["loss"]
    start = load_file(str(Path(tiny_mlm_dir) / "model.safetensors"))
    exported = load_file(str(final / "model.safetensors"))
    for key in ("bert.encoder.layer.0.attention.self.query.weight", "bert.embeddings.word_embeddings.weight",
                "cls.predictions.transform.dense.weight"):
        assert not torch.equal(start[key], exported[key]), key          # trained
    assert not any("crossattention" in key for key in exported)
    # the exported body is the encoder that TSDAE trained (tied to its decoder), not a stale copy
    body = model.loss.encoder[0].model.state_dict()
    assert torch.equal(body["encoder.layer.1.output.dense.weight"], exported["bert.encoder.layer.1.output.dense.weight"])
    assert model.loss.encoder[0].model.embeddings.word_embeddings.weight is \
        model.loss.decoder.bert.embeddings.word_embeddings.weight
    assert json.loads((final / "method.json").read_text()) == preset("tsdae").to_dict()

    plain = AutoModel.from_pretrained(str(final))
    masked_lm = AutoModelForMaskedLM.from_pretrained(str(final))
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    inputs = tokenizer([TEXT], return_tensors="pt")
    with torch.no_grad():
        hidden = plain(**inputs).last_hidden_state
        expected = model.loss.encoder[0].model.eval()(**inputs).last_hidden_state
    assert torch.allclose(hidden, expected, atol=1e-5)
    assert masked_lm(**inputs).logits.shape[-1] == tokenizer.vocab_size
    encoder = Encoder.from_pretrained(final)                          # the fine-tuning stage's loader
    assert not encoder.head_created


def test_mean_bottleneck_is_tsdaes_pooling(tiny_mlm_dir, tokenizer):
    model, _ = build(tiny_mlm_dir, resolve_method("tsdae", bottleneck="mean"), tokenizer)
    pooling = model.loss.encoder[1]
    assert pooling.pooling_mode == "mean"
    assert build(tiny_mlm_dir, preset("tsdae"), tokenizer)[0].loss.encoder[1].pooling_mode == "cls"


def test_the_pretrain_entry_point_trains_tsdae(tiny_mlm_dir, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"{TEXT} in run {i}" for i in range(24)) + "\n")
    config = build_pretrain_config({}, dict(model=str(tiny_mlm_dir), corpus=str(corpus), out=str(tmp_path / "out"),
                                            max_steps=3, batch_size=8, lr=1e-3, save_every=0, show_progress=False),
                                   {"method": "tsdae", "bottleneck": "mean"})
    final = pretrain(config)
    assert {"config.json", "model.safetensors", "method.json", "pretrain_config.json", "tokenizer.json"} <= {
        p.name for p in final.iterdir()}
    assert json.loads((final / "pretrain_config.json").read_text())["method"]["trainer"] == "tsdae"
    AutoModel.from_pretrained(str(final))


def test_a_checkpoint_of_the_run_exports_as_the_run_exports_its_final_model(tsdae_run, tmp_path):
    """The probes of intermediate steps export a TSDAE checkpoint (its own trainer, not a PretrainModel) as the run
    exports ``final``: the checkpoint's encoder body and LM head, under the masked-LM names, loadable as a model."""
    final, _, out = tsdae_run
    checkpoint = out / "checkpoints" / "step-3"
    exported = export_checkpoint_encoder(checkpoint, final, tmp_path / "step-3")
    got, state = load_file(str(exported / "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    assert got.keys() == load_file(str(final / "model.safetensors")).keys()
    body = {key.removeprefix("loss.encoder.0.model."): value for key, value in state.items()
            if key.startswith("loss.encoder.0.model.")}
    head = {key.removeprefix("loss.decoder."): value for key, value in state.items()
            if key.startswith("loss.decoder.cls.")}
    assert len(body) > 10 and head
    assert all(torch.equal(got[f"bert.{key}"], value) for key, value in body.items())
    assert all(torch.equal(got[key], value) for key, value in head.items())
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(got[key], load_file(str(final / "model.safetensors"))[key])   # step 3, not the final step
    assert not Encoder.from_pretrained(exported).head_created and AutoTokenizer.from_pretrained(str(exported))
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({"loss.encoder.0.model.pooler.dense.weight": torch.zeros(2, 2)}, str(bad / "model.safetensors"))
    with pytest.raises(InputError, match="does not fit the TSDAE run's model"):
        export_checkpoint_encoder(bad, final, tmp_path / "bad-out")

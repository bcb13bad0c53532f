"""WiSE-FT interpolation of a fine-tuned retriever with its base checkpoint: the weights are the convex
combination, α = 0 / 1 give the base / fine-tuned model's vectors, separate towers and a prefixed MLM base
match by name, and a checkpoint of another shape is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pretrieve.errors import InputError
from pretrieve.modeling.dual_encoder import TOWER_FOLDERS, DualEncoder
from pretrieve.modeling.export import export_retriever
from pretrieve.modeling.interpolate import interpolate_retriever
from pretrieve.modeling.representations import DenseRepresentation
from pretrieve.retrieval.load import load_dense_encoder

TEXTS = ["what causes rain?", "Protein folding is predicted from sequence by deep networks.", "dogs"]


def _perturbed_export(base_dir, tokenizer, out, tied=True, seed=1):
    model = DualEncoder.from_pretrained(base_dir, DenseRepresentation("mean"), tied=tied)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return export_retriever(model, tokenizer, out, 32)


def _tensors(directory):
    return {name: tensor for path in sorted(directory.rglob("*.safetensors"))
            for name, tensor in ((f"{path.relative_to(directory)}:{k}", v) for k, v in load_file(str(path)).items())}


def test_weights_are_the_convex_combination(tiny_bert_dir, tokenizer, tmp_path):
    finetuned = _perturbed_export(tiny_bert_dir, tokenizer, tmp_path / "ft")
    half = interpolate_retriever(tiny_bert_dir, finetuned, 0.25, tmp_path / "wise")
    base = load_file(str(tiny_bert_dir / "model.safetensors"))
    mixed, tuned = load_file(str(half / "model.safetensors")), load_file(str(finetuned / "model.safetensors"))
    assert set(mixed) == set(tuned)
    for name, value in tuned.items():
        if value.is_floating_point():
            torch.testing.assert_close(mixed[name], 0.75 * base[name] + 0.25 * value, atol=1e-6, rtol=1e-6)
    record = json.loads((half / "interpolation.json").read_text())
    assert record["alpha"] == 0.25 and record["tensors_interpolated"] > 0
    assert (half / "modules.json").exists() and (half / "tokenizer.json").exists()


def test_alpha_zero_and_one_encode_as_base_and_finetuned(tiny_bert_dir, tokenizer, tmp_path):
    finetuned = _perturbed_export(tiny_bert_dir, tokenizer, tmp_path / "ft")
    base_model = export_retriever(DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean")),
                                  tokenizer, tmp_path / "base", 32)
    zero = interpolate_retriever(tiny_bert_dir, finetuned, 0.0, tmp_path / "a0")
    one = interpolate_retriever(tiny_bert_dir, finetuned, 1.0, tmp_path / "a1")
    vectors = {name: load_dense_encoder(path).embed(TEXTS).numpy()
               for name, path in (("base", base_model), ("ft", finetuned), ("a0", zero), ("a1", one))}
    np.testing.assert_allclose(vectors["a0"], vectors["base"], atol=1e-5)
    np.testing.assert_allclose(vectors["a1"], vectors["ft"], atol=1e-6)
    assert not np.allclose(vectors["base"], vectors["ft"], atol=1e-3)


def test_separate_towers_and_an_mlm_base_match_by_name(tiny_bert_dir, tiny_mlm_dir, tokenizer, tmp_path):
    finetuned = _perturbed_export(tiny_bert_dir, tokenizer, tmp_path / "ft", tied=False)
    # tiny_mlm_dir is a BertForMaskedLM (names "bert.…") initialised from another seed: names match, values differ
    out = interpolate_retriever(tiny_mlm_dir, finetuned, 0.5, tmp_path / "wise")
    mlm = {k[len("bert."):]: v for k, v in load_file(str(tiny_mlm_dir / "model.safetensors")).items()
           if k.startswith("bert.")}
    for folder in TOWER_FOLDERS.values():
        tuned = load_file(str(finetuned / folder / "model.safetensors"))
        mixed = load_file(str(out / folder / "model.safetensors"))
        name = "embeddings.word_embeddings.weight"
        torch.testing.assert_close(mixed[name], 0.5 * mlm[name] + 0.5 * tuned[name], atol=1e-6, rtol=1e-6)


def test_a_checkpoint_of_another_shape_is_refused(tiny_bert_dir, tokenizer, tmp_path):
    from transformers import BertModel

    from conftest import tiny_bert_config

    other = tmp_path / "other"
    BertModel(tiny_bert_config(hidden_size=48, intermediate_size=96)).save_pretrained(other)
    finetuned = _perturbed_export(tiny_bert_dir, tokenizer, tmp_path / "ft")
    with pytest.raises(InputError, match="not the checkpoint this retriever was fine-tuned from"):
        interpolate_retriever(other, finetuned, 0.5, tmp_path / "wise")
    assert not (tmp_path / "wise").exists()

"""CoT-MAE's contextual decoders (context_ae, context_ar) and the span MLM, recomputed by hand from their parts;
anchors and contexts encoded in one call; the presets; MoTE in pre-training (experts, swap, save/load); a tiny
training run whose losses fall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_bert_config
from pretrieve.data.spans import PairDataset, SpanCorpus, SpanDataset
from pretrieve.errors import ConfigError
from pretrieve.modeling import Encoder
from pretrieve.modeling.mote import expert_parameters, is_mote
from pretrieve.modeling.objectives.autoregression import causal_visibility
from pretrieve.modeling.pretrain_model import MultiViewEncoderOutput, PretrainModel
from pretrieve.train.collator import PretrainCollator
from pretrieve.train.method import MethodConfig, method_from_mapping, preset

TEXTS = [
    "The tumor cells grow fast. Kinase binding drives the growth. Immune cells respond to the tumor. "
    "Blood vessels feed the tissue. The receptor signal is strong.",
    "Viruses infect the membrane. The enzyme cuts the protein. Gene expression changes after infection. "
    "The response of the immune system follows. Growth factors are released.",
    "Mutations alter the pathway. The protein folds badly. Cells die when the pathway fails. "
    "Tissue repair needs growth factors. The blood carries signals.",
]


@pytest.fixture(scope="module")
def spans(tmp_path_factory, tokenizer) -> SpanDataset:
    root = tmp_path_factory.mktemp("ctx")
    (root / "docs.txt").write_text("\n".join(TEXTS) + "\n")
    # every span an anchor: the objective tests need more examples than the three documents
    return SpanDataset(SpanCorpus.build(root / "docs.txt", tokenizer, max_len=16, cache_dir=root / "cache"), "mixed",
                       anchors="span")


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    queries = ["does the tumor grow", "what does the enzyme cut", "why do cells die"]
    path.write_text("".join(json.dumps({"passage": text, "query": query}) + "\n" for text, query in zip(TEXTS, queries)))
    return path


def setup(tokenizer, method: MethodConfig, examples) -> tuple[PretrainModel, dict]:
    torch.manual_seed(0)
    model = PretrainModel(Encoder.from_config(tiny_bert_config(initializer_range=0.2)), method).double()
    batch = PretrainCollator(tokenizer, method, max_len=48, seed=0)(examples, generator=torch.Generator().manual_seed(3))
    return model, batch


def mean_ce(encoder: Encoder, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    keep = labels != -100
    return F.cross_entropy(encoder.mlm_logits(hidden[keep]), labels[keep], reduction="sum"), int(keep.sum())


def test_presets_and_validation(tmp_path):
    cotmae = preset("cotmae")
    assert cotmae.decoder_masker.ratio == 0.45 and cotmae.encoder_masker.ratio == 0.3
    assert cotmae.objectives[1].params == {"num_layers": 2} and cotmae.context.kind == "mixed" and not cotmae.mote
    cotmote = preset("cotmote")
    assert cotmote.mote and not cotmote.mote_swap and cotmote.context.kind == "pairs"
    assert preset("cotmote-swap").mote_swap
    assert MethodConfig.from_dict(cotmote.to_dict()) == cotmote
    assert MethodConfig.from_dict({k: v for k, v in preset("bow").to_dict().items()
                                   if k not in ("context", "mote", "mote_swap")}) == preset("bow")  # old files load
    with pytest.raises(ConfigError, match="context"):
        method_from_mapping({"objectives": ["mlm_spans", "context_ar"]})
    with pytest.raises(ConfigError, match="mote"):
        method_from_mapping({"base": "cotmae", "mote_swap": True})
    assert method_from_mapping({"base": "cotmae", "context": {"kind": "overlap"}}).context.kind == "overlap"


def test_anchors_and_contexts_are_encoded_in_one_call(tokenizer, spans):
    model, batch = setup(tokenizer, preset("cotmae"), [spans[i] for i in range(4)])
    model.eval()
    calls = []
    hook = model.encoder.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    with torch.no_grad():
        enc = model.encode(batch)
    hook.remove()
    assert calls == [8] and isinstance(enc, MultiViewEncoderOutput) and set(enc.views) == {"context"}
    with torch.no_grad():
        alone = model.encoder(batch["context_input_ids"], batch["context_attention_mask"])
    assert torch.allclose(enc.views["context"].last_hidden_state, alone.last_hidden_state, atol=1e-10)


def test_context_ae_and_span_mlm_by_hand(tokenizer, spans):
    model, batch = setup(tokenizer, preset("cotmae"), [spans[i] for i in range(5)])
    model.eval()
    encoder, decoder = model.encoder, model.objectives["context_ae"].decoder
    with torch.no_grad():
        loss, logs = model(batch)
        anchor = encoder(batch["input_ids"], batch["attention_mask"])
        context = encoder(batch["context_input_ids"], batch["context_attention_mask"])
        total, count, directions = 0.0, 0, {}
        for name, cls, ids, labels, mask in (
                ("to_context", anchor.cls, batch["context_decoder_input_ids"], batch["context_decoder_labels"],
                 batch["context_attention_mask"]),
                ("to_anchor", context.cls, batch["decoder_input_ids"], batch["decoder_labels"],
                 batch["attention_mask"])):
            embedded = encoder.embed_tokens(ids)
            hidden = torch.cat([cls.unsqueeze(1), embedded[:, 1:]], dim=1)       # the other span's [CLS] at 0
            decoded = decoder(hidden, mask.bool().unsqueeze(1))
            summed, n = mean_ce(encoder, decoded, labels)
            directions[name] = float(summed / n)
            total, count = total + summed, count + n
        mlm_a, n_a = mean_ce(encoder, anchor.last_hidden_state, batch["mlm_labels"])
        mlm_c, n_c = mean_ce(encoder, context.last_hidden_state, batch["context_mlm_labels"])
    assert float(logs["loss/context_ae"]) == pytest.approx(float(total / count), rel=1e-9)
    assert float(logs["loss_to_context/context_ae"]) == pytest.approx(directions["to_context"], rel=1e-9)
    assert float(logs["loss_to_anchor/context_ae"]) == pytest.approx(directions["to_anchor"], rel=1e-9)
    assert float(logs["loss/mlm_spans"]) == pytest.approx(float((mlm_a + mlm_c) / (n_a + n_c)), rel=1e-9)
    assert float(loss) == pytest.approx(float(total / count + (mlm_a + mlm_c) / (n_a + n_c)), rel=1e-9)


def test_context_ar_by_hand_and_routing(tokenizer, pairs_file):
    # both directions, one token-count mean, full causal attention (the options' defaults; the preset differs)
    method = method_from_mapping({"base": "cotmote", "context": {"pairs": str(pairs_file)},
                                  "objectives": ["mlm_spans", {"name": "context_ar", "params": {"num_layers": 1}}]})
    dataset = PairDataset(pairs_file, tokenizer, max_len=48)
    model, batch = setup(tokenizer, method, [dataset[i] for i in range(3)])
    assert is_mote(model.encoder.model)
    model.eval()
    encoder, decoder = model.encoder, model.objectives["context_ar"].decoder
    with torch.no_grad():
        loss, logs = model(batch)
        passage = encoder(batch["input_ids"], batch["attention_mask"], text_type=torch.ones(3, dtype=torch.long))
        query = encoder(batch["context_input_ids"], batch["context_attention_mask"],
                        text_type=torch.zeros(3, dtype=torch.long))
        total, count = 0.0, 0
        for cls, ids, labels, mask in ((passage.cls, batch["context_original_ids"], batch["context_original_labels"],
                                        batch["context_attention_mask"]),
                                       (query.cls, batch["original_input_ids"], batch["original_labels"],
                                        batch["attention_mask"])):
            hidden = torch.cat([cls.unsqueeze(1), encoder.embed_tokens(ids)[:, 1:]], dim=1)
            visible = causal_visibility(ids.shape[1], None).unsqueeze(0) & mask.bool().unsqueeze(1)
            decoded = decoder(hidden, visible)
            summed, n = mean_ce(encoder, decoded[:, :-1], labels[:, 1:])         # position i predicts token i + 1
            total, count = total + summed, count + n
    assert float(logs["loss/context_ar"]) == pytest.approx(float(total / count), rel=1e-9)
    # queries really go through Q-FFN: perturbing the query experts changes only the query encodings
    with torch.no_grad():
        for p in expert_parameters(encoder.model, "query"):
            p.add_(0.05)
        enc = model.encode(batch)
    assert torch.allclose(enc.last_hidden_state, passage.last_hidden_state, atol=1e-10)
    assert not torch.allclose(enc.views["context"].cls, query.cls, atol=1e-3)


def test_swap_flag_routes_queries_to_the_passage_expert(tokenizer, pairs_file):
    method = method_from_mapping({"base": "cotmote-swap", "context": {"pairs": str(pairs_file)}})
    dataset = PairDataset(pairs_file, tokenizer, max_len=48)
    model, batch = setup(tokenizer, method, [dataset[i] for i in range(3)])
    seen = []
    hook = model.encoder.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["text_type"]),
                                                   with_kwargs=True)
    model(batch)
    hook.remove()
    assert seen[0].tolist() == [0, 0, 0, 1, 1, 1]       # passages → Q-FFN (0), queries → P-FFN (1)


def test_mote_pretraining_checkpoint_round_trip(tokenizer, pairs_file, tmp_path):
    method = method_from_mapping({"base": "cotmote", "context": {"pairs": str(pairs_file)}})
    dataset = PairDataset(pairs_file, tokenizer, max_len=48)
    model, batch = setup(tokenizer, method, [dataset[i] for i in range(3)])
    with torch.no_grad():
        for p in expert_parameters(model.encoder.model, "query"):
            p.add_(0.01 * torch.randn_like(p))
    model.eval()
    with torch.no_grad():
        loss = float(model(batch)[0])
    model.float().save(tmp_path)
    reloaded = PretrainModel.load(tmp_path).double().eval()
    assert is_mote(reloaded.encoder.model)
    with torch.no_grad():
        assert float(reloaded(batch)[0]) == pytest.approx(loss, rel=1e-5)


def test_tiny_cotmae_run_lowers_its_losses(tokenizer, spans, tiny_mlm_dir, tmp_path):
    from pretrieve.train.settings import LoopConfig
    from pretrieve.train.loop import read_logs, train

    method = preset("cotmae")
    torch.manual_seed(0)
    model = PretrainModel(Encoder.from_pretrained(tiny_mlm_dir), method)
    collator = PretrainCollator(tokenizer, method, max_len=16, seed=0)
    config = LoopConfig(batch_size=6, lr=3e-3, max_steps=40, warmup_ratio=0.05, log_every=5, save_every=0,
                        show_progress=False)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(model, spans, collator, config, tmp_path, lambda unwrapped, directory: unwrapped.save(directory), {})
    finally:
        torch.set_num_threads(previous)
    logs = read_logs(tmp_path)
    first, last = logs[0], logs[-1]
    for key in ("loss/context_ae", "loss/mlm_spans"):
        assert last[key] < 0.9 * first[key], (key, first[key], last[key])
    assert (tmp_path / "final" / "heads.safetensors").exists()

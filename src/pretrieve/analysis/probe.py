"""Unsupervised probes of a pre-trained checkpoint: retrieval with its raw [CLS] vector, no fine-tuning.

Retrieval-oriented pre-training (BoW prediction, enhanced decoding, RetroMAE's bottleneck) trains the [CLS]
vector to carry the input's content; before any fine-tuning, retrieval with that vector is the cheapest check
that it did (issue #20's gate: does ``bow`` / ``retromae`` move the probe above ``mlm``?). :func:`cls_probe`
searches every judged query of every split of the given collections with the checkpoint as a plain dense
retriever — [CLS] pooling, dot product (``dot``) and cosine (``cos``: L2-normalised vectors) — through the search
path the recipe's ``evaluate`` stage uses (:func:`pretrieve.retrieval.runs.retriever_runs`: searched unless current,
the queries split by rank; runs in ``out/runs/<similarity>__<collection>[:split].trec``, the recipe's names), and
scores the runs with :func:`pretrieve.evaluation.evaluate`. The corpus is encoded once per probe: the cosine index
is the dot index's vectors normalised (:func:`~pretrieve.retrieval.search.normalized_index`, float32 encoders, one
process; the same vectors as encoding again).

:func:`export_checkpoint_encoder` writes the encoder of a pre-training checkpoint (``checkpoints/step-<N>``:
accelerate's saved state) as a model directory, so that an intermediate step can be probed like the final model:
the run's exported model (``final``: its encoder, heads and method) is loaded and the checkpoint's weights are put
into it (the MLM decoder, tied to the embeddings and saved once, is tied again). A checkpoint of a method with its
own trainer (e.g. TSDAE; not a ``PretrainModel``) is loaded into the model that run trains and exported as it
exports ``final`` (the trainer's ``load_checkpoint``: :data:`pretrieve.train.method.TRAINERS`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import read_run
from pretrieve.errors import InputError
from pretrieve.evaluation import evaluate
from pretrieve.io_utils import atomic_dir
from pretrieve.models import no_remote_code
from pretrieve.retrieval.runs import retriever_runs, run_path

SIMILARITIES = ("dot", "cos")
PROBE_MEASURES = ("nDCG@10", "R@100")


def export_checkpoint_encoder(checkpoint: str | Path, final: str | Path, out: str | Path) -> Path:
    """The encoder of ``checkpoint`` (a pre-training run's ``step-<N>``) saved to ``out`` with the tokenizer of
    ``final`` (the same run's exported model); returns ``out``."""
    from safetensors.torch import load_file  # lazy: safetensors
    from transformers import AutoTokenizer  # lazy: transformers

    from pretrieve.modeling.pretrain_model import METHOD_FILE, PretrainModel  # lazy: torch
    from pretrieve.train.method import MethodConfig, trainer_module  # lazy: torch

    weights = Path(checkpoint) / "model.safetensors"
    if not weights.exists():
        raise InputError("no model.safetensors in the checkpoint", path=checkpoint)
    method_path = Path(final) / METHOD_FILE
    raw = json.loads(method_path.read_text(encoding="utf-8")) if method_path.exists() else None
    method = MethodConfig.from_dict(raw, where=str(method_path)) if raw is not None else None
    if method is not None and method.trainer is not None:    # e.g. TSDAE: exported as the run exports its final model
        save = trainer_module(method).load_checkpoint(final, method, weights).save
    else:
        model = PretrainModel.load(final, method=raw)
        missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
        untied = [key for key in missing if not key.endswith(("decoder.weight", "decoder.bias"))]
        if untied or unexpected:
            raise InputError(f"the checkpoint does not fit the run's model (missing {untied[:3]}, unexpected "
                             f"{list(unexpected)[:3]})", path=checkpoint)
        save = model.encoder.save_pretrained
    with atomic_dir(Path(out)) as tmp:
        save(tmp)
        AutoTokenizer.from_pretrained(final, **no_remote_code(final)).save_pretrained(tmp)
    return Path(out)


def cls_probe(model: str | Path, collections: Sequence[str | Path], out: str | Path, depth: int = 100,
              batch_size: int = 64, similarities: Sequence[str] = SIMILARITIES,
              precision: str = "auto") -> dict[str, Any]:
    """``{similarity: {"<collection>:<split>": {"aggregate": {measure: mean}, "per_query": {measure: {qid: v}}}}}``
    of [CLS] retrieval with ``model`` (runs and corpus indexes under ``out``), encoded at ``precision``."""
    out = Path(out)
    results: dict[str, Any] = {}
    for similarity in sorted(similarities, key=lambda s: s != "dot"):   # dot first: cosine's index derives from it
        results[similarity] = {}
        for path in collections:
            collection = BeirCollection(Path(path))
            name = collection.root.name
            dot_index = out / "embeddings" / f"dot__{name}" if similarity == "cos" and "dot" in similarities else None
            written = retriever_runs(str(model), collection,
                                     {split: run_path(out, similarity, collection.root, split)
                                      for split in collection.splits()}, depth,
                                     index_dir=out / "embeddings" / f"{similarity}__{name}", precision=precision,
                                     batch_size=batch_size, tag=f"cls-{similarity}", pooling="cls",
                                     normalize=similarity == "cos", normalized_from=dot_index, show_progress=False)
            for split, run in written.items():
                result = evaluate(collection.load_qrels(split), read_run(run), list(PROBE_MEASURES))
                results[similarity][f"{name}:{split}"] = {
                    "aggregate": {m: float(result.aggregate[m]) for m in PROBE_MEASURES},
                    "per_query": {m: {q: float(v) for q, v in result.per_query[m].items()} for m in PROBE_MEASURES}}
    return results

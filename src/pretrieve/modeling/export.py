"""Export a fine-tuned dual encoder so that retrieval tools load it as they are.

:func:`export_retriever` writes a :class:`~pretrieve.modeling.dual_encoder.DualEncoder` (``save``), its tokenizer
and, for dense representations, the sentence-transformers files beside every tower:

* ``modules.json`` — ``Transformer`` (the tower, at the folder's root) → ``Pooling`` (``1_Pooling``) →
  ``Normalize`` (``2_Normalize``, when the representation normalises or is trained on cosine similarity);
* ``sentence_bert_config.json`` — ``max_seq_length`` (the passage length used in training) and
  ``do_lower_case: false``; the tokenizer's ``model_max_length`` is set to the same value, which is where
  sentence-transformers 6 reads it;
* ``1_Pooling/config.json`` — ``word_embedding_dimension`` and the ``pooling_mode_*`` booleans (``cls`` or
  ``mean``), the form every sentence-transformers version from 2 to 6 reads;
* ``config_sentence_transformers.json`` — ``similarity_fn_name`` ``"cosine"`` for cosine/normalised
  representations, else ``"dot"``; no prompts.

So a siamese dense model loads with ``sentence_transformers.SentenceTransformer(path)`` and with
``pretrieve.retrieval.load.load_retriever(path)`` (``pretrieve dense --model path``), and both encode the same
vectors the model computed in training (with a Normalize module added for cosine-trained models, which changes
no cosine score).

A model with separate towers (``tied=False``) is written as ``query/`` and ``passage/`` subfolders, each a
complete sentence-transformers model of its own side, plus ``dual_encoder.json`` at the root. The root itself
is *not* a sentence-transformers model (sentence-transformers has no notion of two encoders in one folder):
load ``path/query`` for queries and ``path/passage`` for passages, or ``DualEncoder.load(path)``.
Representations other than dense (sparse, DupMAE) get no sentence-transformers files.

**CoT-MoTE models** (query and passage FFN experts, CoT-MoTE (Ma et al. 2023)) cannot be expressed in sentence-transformers,
which runs one network on every text: ``SentenceTransformer(path)`` (through ``AutoModel``) loads the *passage*
expert — the one stored under BERT's parameter names — and ignores the query expert, so it would encode
queries through P-FFN. The export still writes the sentence-transformers files (pretrieve's own loaders read
their pooling, normalisation and length, and route the experts:
:func:`pretrieve.retrieval.load.load_retriever`, ``pretrieve dense``), but it warns
(:class:`MoTEExportWarning`) and records ``"mote_passage_expert_only": true`` in
``config_sentence_transformers.json``; use the folder with pretrieve, or with sentence-transformers for
passages only.
"""

from __future__ import annotations

import logging
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from pretrieve.io_utils import write_json
from pretrieve.modeling.dual_encoder import DualEncoder
from pretrieve.modeling.mote import is_mote
from pretrieve.modeling.representations import DenseRepresentation

logger = logging.getLogger(__name__)


class MoTEExportWarning(UserWarning):
    """A CoT-MoTE model was exported with sentence-transformers files that can only run its passage expert."""


MOTE_WARNING = ("{path}: this CoT-MoTE model routes queries through its query FFN expert, which "
                "sentence-transformers cannot do — SentenceTransformer('{path}') loads the passage expert only and "
                "would encode queries with it. Search it with pretrieve (pretrieve dense / "
                "retrieval.load.load_retriever), which routes both experts.")

POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}
_ALL_POOLING_KEYS = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                     "pooling_mode_mean_sqrt_len_tokens")


def export_retriever(model: DualEncoder, tokenizer, directory: str | Path, max_seq_length: int,
                     training: Mapping[str, Any] | None = None) -> Path:
    """Save ``model`` + ``tokenizer`` into ``directory`` in the layout described in the module docstring."""
    directory = Path(directory)
    model.save(directory, training=training)
    tower_dirs = [directory] if model.tied else [directory / "query", directory / "passage"]
    if not model.tied:
        _save_tokenizer(tokenizer, directory, max_seq_length)
    dense = isinstance(model.representation, DenseRepresentation)
    for tower_dir, tower in zip(tower_dirs, [model.query_tower] if model.tied else [model.query_tower,
                                                                                     model.passage_tower]):
        _save_tokenizer(tokenizer, tower_dir, max_seq_length)
        if dense:
            mote = tower_is_mote(tower)
            write_sentence_transformers_files(tower_dir, model.representation, model.query_tower.hidden_size,
                                              max_seq_length, mote_passage_expert_only=mote)
            if mote:
                warnings.warn(MOTE_WARNING.format(path=tower_dir), MoTEExportWarning, stacklevel=2)
    if not isinstance(model.representation, DenseRepresentation):
        logger.info("representation '%s' is not dense: no sentence-transformers files written",
                    model.representation.kind)
    return directory


def _save_tokenizer(tokenizer, directory: Path, max_seq_length: int) -> None:
    previous = tokenizer.model_max_length
    tokenizer.model_max_length = max_seq_length
    try:
        tokenizer.save_pretrained(str(directory))
    finally:
        tokenizer.model_max_length = previous


def tower_is_mote(tower) -> bool:
    """Whether a dual-encoder tower holds CoT-MoTE query/passage experts."""
    return any(is_mote(module) for module in tower.modules())


def write_sentence_transformers_files(directory: str | Path, representation: DenseRepresentation, dimension: int,
                                      max_seq_length: int, mote_passage_expert_only: bool = False) -> None:
    """``modules.json``, ``sentence_bert_config.json``, ``1_Pooling/``, ``2_Normalize/`` and
    ``config_sentence_transformers.json`` for a folder whose root holds the transformer (with
    ``"mote_passage_expert_only": true`` for a CoT-MoTE model, see the module docstring)."""
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if representation.unit_vectors:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(parents=True, exist_ok=True)
    write_json(directory / "modules.json", modules)
    write_json(directory / "sentence_bert_config.json", {"max_seq_length": int(max_seq_length), "do_lower_case": False})
    pooling = {"word_embedding_dimension": int(dimension)}
    pooling.update({key: key == POOLING_KEYS[representation.pooling] for key in _ALL_POOLING_KEYS})
    write_json(directory / "1_Pooling" / "config.json", pooling)
    settings = {"__version__": _versions(), "prompts": {}, "default_prompt_name": None,
                "similarity_fn_name": "cosine" if representation.unit_vectors else "dot"}
    if mote_passage_expert_only:
        settings["mote_passage_expert_only"] = True
    write_json(directory / "config_sentence_transformers.json", settings)


def _versions() -> dict[str, str]:
    found = {}
    for name, package in (("pytorch", "torch"), ("transformers", "transformers"),
                          ("sentence_transformers", "sentence-transformers")):
        try:
            found[name] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found

"""Query-side fine-tuning: only the query tower trains; the passage tower stays the model fine-tuning started from.

``train_towers: query`` (:class:`~pretrieve.train.settings.FinetuneSettings`) follows query-side fine-tuning (Lee et
al. 2021, "Learning Dense Representations of Phrases at Scale", DensePhrases §4.3) and the asymmetric dual
encoders of Dong et al. 2022 ("Exploring Dual Encoder Architectures for Question Answering"): the passage vectors
are the base model's, so

* the corpus is encoded once, by the base model, into the user cache that ``pretrieve.search`` /
  ``pretrieve dense`` fill and read (:func:`corpus_index`: a corpus the user already searched with the base model
  is not encoded again), and nothing in training encodes a passage;
* with the passage side frozen, each query is scored against the *whole* corpus: the loss of a (query, positive)
  pair is the exact softmax cross-entropy over every corpus vector but the query's other positives
  (:func:`pretrieve.modeling.losses.full_corpus_loss`, temperature as two-tower fine-tuning: 0.05 for cosine) —
  no negatives to mine, no BM25 run, no in-batch approximation;
* the saved model has separate towers (sentence-transformers' ``Router``, :mod:`pretrieve.modeling.export`): the
  trained query tower and the base model's transformer files copied **byte for byte** into the passage tower's
  folder, so the corpus cache — keyed by the passage tower's files
  (:meth:`pretrieve.retrieval.load.Retriever.inputs`) — serves the fine-tuned model too, and its searches
  encode only queries. Passage length, pooling, normalisation, prompt and title join stay the base model's.

The training examples are the qrels groups of the training split (every judged-relevant passage of each query,
:func:`pretrieve.train.finetuner.write_qrels_groups`); a step samples ``batch_size`` queries and uses all their
positives. The corpus matrix is held in memory on every rank (N × dim × 4 bytes: SciFact's 5,183 × 384 = 8 MB,
1M × 384 = 1.5 GB, MS MARCO's 8.8M × 768 = 27 GB) plus one ``[batch, N]`` score matrix per micro-batch; it is
a plain attribute, not a buffer, so DDP does not broadcast it and checkpoints do not hold it. Settings that
concern passages or negatives (``stage``, ``groups``, ``num_negatives``, ``passage_max_len``, …) do not apply and
are refused when changed (:meth:`~pretrieve.train.settings.FinetuneSettings.check`).

Measured on SciFact (docs/python.md): all-MiniLM-L6-v2 0.6466 nDCG@10 off the shelf; query-side fine-tuned for 2
epochs at lr 5e-5 (chosen on dev queries held out of the training split), see that page for the test number and
its cost.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import pyarrow.compute as pc
import torch
from torch import nn

from pretrieve import artifacts
from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.dual_encoder import TOWER_FOLDERS, DualEncoder
from pretrieve.modeling.losses import full_corpus_loss
from pretrieve.modeling.sentence_transformer import tower_files
from pretrieve.precision import full_precision
from pretrieve.retrieval.cache import corpus_index_dir
from pretrieve.retrieval.index import decode_ids, find_shards, open_index
from pretrieve.retrieval.load import Retriever, load_retriever, passage_tower_files, retriever_kind
from pretrieve.retrieval.search import encode_corpus

if TYPE_CHECKING:
    from pretrieve.data.collection import BeirCollection
    from pretrieve.data.groups import TrainingGroup

logger = logging.getLogger(__name__)


def check_base(model_path: str) -> None:
    """Refuse, from its files and before anything is loaded, a base model whose passage tower query-side
    fine-tuning cannot keep: it must be a local dense model whose passage side is one transformer folder
    (:func:`~pretrieve.retrieval.load.passage_tower_files`: no Dense layers, not CoT-MoTE)."""
    path = Path(model_path)
    local = path if path.is_dir() else None
    if local is None or retriever_kind(local) != "dense" or passage_tower_files(model_path, local) is None:
        raise ConfigError(f"train_towers: query keeps {model_path}'s passage tower as it is, which needs a local dense "
                          "model whose passage side is one transformer folder (no Dense layers, not CoT-MoTE)")


def base_retriever(model_path: str, pooling: str, normalize: bool, device: Any) -> "Retriever":
    """The base model (checked by :func:`check_base`) as ``pretrieve.search`` loads it (default precision), with the
    pooling and normalisation the fine-tuning keeps, on ``device`` (a launched run: this rank's)."""
    return load_retriever(model_path, pooling=pooling, normalize=normalize, device=device)


def corpus_index(retriever: "Retriever", collection: "BeirCollection", show_progress: bool = True) -> Path:
    """The corpus index of ``retriever`` over ``collection`` in the user cache (the one ``pretrieve.search`` keeps):
    reused while current, else encoded there (every rank calls this: :func:`~pretrieve.retrieval.search
    .encode_corpus`)."""
    root = corpus_index_dir(retriever, collection.corpus_path)
    return encode_corpus(retriever, collection.corpus_dataset(), root, show_progress=show_progress)


def load_vectors(root: Path) -> tuple[torch.Tensor, dict[str, int]]:
    """The vectors of the index at ``root`` (all shards, in order) as one float32 matrix, and each id's row."""
    parts, rows = [], {}
    for shard in (open_index(path) for path in find_shards(root)):
        if not shard.has("embeddings"):
            raise InputError("not a dense corpus index (no embeddings)", path=shard.path)
        for doc_id in decode_ids(shard.ids):
            rows.setdefault(doc_id, len(rows))
        parts.append(np.asarray(shard.array("embeddings"), dtype=np.float32))
    vectors = torch.from_numpy(np.concatenate(parts) if len(parts) > 1 else parts[0].copy())
    if len(rows) != len(vectors):
        raise InputError("the corpus index repeats a passage id", path=root)
    return vectors, rows


class QuerySideEncoder(nn.Module):
    """The trained module: a one-tower :class:`DualEncoder` that encodes queries, scored against the frozen corpus
    matrix ``passages`` (kept as a plain attribute: not a parameter, buffer or checkpoint entry)."""

    grad_cache_chunk = None

    def __init__(self, encoder: DualEncoder, passages: torch.Tensor):
        super().__init__()
        self.encoder = encoder
        self.passages = passages

    def forward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        q = self.encoder.encode_batch(batch, "query")
        if self.passages.device != q.device:
            self.passages = self.passages.to(q.device)
        positives = batch["positives"]
        with torch.autocast(device_type=q.device.type, enabled=False):   # scores in float32 (DualEncoder.loss)
            scores = full_precision(q) @ self.passages.T   # [B, N], once: the loss and the accuracy
            loss = full_corpus_loss(scores, positives, self.encoder.representation.temperature)
            best = scores.detach().argmax(dim=1, keepdim=True)
            accuracy = (positives == best).any(dim=1).float().mean()
        return loss, {"loss/full_corpus": loss.detach(), "accuracy": accuracy}

    def may_leave_parameters_unused(self) -> bool:
        return self.encoder.may_leave_parameters_unused()


class QueryCollator:
    """Training groups → ``query_*`` token tensors and ``positives`` ``[B, M]`` (the rows of each query's positives
    in the corpus matrix, padded with −1). Deterministic: every positive of every query is used."""

    def __init__(self, tokenizer, rows: Mapping[str, int], query_max_len: int, query_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.rows = rows
        self.query_max_len = query_max_len
        self.prompt = query_prompt or ""

    def __call__(self, groups: Sequence["TrainingGroup"], generator: torch.Generator | None = None
                 ) -> dict[str, torch.Tensor]:
        positives = [[self.rows[doc_id] for doc_id in group.positives] for group in groups]
        width = max(len(row) for row in positives)
        batch = {"positives": torch.tensor([row + [-1] * (width - len(row)) for row in positives], dtype=torch.long)}
        encoded = self.tokenizer([self.prompt + group.query for group in groups], padding=True, truncation=True,
                                 max_length=self.query_max_len, return_tensors="pt")
        batch.update({f"query_{key}": encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids")
                      if key in encoded})
        return batch


def check_rows(groups: Any, rows: Mapping[str, int], where: Path) -> None:
    """Every positive of the training groups (a :class:`~pretrieve.data.arrow.GroupsDataset`, read by column) has a
    corpus vector: the groups were checked against the corpus the index was encoded from, so a miss means the two
    disagree."""
    for doc_id in pc.unique(pc.list_flatten(groups.dataset.data.column("positives"))).to_pylist():
        if doc_id not in rows:
            raise InputError(f"positive '{doc_id}' of the training groups has no vector in the corpus index",
                             path=where)


def copy_passage_tower(base: "Retriever", directory: Path) -> None:
    """Replace the passage tower's files of the model saved in ``directory`` by the base model's, byte for byte
    (the tower did not change, so neither do its vectors), and check that the two are now the same input."""
    source = base.passage_files
    target = directory / TOWER_FOLDERS["passage"]
    for name in tower_files(target):
        if name not in source.names:
            (target / name).unlink()
    for name in source.names:
        shutil.copyfile(source.root / name, target / name)
    copied = artifacts.FileSet(target, source.names)
    if artifacts.fingerprint(copied) != artifacts.fingerprint(source):   # pragma: no cover - a failed copy
        raise InputError("the passage tower was not copied intact", path=target)

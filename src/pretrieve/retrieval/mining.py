"""Hard-negative mining: training groups from a retriever's top-K minus the judged positives.

* :func:`bm25_negatives` — stage 1 of the fine-tuning pipeline (CDMAE, Li et al. 2023, §3.4): BM25's top-K₁ (1000)
  for every training query, minus its positives.
* :func:`mine_negatives` — stages 2 and 3: the fine-tuned dense retriever's top-K₂/K₃ (200), minus positives
  (``pretrieve mine``). The corpus and the queries are encoded with :class:`DenseEncoder` (from the
  sentence-transformers files of the exported model; a model with separate towers is read from its ``query/``
  and ``passage/`` folders) and searched exactly with FAISS. Models fine-tuned with the DupMAE, sparse or
  hybrid representation are searched as they were trained (:func:`dense_search`).

Negatives keep the retriever's rank order (the groups file lists them best first); only documents within
the top ``depth`` are used, and every document judged relevant (grade ≥ 1) is removed — the top-ranked
unjudged documents stay, false negatives included, as in the papers (stage 3's teacher is what softens them).
Queries without positives or without any negative left are skipped and counted
(:func:`pretrieve.data.groups.groups_from_run`).

Outputs are written atomically with a sidecar ``<file>.meta.json`` saying what produced them; a call whose
output exists with the same settings (and the same model weights) returns it without recomputing, so a
recipe can be re-run and resumed stage by stage.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Mapping

from pretrieve.data.beir import BeirCollection
from pretrieve.data.groups import GroupSet, groups_from_run, write_groups
from pretrieve.data.trec import Run, write_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json
from pretrieve.provenance import provenance

logger = logging.getLogger(__name__)

META_SUFFIX = ".meta.json"


# ----------------------------------------------------------------------------------- stage outputs
def meta_path(output: str | Path) -> Path:
    """The sidecar describing how ``output`` was produced: ``<output>.meta.json``."""
    output = Path(output)
    return output.with_name(output.name + META_SUFFIX)


def output_is_current(output: str | Path, settings: Mapping[str, Any]) -> bool:
    """Whether ``output`` exists and its sidecar records exactly ``settings`` (then the work can be skipped)."""
    output, sidecar = Path(output), meta_path(output)
    if not output.exists() or not sidecar.exists():
        return False
    try:
        recorded = json.loads(sidecar.read_text(encoding="utf-8")).get("settings")
    except json.JSONDecodeError:
        return False
    current = json.loads(json.dumps(dict(settings), default=str))
    if recorded != current:
        differing = sorted(key for key in set(recorded or {}) | set(current)
                           if (recorded or {}).get(key) != current.get(key))
        logger.info("recomputing %s: settings differ in %s", output, ", ".join(differing))
        return False
    return True


def write_output_meta(output: str | Path, settings: Mapping[str, Any], **extra: Any) -> None:
    """Write the sidecar of ``output`` (after the output itself, so a sidecar implies a complete output)."""
    write_json(meta_path(output), {"settings": dict(settings), **extra, "provenance": provenance()})


def collection_of(data: str | Path | BeirCollection) -> BeirCollection:
    return data if isinstance(data, BeirCollection) else BeirCollection(Path(data))


def _check_depth(depth: int) -> None:
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")


def write_mined_groups(run: Run, collection: BeirCollection, split: str, depth: int, out_groups: str | Path,
                       settings: Mapping[str, Any], run_out: str | Path | None = None) -> GroupSet:
    """Groups of top-``depth`` minus positives from ``run`` → ``out_groups`` (+ sidecar, + the run if asked)."""
    queries = collection.load_queries(split)
    groups = groups_from_run(run, collection.load_qrels(split), queries, depth=depth)
    if not groups.groups:
        raise InputError(f"no training group could be built from split '{split}' ({groups.stats.problems()})",
                         path=collection.root)
    if run_out is not None:
        write_run(run, run_out, tag=str(settings.get("retriever", "pretrieve")), depth=depth)
    write_groups(groups, out_groups)
    write_output_meta(out_groups, settings, stats=groups.stats.as_dict())
    logger.info("wrote %d groups to %s (%s)", len(groups), out_groups, groups.stats.as_dict())
    return groups


# ------------------------------------------------------------------------------------------- BM25
def bm25_negatives(data: str | Path | BeirCollection, split: str, out_groups: str | Path, depth: int = 1000,
                   k1: float = 0.9, b: float = 0.4, run_out: str | Path | None = None,
                   overwrite: bool = False) -> Path:
    """Stage-1 groups: BM25 (Pyserini defaults) top-``depth`` of each ``split`` query minus its positives."""
    from pretrieve.retrieval.bm25 import BM25Index

    _check_depth(depth)
    collection = collection_of(data)
    settings = {"retriever": "bm25", "collection": str(collection.root.resolve()), "split": split, "depth": depth,
                "k1": k1, "b": b}
    if not overwrite and output_is_current(out_groups, settings):
        logger.info("BM25 groups in %s are up to date; not recomputing", out_groups)
        return Path(out_groups)
    queries = collection.load_queries(split)
    index = BM25Index.build(collection.load_corpus(), k1=k1, b=b)
    run = index.search(queries, k=depth)
    write_mined_groups(run, collection, split, depth, out_groups, settings, run_out=run_out)
    return Path(out_groups)


# ------------------------------------------------------------------------------------------ dense
def load_retriever_encoders(model_dir: str | Path, device: str = "auto", max_length: int | None = None):
    """``(query_encoder, passage_encoder)`` :class:`DenseEncoder`\\ s of a fine-tuned (or any) dense model.

    A pretrieve dual encoder with separate towers has them in ``query/`` and ``passage/``; anything else
    (siamese export, plain sentence-transformers or Hugging Face checkpoint) is one encoder for both sides —
    for a CoT-MoTE checkpoint, two views of it routed to its query and passage experts.
    """
    import copy

    from pretrieve.modeling.mote import is_mote_checkpoint, routed_views
    from pretrieve.retrieval.encoder import DenseEncoder

    root = Path(str(model_dir))
    config = _dual_encoder_config(root)
    if config is not None and not config.get("tied", True):
        query = DenseEncoder.load(root / "query", max_length=max_length, device=device)
        passage = DenseEncoder.load(root / "passage", max_length=max_length, device=device)
        return query, passage
    encoder = DenseEncoder.load(model_dir, max_length=max_length, device=device)
    if is_mote_checkpoint(root):  # CoT-MoTE: one set of weights, queries through Q-FFN, passages through P-FFN
        query, passage = copy.copy(encoder), copy.copy(encoder)
        query.model, passage.model = (view.eval() for view in routed_views(encoder.model, root))
        return query, passage
    return encoder, encoder


def _dual_encoder_config(root: Path) -> dict[str, Any] | None:
    path = root / "dual_encoder.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=path, line=exc.lineno) from None


def trained_query_max_length(model_dir: str | Path) -> int | None:
    """The query length a pretrieve-fine-tuned model was trained with (``dual_encoder.json``), if recorded."""
    config = _dual_encoder_config(Path(str(model_dir)))
    value = ((config or {}).get("training") or {}).get("query_max_len")
    return int(value) if value else None


def dense_search(model_dir: str | Path, corpus, queries: Mapping[str, str], k: int, cache_dir: str | Path | None = None,
                 batch_size: int = 64, max_length: int | None = None, query_max_length: int | None = None,
                 device: str = "auto", bf16: bool = False, show_progress: bool = True, mode: str | None = None) -> Run:
    """Exact top-``k`` of ``queries`` over ``corpus`` with the model's query and passage encoders, searched the
    way the model was trained.

    Corpus encodings are cached in ``cache_dir`` when given (reused by later calls with the same model).
    A model fine-tuned with the DupMAE representation (its ``dual_encoder.json``) is searched by
    :func:`pretrieve.retrieval.hybrid.dupmae_search` (FAISS + sparse index, exact eq. 12); one fine-tuned with
    the ``sparse`` or ``hybrid`` representation by :func:`pretrieve.retrieval.sparse_search.sparse_search`,
    in ``mode`` ``dense`` / ``sparse`` / ``hybrid`` / ``rrf`` (default: its representation). Other models are
    dense: ``mode`` may only be None or ``"dense"`` for them.
    """
    import contextlib
    import tempfile

    from pretrieve.retrieval.encode import encode_corpus, encode_queries
    from pretrieve.retrieval.faiss_search import search_shards
    from pretrieve.retrieval.hybrid import dupmae_search, is_dupmae_model
    from pretrieve.retrieval.sparse_search import SEARCH_MODES, is_sparse_model, representation_kind, sparse_search

    if is_sparse_model(model_dir):
        return sparse_search(model_dir, corpus, queries, k, mode=mode, cache_dir=cache_dir, batch_size=batch_size,
                             max_length=max_length, query_max_length=query_max_length, device=device, bf16=bf16,
                             show_progress=show_progress)
    if mode is not None:
        kind = representation_kind(model_dir)
        if mode not in SEARCH_MODES:
            raise ConfigError(f"unknown search mode '{mode}' (choose from {', '.join(SEARCH_MODES)})")
        if mode != "dense" or kind not in (None, "dense"):
            raise ConfigError(f"search mode '{mode}' needs a model fine-tuned with the sparse or hybrid "
                              f"representation; {model_dir} has the '{kind or 'dense'}' representation, which is "
                              "searched only as trained")
    if is_dupmae_model(model_dir):
        return dupmae_search(model_dir, corpus, queries, k, cache_dir=cache_dir, batch_size=batch_size,
                             max_length=max_length, query_max_length=query_max_length, device=device, bf16=bf16,
                             show_progress=show_progress)

    query_encoder, passage_encoder = load_retriever_encoders(model_dir, device=device, max_length=max_length)
    query_max_length = query_max_length or trained_query_max_length(model_dir)
    with contextlib.ExitStack() as stack:
        emb_dir = Path(cache_dir) if cache_dir is not None else Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="pretrieve-mine-")))
        shard = encode_corpus(passage_encoder, corpus, emb_dir, batch_size=batch_size, max_length=max_length,
                              bf16=bf16, show_progress=show_progress)
        query_ids, query_emb = encode_queries(query_encoder, queries, batch_size=batch_size,
                                              max_length=query_max_length, bf16=bf16, show_progress=show_progress)
        return search_shards(query_emb, query_ids, [shard], k=k)


def mine_negatives(model_dir: str | Path, data: str | Path | BeirCollection, split: str, out_groups: str | Path,
                   depth: int = 200, batch_size: int = 64, max_length: int | None = None,
                   query_max_length: int | None = None, cache_dir: str | Path | None = None,
                   run_out: str | Path | None = None, device: str = "auto", bf16: bool = False,
                   show_progress: bool = True, overwrite: bool = False) -> Path:
    """Stage-2/3 groups: the dense retriever's top-``depth`` of each ``split`` query minus its positives.

    ``max_length`` / ``query_max_length`` default to the model's passage length (its sentence-transformers
    ``max_seq_length``) and the query length it was fine-tuned with. Returns ``out_groups``.
    """
    from pretrieve.retrieval.encode import model_fingerprint

    _check_depth(depth)
    collection = collection_of(data)
    settings = {"retriever": "dense", "model": str(Path(str(model_dir)).resolve()),
                "model_fingerprint": model_fingerprint(str(model_dir)), "collection": str(collection.root.resolve()),
                "split": split, "depth": depth, "max_length": max_length, "query_max_length": query_max_length,
                "bf16": bf16}
    if not overwrite and output_is_current(out_groups, settings):
        logger.info("mined groups in %s are up to date; not recomputing", out_groups)
        return Path(out_groups)
    queries = collection.load_queries(split)
    run = dense_search(model_dir, collection.load_corpus(), queries, k=depth, cache_dir=cache_dir,
                       batch_size=batch_size, max_length=max_length, query_max_length=query_max_length,
                       device=device, bf16=bf16, show_progress=show_progress)
    write_mined_groups(run, collection, split, depth, out_groups, settings, run_out=run_out)
    return Path(out_groups)

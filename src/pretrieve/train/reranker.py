"""The cross-encoder reranker: training on groups, re-ranking runs, teacher scores for stage 3.

* :func:`train_reranker` — listwise cross-entropy over each query's group (positive + ``num_negatives`` hard
  negatives, no in-batch negatives; paper 003 §3.4) on the shared loop (:mod:`pretrieve.train.loop`); the
  model is exported to ``<out>/final`` (``AutoModelForSequenceClassification`` + tokenizer).
* :func:`rerank` / :func:`rerank_run_file` — score the top-``depth`` of every query of a run and order them by
  the cross-encoder (``pretrieve reranker score``); documents below ``depth`` are dropped from the output.
* :func:`teacher_groups` — the stage-3 input: every positive and negative of each mined group scored by the
  reranker, written as a groups file with ``positive_scores`` / ``negative_scores`` (``pretrieve reranker
  teacher``). Equivalently, a re-ranked run that covers the positives can be turned into such groups with
  :func:`pretrieve.data.groups.groups_from_run` (``scores_from_run=``); scoring the groups directly also
  covers positives the retriever did not rank in its top-K₃, which the teacher must score too.

Inputs are ``[CLS] query [SEP] title + " " + text [SEP]`` cut to ``max_len`` tokens (longest side first, which
cuts the passage for any usual query). Defaults: lr 3e-5 (SimLM's reranker scripts, ELECTRA-base), 7 negatives
per query (group 8), batch 16 queries, 1 epoch, ``max_len`` 192.

Scoring sorts the pairs by length and batches them under ``torch.inference_mode``; re-ranked runs and teacher
groups are written atomically with a ``.meta.json`` sidecar, and a call whose output is current is skipped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from pretrieve.data.beir import BeirCollection, Corpus
from pretrieve.data.groups import GroupSet, TrainingGroup, read_groups, sample_group_indices, write_groups
from pretrieve.data.trec import Run, ranked_ids, read_run, write_run
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json
from pretrieve.train.loop import LoopConfig, make_accelerator, read_logs, train

logger = logging.getLogger(__name__)

CONFIG_FILE = "reranker_config.json"


def _help(text: str) -> Any:
    return {"help": text}


@dataclass
class RerankerConfig(LoopConfig):
    """Cross-encoder training: model, groups and loop settings."""

    model: str = field(default="", metadata=_help("Encoder to initialise the cross-encoder from."))
    data: str = field(default="", metadata=_help("Collection in BEIR layout (passage texts)."))
    groups: str = field(default="", metadata=_help("Training groups JSONL (e.g. from `pretrieve mine`)."))
    out: str = field(default="", metadata=_help("Output directory (checkpoints, logs, final/)."))
    num_negatives: int = field(default=7, metadata=_help("Hard negatives per query per step."))
    max_len: int = field(default=192, metadata=_help("Token limit of a (query, passage) pair."))
    max_groups: int | None = field(default=None, metadata=_help("Train on the first N groups only."))
    on_unknown: str = field(default="error", metadata=_help("Unknown document ids: error | skip."))
    batch_size: int = field(default=16, metadata=_help("Queries per optimizer step."))
    lr: float = field(default=3e-5, metadata=_help("Peak learning rate."))
    epochs: float = field(default=1.0, metadata=_help("Epochs when max_steps is 0."))

    def loop(self) -> LoopConfig:
        return LoopConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LoopConfig)})

    def check(self) -> None:
        missing = [name for name in ("model", "data", "groups", "out") if not getattr(self, name)]
        if missing:
            raise ConfigError(f"missing required option(s): {', '.join('--' + m for m in missing)}")
        if self.num_negatives < 1:
            raise ConfigError("the listwise loss needs negatives: num_negatives must be >= 1, "
                              f"got {self.num_negatives}")
        if self.max_len < 4:
            raise ConfigError(f"max_len must be >= 4, got {self.max_len}")
        if self.on_unknown not in ("error", "skip"):
            raise ConfigError(f"on_unknown must be 'error' or 'skip', got {self.on_unknown!r}")




# ------------------------------------------------------------------------------------------- batches
def tokenize_pairs(tokenizer, queries: Sequence[str], passages: Sequence[str], max_len: int,
                   padding: bool = True) -> dict[str, Any]:
    """``[CLS] q [SEP] p [SEP]`` encodings of parallel lists (tensors when ``padding``, else lists)."""
    return tokenizer(list(queries), list(passages), truncation="longest_first", max_length=max_len,
                     padding=padding, return_tensors="pt" if padding else None)


class PairGroupCollator:
    """Groups → ``[B·G]`` (query, passage) pairs, each group positive first, + ``group_size``."""

    def __init__(self, tokenizer, corpus: Corpus, num_negatives: int, max_len: int = 192):
        self.tokenizer = tokenizer
        self.corpus = corpus
        self.num_negatives = num_negatives
        self.max_len = max_len

    def __call__(self, groups: Sequence[TrainingGroup],
                 generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator).item()))
        queries: list[str] = []
        passages: list[str] = []
        for group in groups:
            positive, negatives = sample_group_indices(group, self.num_negatives, rng)
            for doc_id in [group.positives[positive]] + [group.negatives[i] for i in negatives]:
                queries.append(group.query)
                passages.append(self.corpus.full_text(self.corpus.row(doc_id)))
        encoded = tokenize_pairs(self.tokenizer, queries, passages, self.max_len)
        batch = {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded}
        batch["group_size"] = torch.tensor(1 + self.num_negatives)
        return batch


# ------------------------------------------------------------------------------------------ training
def train_reranker(config: RerankerConfig) -> Path:
    """Train (resume, or skip when finished with the same settings) a reranker; returns ``<out>/final``."""
    from transformers import AutoTokenizer

    from pretrieve.models import resolve_model
    from pretrieve.modeling.cross_encoder import CrossEncoder
    from pretrieve.train.finetuner import input_fingerprints
    from pretrieve.train.loop import BOOKKEEPING, finished_run

    config.check()
    model_path = resolve_model(config.model)
    out = Path(config.out)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in BOOKKEEPING}
    settings["inputs"] = input_fingerprints(model_path, config.groups)
    done = finished_run(out, settings, CONFIG_FILE, marker="config.json")
    if done is not None:
        logger.info("%s is complete with the same settings; not training again", done)
        return done
    accelerator = make_accelerator(config)
    config.validate(accelerator.num_processes)
    corpus = BeirCollection(Path(config.data)).load_corpus()
    if not Path(config.groups).exists():
        raise InputError("training groups file not found", path=config.groups)
    groups = read_groups(config.groups, corpus=corpus, on_unknown=config.on_unknown)
    kept = [g for g in groups if g.negatives]
    if len(kept) < len(groups):
        logger.warning("%s: skipped %d groups without negatives", config.groups, len(groups) - len(kept))
    if config.max_groups is not None:
        kept = kept[:config.max_groups]
    if not kept:
        raise InputError("no training group with negatives", path=config.groups)
    dataset = GroupSet(kept, groups.stats, path=str(config.groups))
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / CONFIG_FILE, {"settings": settings})

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(config.seed)
    model = CrossEncoder.from_pretrained(model_path)
    collator = PairGroupCollator(tokenizer, corpus, config.num_negatives, config.max_len)

    def export(unwrapped, directory: Path) -> None:
        unwrapped.save(directory)
        tokenizer.save_pretrained(str(directory))
        write_json(directory / CONFIG_FILE, {"settings": settings, "groups_stats": groups.stats.as_dict()})

    final = train(model, dataset, collator, config.loop(), out, export, {"config": settings},
                  accelerator=accelerator, description="train reranker")
    if accelerator.is_main_process:
        warn_if_not_learning(read_logs(out), 1 + config.num_negatives, out)
    return final


def warn_if_not_learning(logs: Sequence[Mapping[str, float]], group_size: int, out: Path,
                         tolerance: float = 0.05) -> bool:
    """Warn (and return True) when the last logged loss is still within ``tolerance`` of ``ln(G)``.

    ``ln(G)`` is the listwise loss of a scorer that gives every pair of a group the same score: a reranker
    ending there ranks by noise and would make re-ranked runs and stage-3 teacher scores worse than the
    retriever's. A freshly created classification head starts there (its logits are ~0.02 apart), so small
    budgets at small learning rates can end before training leaves the plateau.
    """
    losses = [entry["loss"] for entry in logs if "loss" in entry]
    if not losses or group_size < 2:
        return False
    chance = float(np.log(group_size))
    if losses[-1] < (1.0 - tolerance) * chance:
        return False
    logger.warning("%s: the reranker's last loss %.4f is at chance level (ln %d = %.4f): it has not learned to "
                   "rank; train longer or with a larger learning rate (e.g. --lr 3e-4 for a small model)",
                   out, losses[-1], group_size, chance)
    return True


def build_reranker_config(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                          resume: bool = False) -> RerankerConfig:
    from pretrieve.train.run_config import check_keys, merge

    values = merge(file_values, flags)
    check_keys(values, {f.name for f in dataclasses.fields(RerankerConfig)}, "reranker config")
    values["resume"] = resume or bool(values.get("resume", False))
    try:
        config = RerankerConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"reranker config: {exc}") from None
    config.check()
    return config


# ------------------------------------------------------------------------------------------- scoring
class PairScorer:
    """A trained cross-encoder + tokenizer that scores (query, passage) pairs in length-sorted batches."""

    def __init__(self, model_dir: str | Path, device: str = "auto", max_len: int | None = None, batch_size: int = 64):
        from transformers import AutoTokenizer

        from pretrieve.modeling.cross_encoder import CrossEncoder
        from pretrieve.retrieval.load import resolve_device

        if batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {batch_size}")
        self.device = resolve_device(device)
        self.model = CrossEncoder.load(model_dir).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_len = max_len or _trained_max_len(model_dir) or 192
        self.batch_size = batch_size

    def score(self, queries: Sequence[str], passages: Sequence[str], show_progress: bool = True,
              description: str = "rerank") -> np.ndarray:
        """float32 scores of the pairs ``(queries[i], passages[i])``, in input order."""
        from tqdm.auto import tqdm

        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
        encoded = tokenize_pairs(self.tokenizer, queries, passages, self.max_len, padding=False)
        order = sorted(range(len(queries)), key=lambda i: -len(encoded["input_ids"][i]))
        scores = np.empty(len(queries), dtype=np.float32)
        keys = [key for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded]
        with tqdm(total=len(order), desc=description, unit="pairs", disable=not show_progress) as progress:
            for start in range(0, len(order), self.batch_size):
                rows = order[start:start + self.batch_size]
                features = [{key: encoded[key][i] for key in keys} for i in rows]
                batch = self.tokenizer.pad(features, return_tensors="pt")
                batch = {key: batch[key].to(self.device) for key in keys}
                with torch.inference_mode():
                    values = self.model.score(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
                scores[np.asarray(rows)] = values.float().cpu().numpy()
                progress.update(len(rows))
        return scores


def _trained_max_len(model_dir: str | Path) -> int | None:
    import json

    path = Path(str(model_dir)) / CONFIG_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8")).get("settings", {}).get("max_len")


def score_candidates(scorer: PairScorer, corpus: Corpus, queries: Mapping[str, str],
                     candidates: Mapping[str, Sequence[str]], show_progress: bool = True) -> Run:
    """``{qid: {doc_id: cross-encoder score}}`` for every candidate document of every query."""
    pairs = [(qid, doc_id) for qid, docs in candidates.items() for doc_id in docs]
    missing = next((doc_id for _, doc_id in pairs if doc_id not in corpus), None)
    if missing is not None:
        raise InputError(f"document '{missing}' is not in the corpus", path=corpus.path)
    scores = scorer.score([queries[qid] for qid, _ in pairs], [corpus.full_text(corpus.row(d)) for _, d in pairs],
                          show_progress=show_progress)
    run: Run = {qid: {} for qid in candidates}
    for (qid, doc_id), value in zip(pairs, scores.tolist()):
        run[qid][doc_id] = float(value)
    return run


def rerank(scorer: PairScorer, corpus: Corpus, queries: Mapping[str, str], run: Run, depth: int = 200,
           show_progress: bool = True) -> Run:
    """The top-``depth`` of each query of ``run`` (that has a text in ``queries``) re-scored by the reranker."""
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    unknown = [qid for qid in run if qid not in queries]
    if unknown:
        logger.warning("%d run queries have no text (e.g. '%s'); they are left out", len(unknown), unknown[0])
    candidates = {qid: ranked_ids(run, qid)[:depth] for qid in run if qid in queries}
    return score_candidates(scorer, corpus, queries, candidates, show_progress=show_progress)


def rerank_run_file(model_dir: str | Path, data: str | Path, split: str, run_path: str | Path, out: str | Path,
                    depth: int = 200, batch_size: int = 64, max_len: int | None = None, device: str = "auto",
                    show_progress: bool = True, overwrite: bool = False) -> Path:
    """``pretrieve reranker score``: re-rank a TREC run file's top-``depth`` and write the new run."""
    from pretrieve.retrieval.load import model_fingerprint
    from pretrieve.retrieval.mining import output_is_current, write_output_meta

    collection = BeirCollection(Path(data))
    settings = {"reranker": str(Path(str(model_dir)).resolve()), "model_fingerprint": model_fingerprint(str(model_dir)),
                "collection": str(collection.root.resolve()), "split": split, "run": str(Path(run_path).resolve()),
                "run_mtime_ns": Path(run_path).stat().st_mtime_ns if Path(run_path).exists() else None,
                "depth": depth, "max_len": max_len}
    if not overwrite and output_is_current(out, settings):
        logger.info("re-ranked run %s is up to date; not recomputing", out)
        return Path(out)
    run = read_run(run_path)
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size)
    reranked = rerank(scorer, collection.load_corpus(), collection.load_queries(split), run, depth=depth,
                      show_progress=show_progress)
    write_run(reranked, out, tag="rerank", depth=depth)
    write_output_meta(out, settings)
    return Path(out)


def teacher_groups(model_dir: str | Path, data: str | Path, groups_path: str | Path, out: str | Path,
                   max_negatives: int | None = None, batch_size: int = 64, max_len: int | None = None,
                   device: str = "auto", show_progress: bool = True, overwrite: bool = False) -> Path:
    """Stage-3 groups: the groups of ``groups_path`` (e.g. the stage-2 retriever's mined top-200 minus positives),
    their negatives cut to the first ``max_negatives`` (rank order), every positive and negative scored by the
    reranker. Returns ``out``."""
    from pretrieve.retrieval.load import model_fingerprint
    from pretrieve.retrieval.mining import output_is_current, write_output_meta

    if max_negatives is not None and max_negatives < 1:
        raise ConfigError(f"max_negatives must be >= 1, got {max_negatives}")
    collection = BeirCollection(Path(data))
    if not Path(groups_path).exists():
        raise InputError("groups file not found", path=groups_path)
    settings = {"reranker": str(Path(str(model_dir)).resolve()), "model_fingerprint": model_fingerprint(str(model_dir)),
                "collection": str(collection.root.resolve()), "groups": str(Path(groups_path).resolve()),
                "groups_mtime_ns": Path(groups_path).stat().st_mtime_ns, "max_negatives": max_negatives,
                "max_len": max_len}
    if not overwrite and output_is_current(out, settings):
        logger.info("teacher groups %s are up to date; not recomputing", out)
        return Path(out)
    corpus = collection.load_corpus()
    groups = read_groups(groups_path, corpus=corpus)
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size)
    cut = [(g, g.negatives[:max_negatives]) for g in groups]
    pairs = [(g.query, doc_id) for g, negatives in cut for doc_id in (*g.positives, *negatives)]
    scores = scorer.score([q for q, _ in pairs], [corpus.full_text(corpus.row(d)) for _, d in pairs],
                          show_progress=show_progress, description="teacher scores").tolist()
    scored: list[TrainingGroup] = []
    position = 0
    for group, negatives in cut:
        count = len(group.positives) + len(negatives)
        values = scores[position:position + count]
        position += count
        scored.append(TrainingGroup(group.query_id, group.query, group.positives, negatives,
                                    values[:len(group.positives)], values[len(group.positives):]))
    write_groups(scored, out)
    write_output_meta(out, settings, stats=groups.stats.as_dict())
    logger.info("wrote %d teacher-scored groups (%d pairs) to %s", len(scored), len(pairs), out)
    return Path(out)

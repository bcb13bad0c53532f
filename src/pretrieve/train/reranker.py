"""The cross-encoder reranker: training on groups, re-ranking runs, teacher scores for stage 3.

* :func:`train_reranker` — listwise cross-entropy over each query's group (positive + ``num_negatives`` hard
  negatives, no in-batch negatives; CDMAE (Li et al. 2023) §3.4) on the shared loop (:mod:`pretrieve.train.loop`); the
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

Scoring streams (:class:`PairScorer`): the run is read query by query and the groups file group by group, pairs
are tokenised batch by batch within a length-ordered chunk, and each query's ranking / each scored group is
written as soon as its pairs are scored, so memory is one chunk whatever the number of pairs (MS MARCO's stage 3
scores ~16M). ``precision`` ``auto`` scores in bf16 only where the hardware computes it natively (a GPU with bf16,
a CPU with AVX512-BF16/AMX), else fp32. Under several ranks (:mod:`pretrieve.ranks`) each rank scores a contiguous
slice of the run's queries / the groups and rank 0 concatenates the parts; passages are read from the memory-mapped
Arrow corpus (:class:`pretrieve.data.arrow.CorpusTexts`). Outputs are written atomically and recorded by :mod:`pretrieve.artifacts`
(settings + the model, run/groups, corpus and queries by content); a call whose output is current is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from pretrieve.data.beir import Corpus
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup, sample_group_indices
from pretrieve.data.trec import Run, ranked_ids
from pretrieve import artifacts, outputs, ranks
from pretrieve.data.arrow import CorpusTexts, groups_dataset
from pretrieve.errors import ConfigError, InputError
from pretrieve.io_utils import write_json
from pretrieve.retrieval.batches import native_bf16
from pretrieve.train.loop import LoopConfig, make_accelerator, read_logs, train
from pretrieve.train.settings import RerankerSettings

logger = logging.getLogger(__name__)

CONFIG_FILE = "reranker_config.json"
KIND = "reranker"
# Paths: the run's inputs are compared by content (artifacts.fingerprint), never by where they are.
PATH_SETTINGS = ("model", "data", "groups", "out")


@dataclass
class RerankerConfig(RerankerSettings, LoopConfig):
    """Cross-encoder training: model, groups and loop settings."""

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

    def __init__(self, tokenizer, corpus: "Corpus | CorpusTexts", num_negatives: int, max_len: int = 192):
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
        ids: list[str] = []
        for group in groups:
            positive, negatives = sample_group_indices(group, self.num_negatives, rng)
            for doc_id in [group.positives[positive]] + [group.negatives[i] for i in negatives]:
                queries.append(group.query)
                ids.append(doc_id)
        passages = self.corpus.texts_of(ids)
        encoded = tokenize_pairs(self.tokenizer, queries, passages, self.max_len)
        batch = {key: encoded[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in encoded}
        batch["group_size"] = torch.tensor(1 + self.num_negatives)
        return batch


# ------------------------------------------------------------------------------------------ training
def train_reranker(config: RerankerConfig) -> Path:
    """Train (resume, or skip when finished with the same settings) a reranker; returns ``<out>/final``.

    The output directory is checked and locked first (:func:`pretrieve.outputs.writing`)."""
    config.check()
    needed, largest = outputs.training_space(config.model, config.keep_checkpoints)
    with outputs.writing(config.out, needed_bytes=needed, largest_file=largest):
        return _train_reranker(config)


def _train_reranker(config: RerankerConfig) -> Path:
    from transformers import AutoTokenizer

    from pretrieve.models import resolve_model
    from pretrieve.modeling.cross_encoder import CrossEncoder
    from pretrieve.train.loop import BOOKKEEPING, check_restart, finished_run, run_inputs

    model_path = resolve_model(config.model)
    out = Path(config.out)
    if not Path(config.groups).exists():
        raise InputError("training groups file not found", path=config.groups)
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in BOOKKEEPING and k not in PATH_SETTINGS}
    inputs, named = run_inputs(model=model_path, corpus=BeirCollection(Path(config.data)).corpus_path,
                               groups=config.groups)
    settings |= named
    done = None if config.overwrite else finished_run(out, KIND, settings, inputs)
    if done is not None:
        logger.info("%s is complete with the same settings; not training again", done)
        return done
    check_restart(out, config, files=(CONFIG_FILE,))
    fingerprints = {name: artifacts.fingerprint(path) for name, path in inputs.items()}
    accelerator = make_accelerator(config)
    config.validate(accelerator.num_processes)
    # Corpus and groups as memory-mapped Arrow datasets (built by rank 0, then opened by every rank): memory does
    # not grow with the number of passages or groups.
    corpus_data = ranks.built_once(BeirCollection(Path(config.data)).corpus_dataset)
    groups = ranks.built_once(lambda: groups_dataset(config.groups, corpus=corpus_data, on_unknown=config.on_unknown),
                        "read the training groups")
    groups = groups.trainable(need_negatives=True, max_groups=config.max_groups)
    corpus = CorpusTexts(corpus_data)
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

    final = train(model, groups, collator, config.loop(), out, export, {"config": settings | {"inputs": fingerprints}},
                  accelerator=accelerator, description="train reranker",
                  record={"kind": KIND, "settings": settings, "inputs": inputs})
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
                          resume: bool = False, where: str = "reranker config") -> RerankerConfig:
    """A :class:`RerankerConfig` from a config file's values overridden by the given flags (validated and coerced
    by :mod:`pretrieve.options`)."""
    from pretrieve.options import build
    from pretrieve.train.run_config import validated_values

    values = validated_values(RerankerConfig, file_values, flags, where)
    values["resume"] = resume or bool(values.get("resume", False))
    config = build(RerankerConfig, values)
    config.check()
    return config


# ------------------------------------------------------------------------------------------- scoring
PRECISIONS = ("auto", "fp32", "bf16")
#: Pairs whose texts are ordered by length together before they are cut into batches (the sorting window).
CHUNK_BATCHES = 32


def resolve_precision(precision: str, device) -> str:
    """``fp32`` or ``bf16``: ``auto`` is bf16 only where the hardware computes it natively
    (:func:`pretrieve.retrieval.batches.native_bf16`, the one capability check of encoders and cross-encoders)."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got '{precision}'")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


class PairScorer:
    """A trained cross-encoder + tokenizer that scores (query, passage) pairs batch by batch.

    Pairs are handled in chunks of ``CHUNK_BATCHES`` batches: a chunk is ordered by text length (so a batch pads
    little), each batch is tokenised (padding by the tokenizer) and scored under ``torch.inference_mode`` (and
    bf16 autocast when the resolved ``precision`` is bf16), then the scores are put back in input order. Memory
    is one chunk, whatever the number of pairs.
    """

    def __init__(self, model_dir: str | Path, device: str = "auto", max_len: int | None = None, batch_size: int = 64,
                 precision: str = "auto"):
        from transformers import AutoTokenizer

        from pretrieve.modeling.cross_encoder import CrossEncoder
        from pretrieve.retrieval.batches import resolve_device

        if batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {batch_size}")
        self.device = resolve_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.model = CrossEncoder.load(model_dir).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_len = max_len or trained_max_len(model_dir)
        self.batch_size = batch_size
        self.chunk_pairs = batch_size * CHUNK_BATCHES

    def score(self, queries: Sequence[str], passages: Sequence[str], show_progress: bool = True,
              description: str = "rerank") -> np.ndarray:
        """float32 scores of the pairs ``(queries[i], passages[i])``, in input order."""
        from tqdm.auto import tqdm

        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
        scores = np.empty(len(queries), dtype=np.float32)
        with tqdm(total=len(queries), desc=description, unit="pairs", disable=not show_progress) as progress:
            for start in range(0, len(queries), self.chunk_pairs):
                end = min(start + self.chunk_pairs, len(queries))
                scores[start:end] = self.score_chunk(queries[start:end], passages[start:end])
                progress.update(end - start)
        return scores

    def score_chunk(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """Scores of one chunk of pairs (any size; callers keep it near :attr:`chunk_pairs`), in input order."""
        import contextlib

        import torch

        order = sorted(range(len(queries)), key=lambda i: -(len(queries[i]) + len(passages[i])))
        scores = np.empty(len(queries), dtype=np.float32)
        autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16) if self.precision == "bf16"
                    else contextlib.nullcontext())
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            batch = tokenize_pairs(self.tokenizer, [queries[i] for i in rows], [passages[i] for i in rows],
                                   self.max_len)
            batch = {key: value.to(self.device) for key, value in batch.items()}
            with torch.inference_mode(), autocast:
                values = self.model.score(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
            scores[rows] = values.float().cpu().numpy()
        return scores


def trained_max_len(model_dir: str | Path) -> int:
    """The pair length a reranker was trained with (its ``reranker_config.json``), else 192."""
    import json

    path = Path(str(model_dir)) / CONFIG_FILE
    if path.exists():
        value = json.loads(path.read_text(encoding="utf-8")).get("settings", {}).get("max_len")
        if value:
            return int(value)
    return 192


def score_candidates(scorer: PairScorer, corpus: "Corpus | CorpusTexts", queries: Mapping[str, str],
                     candidates: Mapping[str, Sequence[str]], show_progress: bool = True) -> Run:
    """``{qid: {doc_id: cross-encoder score}}`` for every candidate document of every query (in memory)."""
    pairs = [(qid, doc_id) for qid, docs in candidates.items() for doc_id in docs]
    _check_known(corpus, (doc_id for _, doc_id in pairs), getattr(corpus, "path", None))
    scores = scorer.score([queries[qid] for qid, _ in pairs], corpus.texts_of([d for _, d in pairs]),
                          show_progress=show_progress)
    run: Run = {qid: {} for qid in candidates}
    for (qid, doc_id), value in zip(pairs, scores.tolist()):
        run[qid][doc_id] = float(value)
    return run


def _check_known(corpus: "Corpus | CorpusTexts", doc_ids: Iterable[str], source: str | Path | None) -> None:
    doc_ids = list(doc_ids)
    absent = corpus.missing(doc_ids) if hasattr(corpus, "missing") else {d for d in doc_ids if d not in corpus}
    missing = next((doc_id for doc_id in doc_ids if doc_id in absent), None)
    if missing is not None:
        raise InputError(f"document '{missing}' is not in the corpus", path=source)


def rerank(scorer: PairScorer, corpus: "Corpus | CorpusTexts", queries: Mapping[str, str], run: Run, depth: int = 200,
           show_progress: bool = True) -> Run:
    """The top-``depth`` of each query of ``run`` (that has a text in ``queries``) re-scored by the reranker."""
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    unknown = [qid for qid in run if qid not in queries]
    if unknown:
        logger.warning("%d run queries have no text (e.g. '%s'); they are left out", len(unknown), unknown[0])
    candidates = {qid: ranked_ids(run, qid)[:depth] for qid in run if qid in queries}
    return score_candidates(scorer, corpus, queries, candidates, show_progress=show_progress)


def _chunks_of_items(items: Iterable[Any], size_of, limit: int) -> Iterator[list[Any]]:
    """Consecutive lists of ``items`` whose summed ``size_of`` reaches ``limit`` (the last may be smaller)."""
    chunk: list[Any] = []
    total = 0
    for item in items:
        chunk.append(item)
        total += size_of(item)
        if total >= limit:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


def rerank_run_file(model_dir: str | Path, data: str | Path, split: str, run_path: str | Path, out: str | Path,
                    depth: int = 200, batch_size: int = 64, max_len: int | None = None, device: str = "auto",
                    show_progress: bool = True, overwrite: bool = False, precision: str = "auto") -> Path:
    """``pretrieve reranker score``: re-rank the top-``depth`` of each query of a TREC run file and write the new run.

    The run is read query by query (its lines grouped by query, as TREC runs are) and each query's new ranking is
    written as soon as its pairs are scored, so memory does not grow with the run. A current output (same
    settings, same model, run, corpus and queries) is kept unless ``overwrite``.
    """
    from tqdm.auto import tqdm

    from pretrieve.data.trec import RunWriter, iter_run
    from pretrieve.retrieval.batches import resolve_device

    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    collection = BeirCollection(Path(data))
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(Path(out).parent, depth=0)
    if not Path(run_path).exists():
        raise InputError("run file not found", path=run_path)
    resolved = resolve_precision(precision, resolve_device(device))
    settings = {"split": split, "depth": depth, "max_len": max_len or trained_max_len(model_dir),
                "precision": resolved}
    inputs = {"model": model_dir, "run": run_path, "corpus": collection.corpus_path,
              "queries": collection.queries_path}
    status = artifacts.check(out, settings, inputs, kind="run")
    if ranks.broadcast(status.current and not overwrite, "check the re-ranked run"):
        logger.info("re-ranked run %s is up to date; not recomputing", out)
        return Path(out)
    if status.exists:
        logger.info("recomputing %s: %s", out, status.reason)
    queries = collection.load_queries(split)
    corpus = CorpusTexts(ranks.built_once(collection.corpus_dataset))
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size, precision=resolved)

    def count() -> int:
        return sum(1 for _ in iter_run(run_path))

    def write_part(start: int, end: int, paths: list[Path]) -> list[str]:
        unknown: list[str] = []

        def known_queries() -> Iterator[tuple[str, list[str]]]:
            for position, (qid, docs) in enumerate(iter_run(run_path)):
                if position < start or position >= end:
                    continue
                if qid not in queries:
                    unknown.append(qid)
                    continue
                top = sorted(docs, key=lambda doc_id: -docs[doc_id])[:depth]
                _check_known(corpus, top, run_path)
                yield qid, top

        with open(paths[0], "w", encoding="utf-8") as handle, \
                tqdm(desc="rerank", unit="queries", disable=not show_progress) as progress:
            writer = RunWriter(handle, out, tag="rerank", depth=depth)
            for chunk in _chunks_of_items(known_queries(), lambda item: len(item[1]), scorer.chunk_pairs):
                passages = corpus.texts_of([doc_id for _, top in chunk for doc_id in top])
                texts = [queries[qid] for qid, top in chunk for _ in top]
                scores = scorer.score_chunk(texts, passages).tolist()
                position = 0
                for qid, top in chunk:
                    writer.write(qid, list(zip(top, scores[position:position + len(top)])))
                    position += len(top)
                progress.update(len(chunk))
        return unknown

    unknown = [qid for part in ranks.split_files([(Path(out), "run", settings, inputs)], count, write_part,
                                                 "rerank") for qid in part]
    if unknown:
        logger.warning("%d run queries have no text in split '%s' (e.g. '%s'); they are left out", len(unknown),
                       split, unknown[0])
    return Path(out)


def teacher_groups(model_dir: str | Path, data: str | Path, groups_path: str | Path, out: str | Path,
                   max_negatives: int | None = None, batch_size: int = 64, max_len: int | None = None,
                   device: str = "auto", show_progress: bool = True, overwrite: bool = False,
                   precision: str = "auto") -> Path:
    """Stage-3 groups: the groups of ``groups_path`` (e.g. the stage-2 retriever's mined top-200 minus positives),
    their negatives cut to the first ``max_negatives`` (rank order), every positive and negative scored by the
    reranker. Returns ``out``.

    Groups are read, scored and written a chunk at a time (:class:`PairScorer`), so memory does not grow with the
    number of groups or pairs. A current output (same settings, same model, groups and corpus) is kept unless
    ``overwrite``.
    """
    from tqdm.auto import tqdm

    from pretrieve.data.groups import GroupStats, iter_groups
    from pretrieve.retrieval.batches import resolve_device

    if max_negatives is not None and max_negatives < 1:
        raise ConfigError(f"max_negatives must be >= 1, got {max_negatives}")
    collection = BeirCollection(Path(data))
    if not Path(groups_path).exists():
        raise InputError("groups file not found", path=groups_path)
    resolved = resolve_precision(precision, resolve_device(device))
    settings = {"max_negatives": max_negatives, "max_len": max_len or trained_max_len(model_dir),
                "precision": resolved}
    inputs = {"model": model_dir, "groups": groups_path, "corpus": collection.corpus_path}
    outputs.check_writable(out, directory=False)
    outputs.remove_leftovers(Path(out).parent, depth=0)
    status = artifacts.check(out, settings, inputs, kind="groups")
    if ranks.broadcast(status.current and not overwrite, "check the teacher groups"):
        logger.info("teacher groups %s are up to date; not recomputing", out)
        return Path(out)
    if status.exists:
        logger.info("recomputing %s: %s", out, status.reason)
    corpus = CorpusTexts(ranks.built_once(collection.corpus_dataset))
    scorer = PairScorer(model_dir, device=device, max_len=max_len, batch_size=batch_size, precision=resolved)
    stats = GroupStats()

    def count() -> int:
        return sum(1 for _ in iter_groups(groups_path, corpus=corpus))

    def write_part(start: int, end: int, paths: list[Path]) -> tuple[int, int]:
        written = pairs_scored = 0
        groups = (group for position, group in enumerate(iter_groups(groups_path, corpus=corpus, stats=stats))
                  if start <= position < end)
        cut = ((group, group.negatives[:max_negatives]) for group in groups)
        with open(paths[0], "w", encoding="utf-8") as handle, \
                tqdm(desc="teacher scores", unit="pairs", disable=not show_progress) as progress:
            for chunk in _chunks_of_items(cut, lambda item: len(item[0].positives) + len(item[1]),
                                          scorer.chunk_pairs):
                ids = [doc_id for group, negatives in chunk for doc_id in (*group.positives, *negatives)]
                queries = [group.query for group, negatives in chunk for _ in (*group.positives, *negatives)]
                scores = scorer.score_chunk(queries, corpus.texts_of(ids)).tolist()
                position = 0
                for group, negatives in chunk:
                    size = len(group.positives) + len(negatives)
                    values = scores[position:position + size]
                    position += size
                    scored = TrainingGroup(group.query_id, group.query, group.positives, negatives,
                                           values[:len(group.positives)], values[len(group.positives):])
                    handle.write(json.dumps(scored.to_dict(), ensure_ascii=False) + "\n")
                    written += 1
                pairs_scored += len(ids)
                progress.update(len(ids))
        return written, pairs_scored

    def check(parts: list[tuple[int, int]]) -> None:
        if sum(written for written, _ in parts) == 0:
            raise InputError(f"no usable group ({stats.problems()})", path=groups_path)

    parts = ranks.split_files([(Path(out), "groups", settings, inputs)], count, write_part, "teacher scores",
                              check=check)
    written, pairs_scored = sum(w for w, _ in parts), sum(p for _, p in parts)
    logger.info("wrote %d teacher-scored groups (%d pairs) to %s", written, pairs_scored, out)
    return Path(out)

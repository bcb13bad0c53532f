"""Retriever fine-tuning, stages 1–3 (CDMAE, Li et al. 2023, §3.4, DupMAE (Xiao & Liu 2022) eq. 13–15, CoT-MoTE (Ma et al. 2023) §3.3, Drop your Decoder (Ma et al. 2024) §4.1).

:func:`finetune` trains a :class:`~pretrieve.modeling.dual_encoder.DualEncoder` on training groups (a query, its
positives, its hard negatives) with the shared loop (:mod:`pretrieve.train.loop`: data order, accumulation,
DDP, checkpoints, exact resume) and exports it to ``<out>/final`` (:mod:`pretrieve.modeling.export`: a
sentence-transformers folder for dense siamese models, so ``pretrieve dense --model <out>/final`` works).

The three stages differ only in their groups and loss (DupMAE's variants, DupMAE (Xiao & Liu 2022) eq. 13 and 15, are settings:
``num_negatives: 0`` in stage 1 trains on in-batch negatives only — the groups are then the qrels' positives,
``qrels_groups.jsonl``, and no BM25 runs; ``alpha: 0`` in stage 3 keeps only the soft-label term, the teacher's
distribution over each query's own group):

====== ====================================================================== ==============================
stage  groups (``--groups``)                                                  loss
====== ====================================================================== ==============================
1      BM25 top-K₁ (1000) minus positives; built and cached as                InfoNCE, in-batch + hard negs
       ``<out>/bm25_groups.jsonl`` when no file is given
2      the stage-1 retriever's top-K₂ (200) minus positives — ``pretrieve     InfoNCE, in-batch + hard negs
       mine --model STAGE1/final``
3      the stage-2 retriever's top-K₃ (200) minus positives, with teacher     KL(teacher ‖ student) + α·InfoNCE
       scores from the cross-encoder — ``pretrieve reranker teacher``         (α = 0.2)
====== ====================================================================== ==============================

``train_towers: query`` trains only the query tower, against the base model's vectors of the whole corpus (the
user cache that search fills), and saves the base model's passage tower unchanged: :mod:`pretrieve.train.query_side`
(the qrels' positives as groups, no negatives to build).

A stage starts from ``--model``: in the papers' recipes the *pre-trained* checkpoint, not the previous stage:
"At each of the three training stages, retrievers are initialized with the same pre-trained checkpoint"
(CDMAE, Li et al. 2023, §3.4; SimLM and Tevatron's recipes do the same), so earlier stages only supply negatives.
STAR (which CPDAE follows) continues stage 2 from the stage-1 model instead (a recipe's ``init: previous``).

Sampling (:class:`GroupCollator`): each step draws, per query, one positive uniformly and ``num_negatives``
distinct negatives (:func:`pretrieve.data.groups.sample_group_indices`) from the generator the loop seeds per
(seed, step, micro-batch) — so resume is exact. Queries (``query_max_len`` 32) and passages (title + " " +
text, ``passage_max_len`` 144: Drop your Decoder (Ma et al. 2024) §4.1's MS MARCO length) are tokenized with dynamic padding. The corpus and
the groups are read as memory-mapped Arrow datasets (:mod:`pretrieve.data.arrow`, built once by the main process
and reused while current), so no rank holds the passages or the groups as Python objects.

Evaluation while training (``eval_steps``, :meth:`FinetuningRun.evaluation`): every ``eval_steps`` steps and at the
end the model is exported, searched and scored on dev queries (``eval_data`` / ``eval_split``, default the training
collection's ``dev``; a recipe's dev split in a recipe) by pretrieve's own search and ``RunEvaluator``; the measures
go to ``logs.jsonl`` and the trackers as ``eval/<measure>``, and ``final`` is the best evaluated model by
``metric_for_best`` (:mod:`pretrieve.train.evaluator`: checkpointed, so resume ends with the same model). The
training queries cannot be the dev queries. The evaluation's settings and the dev files are part of the run's
settings and inputs only when it evaluates.

Defaults. The papers fine-tune with batch 64, 15 negatives (group 16; CDMAE (Li et al. 2023): group 32, swapped with the
batch in stage 3), lr 2e-5, 3 epochs, dot product with τ = 1 on [CLS] vectors. The defaults here keep the
papers' lr, epochs, lengths, similarity and α but use batch 16 and 7 negatives (group 8), which fits a CPU
or a small GPU; set ``batch_size: 64`` and ``num_negatives: 15`` in a config file to match the papers.
``pooling`` / ``normalize`` default to what a sentence-transformers checkpoint declares (all-MiniLM-L6-v2:
mean + normalize), else [CLS] without normalisation (papers); so do ``query_prompt`` / ``passage_prompt`` (an
E5/BGE-style checkpoint's saved prompts, put before each query / passage in training and saved with the fine-tuned
model, so that mining, search and export use the texts it was trained on); ``temperature`` defaults to 1 for
unnormalised dot products and 0.05 for cosine or normalised vectors.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pyarrow.compute as pc
import torch
from transformers import AutoConfig, AutoTokenizer

from pretrieve import artifacts, ranks
from pretrieve.data.arrow import CorpusTexts, groups_dataset
from pretrieve.ranks import built_once
from pretrieve.data.collection import BeirCollection
from pretrieve.data.groups import TrainingGroup, write_groups
from pretrieve.data.records import title_separator
from pretrieve.data.registry import resolve_collection
from pretrieve.errors import ConfigError, InputError
from pretrieve.evaluation.metrics import RunEvaluator, parse_measures
from pretrieve.io_utils import write_json
from pretrieve.modeling.dual_encoder import DualEncoder, RetrievalLoss
from pretrieve.modeling.export import export_retriever
from pretrieve.modeling.representations import DenseRepresentation, from_spec
from pretrieve.models import no_remote_code, resolve_model
from pretrieve.options import build
from pretrieve.retrieval.load import load_retriever
from pretrieve.retrieval.runs import bm25_negatives
from pretrieve.retrieval.search import search
from pretrieve.modeling.sentence_transformer import ModelFiles, read_sentence_transformers_config
from pretrieve.train import query_side
from pretrieve.train.collator import GroupCollator
from pretrieve.train.evaluator import Evaluation
from pretrieve.train.pretrainer import check_max_len
from pretrieve.train.run import TrainingRun
from pretrieve.train.run_config import validated_values
from pretrieve.train.settings import BOOKKEEPING, DEFAULT_EVAL_SPLIT, FinetuneSettings

if TYPE_CHECKING:
    from pretrieve.data.arrow import GroupsDataset

logger = logging.getLogger(__name__)

EVAL_DEPTH = 1000
"""Results per dev query searched at each evaluation (as ``pretrieve evaluate``'s runs)."""
BM25_GROUPS_FILE = "bm25_groups.jsonl"
QRELS_GROUPS_FILE = "qrels_groups.jsonl"
CONFIG_FILE = "finetune_config.json"
KIND = "retriever"
# Paths: the run's inputs are compared by content (artifacts.fingerprint), never by where they are.
PATH_SETTINGS = ("model", "data", "out", "groups", "eval_data")
#: Settings of the evaluation while training: part of a run's settings only when it evaluates (``eval_steps`` > 0),
#: so runs made before these options existed stay current.
EVAL_SETTINGS = ("eval_steps", "eval_split", "eval_measures", "metric_for_best")
PROMPT_SETTINGS = ("query_prompt", "passage_prompt")
COSINE_TEMPERATURE = 0.05


@dataclass
class FinetuneConfig(FinetuneSettings):
    """One fine-tuning stage (its settings and their checks: :class:`~pretrieve.train.settings.FinetuneSettings`;
    defaults: the module docstring) and what the run makes of them: its compared settings and its inputs."""

    def evaluated_measures(self) -> list[str]:
        """``eval_measures`` with ``metric_for_best`` (added when missing)."""
        names = list(parse_measures(self.eval_measures))
        return names if self.metric_for_best.strip() in names else names + [self.metric_for_best.strip()]

    def settings(self) -> dict[str, Any]:
        """The resolved settings that determine the result (bookkeeping options and paths left out; a prompt only
        when there is one, the title join and the towers trained only when not the defaults, and the evaluation's settings only
        when it evaluates, so runs made before these options existed stay current)."""
        return {key: value for key, value in dataclasses.asdict(self).items()
                if key not in BOOKKEEPING and key not in PATH_SETTINGS
                and not (key in PROMPT_SETTINGS and not value) and not (key == "title_join" and value == "space")
                and not (key == "train_towers" and value == "both")
                and not (key in EVAL_SETTINGS and not self.eval_steps)}

    def inputs(self, model_path: str) -> tuple[dict[str, Path], dict[str, str]]:
        """What the run is trained from, fingerprinted by content: the checkpoint, the collection's corpus, queries
        and training qrels, and the groups file (stage 1 without one builds BM25 groups from those)."""
        collection = BeirCollection(Path(self.data))
        evaluated = {}
        if self.eval_steps:   # the dev queries choose the final model
            dev = self.eval_collection()
            evaluated = {"eval_qrels": dev.qrels_path(self.eval_split or DEFAULT_EVAL_SPLIT),
                         "eval_queries": dev.queries_path, "eval_corpus": dev.corpus_path}
        return artifacts.run_inputs(model=model_path, corpus=collection.corpus_path, queries=collection.queries_path,
                                    qrels=collection.qrels_path(self.split), groups=self.groups, **evaluated)

    def eval_collection(self) -> BeirCollection:
        """The collection of the dev queries: ``eval_data`` (a name or a path), else the training collection."""
        return BeirCollection(resolve_collection(self.eval_data) if self.eval_data else Path(self.data))




# ----------------------------------------------------------------------------------------- resolution
def resolve_dense_settings(config: FinetuneConfig, model_path: str) -> FinetuneConfig:
    """Fill ``pooling`` / ``normalize`` / ``temperature`` left as None (see the module docstring).

    Non-dense representations (``dupmae:...``) ignore pooling/normalisation; their temperature defaults to 1
    (the papers' plain dot product)."""
    if config.representation != "dense":
        return dataclasses.replace(config, temperature=1.0 if config.temperature is None else config.temperature,
                                   query_prompt=config.query_prompt or "", passage_prompt=config.passage_prompt or "")
    st = None
    try:
        st = read_sentence_transformers_config(ModelFiles(model_path))
    except (InputError, ConfigError) as exc:
        logger.warning("cannot read the sentence-transformers config of %s (%s); using cls pooling",
                       model_path, exc)
    pooling = config.pooling
    if pooling is None:
        pooling = "+".join(st.pooling) if st is not None else "cls"
        if pooling not in ("cls", "mean"):
            raise ConfigError(f"{model_path} declares pooling '{pooling}'; pass --pooling cls or --pooling mean")
    normalize = config.normalize if config.normalize is not None else bool(st is not None and st.normalize)
    if st is None and (config.pooling is None or config.normalize is None):
        logger.info("%s declares no pooling (no sentence-transformers modules.json): fine-tuning with %s pooling%s "
                    "(the papers' default; pass pooling=/normalize= to choose)", model_path, pooling,
                    ", normalised" if normalize else " and a dot product")
    elif st is not None:
        declared = ("+".join(st.pooling), bool(st.normalize))
        if (pooling, normalize) == declared:
            logger.info("fine-tuning keeps the pooling %s declares: %s%s", model_path, pooling,
                        " + normalisation (cosine)" if normalize else " (dot product)")
        else:
            logger.warning("%s pools with %s%s; fine-tuning changes that to %s%s as asked", model_path, declared[0],
                           " + normalisation (cosine)" if declared[1] else " (dot product)", pooling,
                           " + normalisation (cosine)" if normalize else " (dot product)")
    temperature = config.temperature
    if temperature is None:
        temperature = COSINE_TEMPERATURE if (normalize or config.similarity == "cos") else 1.0
    query_prompt = config.query_prompt if config.query_prompt is not None else (st.query_prompt if st else None)
    passage_prompt = (config.passage_prompt if config.passage_prompt is not None
                      else (st.passage_prompt if st else None))
    if (query_prompt or passage_prompt) and st is not None and not st.include_prompt and pooling == "mean":
        raise ConfigError(f"{model_path} leaves its prompt's tokens out of mean pooling, which fine-tuning does not "
                          "do: pass query_prompt: '' and passage_prompt: '' to train without prompts")
    return dataclasses.replace(config, pooling=pooling, normalize=normalize, temperature=temperature,
                               query_prompt=query_prompt or "", passage_prompt=passage_prompt or "")


def build_representation(config: FinetuneConfig, model_path: str | None = None):
    """``dense`` (pooling/normalize/similarity settings), else the kind's own spec through
    :func:`~pretrieve.modeling.representations.from_spec`: ``dupmae[:<spec>]`` (DupMAE, Xiao & Liu 2022, eq. 10–12,
    e.g. ``dupmae:cls:384,ot:260``), ``sparse[:<spec>]`` / ``hybrid[:<spec>]`` (CoT-MoTE, Ma et al. 2023, eq. 4–6,
    e.g. ``hybrid:lq=3e-4,ld=1e-4``)."""
    if config.representation == "dense":
        return DenseRepresentation(pooling=config.pooling, normalize=config.normalize, similarity=config.similarity,
                                   temperature=config.temperature)
    return from_spec(config.representation, str(model_path or resolve_model(config.model)),
                     temperature=1.0 if config.temperature is None else config.temperature)


def missing_groups_message(stage: int) -> str:
    if stage == 2:
        return ("stage 2 trains on hard negatives mined with the stage-1 retriever; produce them with\n"
                "  pretrieve mine --model STAGE1_OUT/final --data DATA --split train --depth 200 --out mined.jsonl\n"
                "and pass --groups mined.jsonl")
    return ("stage 3 trains on the stage-2 retriever's hard negatives with cross-encoder teacher scores; produce "
            "them with\n"
            "  pretrieve mine --model STAGE2_OUT/final --data DATA --split train --depth 200 --out mined2.jsonl\n"
            "  pretrieve reranker train --model RERANKER_INIT --data DATA --groups mined.jsonl --out RERANKER\n"
            "  pretrieve reranker teacher --model RERANKER/final --data DATA --groups mined2.jsonl "
            "--out teacher.jsonl\n"
            "and pass --groups teacher.jsonl")


def groups_path(config: FinetuneConfig, collection: BeirCollection) -> Path:
    """The groups file of this stage: the given one, or (stage 1) the cached BM25 groups (every rank of a launched
    run calls this: the work is split or done once, :mod:`pretrieve.ranks`)."""
    if config.groups:
        path = Path(config.groups)
        if not path.exists():
            raise InputError("training groups file not found", path=path)
        return path
    if config.stage != 1:
        raise ConfigError(missing_groups_message(config.stage))
    if config.num_negatives == 0 or config.train_towers == "query":
        # in-batch negatives only (DupMAE eq. 13), or the whole corpus (query side): positives from the qrels, no BM25
        path = Path(config.out) / QRELS_GROUPS_FILE
        ranks.once("write the qrels groups", lambda: write_qrels_groups(collection, config.split, path))
        return path
    # every rank: the BM25 index is built once, then each rank searches a slice of the training queries
    return bm25_negatives(collection, config.split, Path(config.out) / BM25_GROUPS_FILE, depth=config.bm25_depth,
                          show_progress=config.show_progress and ranks.is_main())


def write_qrels_groups(collection: BeirCollection, split: str, path: Path) -> int:
    """Groups of every judged-relevant (grade ≥ 1) document of each ``split`` query with a text, no negatives."""
    queries, qrels = collection.load_queries(split), collection.load_qrels(split)
    groups = [TrainingGroup(qid, queries[qid], sorted(d for d, grade in judged.items() if grade >= 1), [])
              for qid, judged in sorted(qrels.items()) if qid in queries and any(g >= 1 for g in judged.values())]
    return write_groups(groups, path)


def load_training_groups(config: FinetuneConfig, path: Path, corpus) -> "GroupsDataset":
    """Read and check the groups (memory-mapped Arrow, :func:`pretrieve.data.arrow.groups_dataset`): unknown ids
    (error or skip), teacher scores for stage 3, negatives available, ``max_groups``. ``corpus``: the corpus
    dataset the ids are checked against."""
    groups = groups_dataset(path, corpus=corpus, on_unknown=config.on_unknown)
    table = groups.dataset.data
    if config.stage == 3:
        unscored = pc.or_(pc.is_null(table.column("positive_scores")), pc.is_null(table.column("negative_scores")))
        missing = int(pc.sum(unscored).as_py() or 0)
        if missing:
            first = table.column("query_id")[int(np.argmax(unscored.to_numpy(zero_copy_only=False)))].as_py()
            raise InputError(f"stage 3 needs teacher scores but {missing} of {len(groups)} groups have none "
                             f"(e.g. query '{first}')\n{missing_groups_message(3)}", path=path)
    return groups.trainable(need_negatives=config.num_negatives > 0 and config.train_towers == "both",
                            max_groups=config.max_groups)


def _warn_if_not_pretrained(config: FinetuneConfig, model_path: str) -> None:
    if config.stage > 1 and (Path(model_path) / "dual_encoder.json").exists():
        logger.warning("stage %d starts from the fine-tuned dual encoder %s: STAR (CPDAE) continues so, the other "
                       "papers start every stage from the pre-trained checkpoint (the earlier stages only mine "
                       "negatives)", config.stage, model_path)


# --------------------------------------------------------------------------------------------- running
def finetune(config: FinetuneConfig) -> Path:
    """Run (resume, or skip when already finished) one fine-tuning stage; returns ``<out>/final``.

    The output directory is checked and locked first (:func:`pretrieve.outputs.writing`)."""
    return FinetuningRun(config).run()


class FinetuningRun(TrainingRun):
    """One fine-tuning stage as a :class:`~pretrieve.train.run.TrainingRun`: the dense settings resolved from the
    checkpoint, the stage's groups (built or checked once), a :class:`DualEncoder` and its :class:`GroupCollator`."""

    kind = KIND
    config_file = CONFIG_FILE

    def __init__(self, config: FinetuneConfig):
        super().__init__(config)
        self.model_path = ""
        self.settings: dict[str, Any] = {}
        self.base = None   # query side (train_towers: query): the base model as search loads it (build_data)

    @property
    def description(self) -> str:
        return f"finetune stage {self.config.stage}"

    def check(self) -> None:
        self.config.check()

    def describe(self) -> tuple[dict[str, Any], dict[str, Path]]:
        self.model_path = resolve_model(self.config.model)
        self.config = resolve_dense_settings(self.config, self.model_path)
        self.representation = build_representation(self.config, self.model_path)
        if self.config.train_towers == "query":
            query_side.check_base(self.model_path)
        inputs, named = self.config.inputs(self.model_path)
        self.settings = self.config.settings() | named
        return self.settings, inputs

    def check_model(self) -> None:
        _warn_if_not_pretrained(self.config, self.model_path)
        try:
            model_config = AutoConfig.from_pretrained(self.model_path, **no_remote_code(self.model_path))
        except OSError as exc:
            raise InputError(f"cannot load the model: {exc}", path=self.model_path) from None
        for name in ("query_max_len", "passage_max_len"):
            check_max_len(getattr(self.config, name), model_config)

    def build_data(self) -> "GroupsDataset":
        config = self.config
        collection = BeirCollection(Path(config.data))
        self.groups_path = groups_path(config, collection)
        # Corpus and groups as memory-mapped Arrow datasets, built once by the main process; the others then open them.
        self.corpus = built_once(collection.corpus_dataset, "read the training groups")
        groups = built_once(lambda: load_training_groups(config, self.groups_path, self.corpus),
                            "read the training groups")
        logger.info("stage %d: %d training groups from %s", config.stage, len(groups), self.groups_path)
        self.groups = groups
        if config.train_towers == "query":   # the base model's corpus vectors, from (or into) the user cache
            self.base = query_side.base_retriever(self.model_path, config.pooling, config.normalize,
                                                  self.accelerator.device)
            index = query_side.corpus_index(self.base, collection,
                                            show_progress=config.show_progress and ranks.is_main())
            self.passages, self.rows = query_side.load_vectors(index)
            query_side.check_rows(groups, self.rows, index)
            logger.info("query-side fine-tuning: %d queries against the %d vectors of %s (the passage tower stays "
                        "%s)", len(groups), len(self.rows), index, self.model_path)
        return groups

    def build_model(self) -> torch.nn.Module:
        config = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path, **no_remote_code(self.model_path))
        loss = RetrievalLoss(in_batch=config.in_batch, gather=config.gather, alpha=config.alpha,
                             teacher_temperature=config.teacher_temperature)
        model = DualEncoder.from_pretrained(self.model_path, representation=self.representation, tied=config.tied,
                                            loss=loss)
        if self.base is not None:   # the model holds the corpus matrix from here on (one copy)
            passages, self.passages = self.passages, None
            return query_side.QuerySideEncoder(model, passages)
        model.grad_cache_chunk = config.grad_cache_chunk
        return model

    def build_collator(self, model, dataset) -> "GroupCollator | query_side.QueryCollator":
        config = self.config
        if self.base is not None:
            return query_side.QueryCollator(self.tokenizer, self.rows, config.query_max_len, config.query_prompt)
        return GroupCollator(self.tokenizer, CorpusTexts(self.corpus), config.num_negatives, config.query_max_len,
                             config.passage_max_len, teacher_scores=config.stage == 3,
                             query_prompt=config.query_prompt, passage_prompt=config.passage_prompt,
                             title_sep=title_separator(config.title_join, self.tokenizer))

    def config_record(self) -> dict[str, Any]:
        return {"settings": self.settings, "config": dataclasses.asdict(self.config)}

    def evaluation(self) -> Evaluation | None:
        """With ``eval_steps``: the dev queries' measures every ``eval_steps`` steps, searched and scored as
        ``pretrieve evaluate`` would score the exported model (:mod:`pretrieve.train.evaluator`)."""
        config = self.config
        if not config.eval_steps:
            return None
        collection = config.eval_collection()
        split = config.eval_split or DEFAULT_EVAL_SPLIT
        queries, qrels = collection.load_queries(split), collection.load_qrels(split)
        evaluator = RunEvaluator(qrels, config.evaluated_measures())
        corpus = collection.corpus_dataset()
        out = self.out

        # query side: every evaluation searches the base model's cached vectors of the dev corpus (encoded once)
        searched = corpus if self.base is None else query_side.corpus_index(self.base, collection, show_progress=False)

        def score(directory: Path) -> dict[str, float]:
            retriever = load_retriever(directory)
            run = search(retriever, queries, searched, k=EVAL_DEPTH, show_progress=False, scratch_dir=out)
            return evaluator(run, name=f"step {directory.name}").aggregate

        where = f"{len(queries)} {split} queries of {collection.root.name}"
        logger.info("evaluating every %d steps on the %s (%s; the best by %s becomes final/)", config.eval_steps,
                    where, ", ".join(config.evaluated_measures()), config.metric_for_best)
        return Evaluation(config.eval_steps, config.metric_for_best.strip(), score, where, collection.root.name, split)

    def export(self, unwrapped, directory: Path) -> None:
        config = self.config
        passage_length = config.passage_max_len if self.base is None else self.base.passage.max_length
        training = {"stage": config.stage, "query_max_len": config.query_max_len, "passage_max_len": passage_length,
                    "num_negatives": config.num_negatives, "groups": str(self.groups_path), "init": self.model_path}
        if config.title_join != "space":   # read back by pretrieve.retrieval.load: passages are encoded alike
            training["title_join"] = config.title_join
        model = unwrapped
        if self.base is not None:   # the trained query tower beside the base model's passage tower
            training.update(train_towers="query", num_negatives="whole corpus")
            passage_tower = type(unwrapped.encoder.query_tower).from_pretrained(self.model_path)
            model = DualEncoder(unwrapped.encoder.query_tower, passage_tower, self.representation)
        export_retriever(model, self.tokenizer, directory, passage_length, training=training,
                         prompts={"query": config.query_prompt, "passage": config.passage_prompt})
        if self.base is not None:
            query_side.copy_passage_tower(self.base, directory)
        write_json(directory / CONFIG_FILE, self.config_record() | {"groups_stats": self.groups.stats.as_dict()})


def build_finetune_config(file_values: Mapping[str, Any], flags: Mapping[str, Any],
                          resume: bool = False, where: str = "finetune config") -> FinetuneConfig:
    """A :class:`FinetuneConfig` from a config file's values overridden by the flags that were given (validated
    and coerced by :mod:`pretrieve.options`; ``where`` prefixes errors in the file's values)."""
    values = validated_values(FinetuneConfig, file_values, flags, where)
    values["resume"] = resume or bool(values.get("resume", False))
    config = build(FinetuneConfig, values)
    config.check()
    return config

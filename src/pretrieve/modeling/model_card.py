"""The model card (``README.md``) of an exported retriever: what it is, what it was trained on and how, how well it
does, what to cite, and how to load it.

:func:`model_card` builds the Markdown from what the export folder and its history record — no network, no
training statistics sentence-transformers' own card machinery would need from its trainer:

* ``dual_encoder.json``: the representation, tied or separate towers, the training lengths, the groups file and the
  checkpoint fine-tuning started from (``training.init``); ``finetune_config.json``: the training collection and
  the number of training groups (queries) kept;
* the chain of ``init`` checkpoints, followed back through earlier fine-tuning stages and the pre-training run
  (``pretrain_config.json``: method and corpus) to the **base model** (a hub name or path);
* a recipe's resolved configuration (``recipe.resolved.json``; printed as YAML) and its ``results.md`` (the results
  tables and the paired t-tests), when the export comes from a recipe;
* the **papers to cite**: those of the pre-training method (its objectives' ``citation`` and what else it uses,
  :func:`pretrieve.train.method.method_citations`, the source docs/methods.md's table is generated from), CoT-MoTE
  experts, and the representation (:data:`REPRESENTATION_PAPERS`).

The front matter is the Hugging Face Hub's model-card metadata, written by ``huggingface_hub``'s
:class:`~huggingface_hub.ModelCardData` (the schema the Hub reads): ``library_name``, ``pipeline_tag``, ``license``,
``tags``, ``base_model`` as a Hub id (an offline alias's folder is named by the Hub model it packages,
:data:`HUB_MODELS`; a local path is left out), ``language`` (of the collections it was trained and evaluated on,
where known: :data:`LANGUAGES`), ``datasets`` (only ids the Hub has: a BEIR collection BEIR published there as
``BeIR/<name>``, :data:`BEIR_ON_HUB`; Cranfield and the other classic test collections are not on the Hub) and a
``model-index`` with every evaluation the model has: ``metrics`` (a recipe's ``results.json`` rows of this model, or
what the caller measured) and the dev measures of the best step when it was fine-tuned with evaluation while
training (``evaluation.json``, :mod:`pretrieve.train.evaluator`). The body's
**Training** section lists the settings of every training the model went through — fine-tuning
(``finetune_config.json``, whether run by the CLI, the Python API or a recipe) and pre-training
(``pretrain_config.json``) — and the number of training queries fine-tuning really used (the groups kept, cut by
``max_groups``, and at most ``max_steps × batch_size`` seen).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import yaml

from pretrieve.errors import InputError
from pretrieve.modeling.objectives.base import COT_MOTE, DUPMAE, SBERT, SPLADE, Citation
from pretrieve.models import OFFLINE_MODELS
from pretrieve.train.evaluator import EVALUATION_FILE, best_values
from pretrieve.train.method import PRESETS, method_citations, method_from_mapping, preset

#: representation → the papers of the retriever's form (beside the papers of its pre-training method).
REPRESENTATION_PAPERS: dict[str, tuple[Citation, ...]] = {"dupmae": (DUPMAE,), "sparse": (SPLADE,),
                                                          "hybrid": (SPLADE, COT_MOTE), "dense": (SBERT,)}
DEFAULT_LICENSE = "apache-2.0"
#: The BEIR collections BEIR's authors published on the Hugging Face Hub as ``BeIR/<name>`` (BioASQ, Signal-1M,
#: TREC-NEWS and Robust04 are not there: their licences; CQADupStack is split by forum).
BEIR_ON_HUB = frozenset({"msmarco", "trec-covid", "nfcorpus", "nq", "hotpotqa", "fiqa", "arguana", "webis-touche2020",
                         "quora", "dbpedia-entity", "scidocs", "fever", "climate-fever", "scifact"})
#: Collection → language (ISO 639-1), for the card's ``language``: the BEIR collections pretrieve knows and the
#: classic test collections (Cranfield, MED, LISA, TIME, ADI, CISI, NPL, CACM) are English.
LANGUAGES = {name: "en" for name in (*BEIR_ON_HUB, "msmarco-titled", "bioasq", "signal1m", "trec-news", "robust04",
                                     "cqadupstack", "cranfield", "med", "lisa", "time", "adi", "cisi", "npl", "cacm")}
#: offline alias → the Hub model its packaged folder holds (``base_model`` in the card).
HUB_MODELS = {alias: "sentence-transformers/all-MiniLM-L6-v2"
              for alias in ("minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")}
#: Settings that are bookkeeping or paths, not training settings (left out of the card's training section).
NOT_SETTINGS = {"model", "data", "out", "groups", "teacher", "corpus", "cache_dir", "resume", "overwrite", "report_to",
                "show_progress", "log_every", "save_every", "keep_checkpoints", "num_workers", "num_proc", "method",
                "allow_inexact_resume"}


def model_card(directory: str | Path, recipe: Mapping[str, Any] | None = None, results: str | None = None,
               row: str | None = None, license: str = DEFAULT_LICENSE, repo_id: str | None = None,
               metrics: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """The Markdown card of the exported retriever in ``directory`` (``recipe``: a resolved recipe; ``results``:
    its ``results.md``; ``row``: this model's row there; ``repo_id``: the hub name it will be loaded by, else its
    folder; ``metrics``: ``{collection: {measure: value}}`` of this model, the card's ``model-index``)."""
    from huggingface_hub import ModelCardData  # lazy: huggingface_hub

    directory = Path(directory)
    info = _json(directory / "dual_encoder.json") or {}
    training = info.get("training") or {}
    representation = info.get("representation") or {"type": "dense"}
    kind = str(representation.get("type", "dense"))
    history = _history(training.get("init"))
    base = history["base"] or (recipe or {}).get("model") or "unknown"
    mote = history["mote"] or bool((_json(directory / "config.json") or {}).get("mote"))
    finetune = (_json(directory / "finetune_config.json") or {})
    settings = finetune.get("config") or {}
    data = settings.get("data") or (recipe or {}).get("data")
    groups = (finetune.get("groups_stats") or {}).get("kept")
    if groups is not None and settings.get("max_groups"):
        groups = min(int(groups), int(settings["max_groups"]))
    methods, records = list(history["methods"]), list(history["records"])
    pretrain = (recipe or {}).get("pretrain") or {}
    if isinstance(pretrain, Mapping) and isinstance(pretrain.get("method"), str) and not methods:
        methods.append(pretrain["method"])
        records.append(pretrain["method"])
    name = repo_id or directory.name
    dense = kind == "dense"
    tags = ["pretrieve", "dense-retrieval" if dense else f"{kind}-retrieval"] + (["sentence-transformers"] if dense
                                                                                 else [])
    hub_base = hub_model(base)
    evaluation = _json(directory / EVALUATION_FILE)
    metrics = {**(metrics or {}), **dev_metrics(evaluation)}
    collections = ([data] if data else []) + [key.partition(":")[0] for key in metrics]
    datasets = [hub_dataset(name) for name in collections]
    languages = sorted({LANGUAGES[_collection_name(name)] for name in collections
                        if _collection_name(name) in LANGUAGES})
    card = ModelCardData(library_name="sentence-transformers" if dense else "pretrieve", license=license, tags=tags,
                         pipeline_tag="sentence-similarity" if dense else None, base_model=hub_base,
                         language=languages or None, datasets=list(dict.fromkeys(d for d in datasets if d)) or None,
                         model_name=name if metrics else None, eval_results=_eval_results(metrics) or None)
    lines = ["---", card.to_yaml(), "---", "",
             f"# {name}", "",
             f"A {_describe(kind, representation, info.get('tied', True), mote)} trained with "
             "pretrieve " + (f"(recipe `{recipe['name']}`)" if recipe and recipe.get("name")
                                                  else "") + ".", "",
             "## Model", "", f"- base model: `{hub_base or _shown(base)}`"]
    if methods:
        lines.append(f"- pre-training: {', '.join(f'`{m}`' for m in methods)}"
                     + (f" on `{_shown(history['corpus'])}`" if history["corpus"] else ""))
    lines.append(f"- representation: `{json.dumps(representation, sort_keys=True)}`")
    if training:
        lines.append(f"- lengths: queries {training.get('query_max_len', '?')}, passages "
                     f"{training.get('passage_max_len', '?')} tokens")
    lines += ["", "## Training data", ""]
    if data:
        lines.append(f"- collection: `{_shown(data)}`" + (", split `train`" if training else ""))
    if training.get("stage"):
        negatives = training.get("num_negatives", settings.get("num_negatives", "?"))
        lines.append(f"- fine-tuning stage {training['stage']}" + (
            f" on {groups} training queries (groups of a positive and {negatives} "
            f"negative{'' if negatives == 1 else 's'})" if groups else ""))
        steps, batch = settings.get("max_steps"), settings.get("batch_size")
        if groups and steps and batch and int(steps) > 0 and int(steps) * int(batch) < int(groups):
            lines.append(f"- seen in training: {int(steps) * int(batch)} of them ({steps} steps × batch {batch})")
    if not data and not training:
        lines.append("- not recorded")
    trainings = [("fine-tuning", settings)] + ([("pre-training", history["pretrain"])] if history["pretrain"]
                                               else [])
    shown = [(what, _settings(values)) for what, values in trainings if values]
    if any(values for _, values in shown):
        lines += ["", "## Training settings", ""]
        for what, values in shown:
            lines.append(f"- {what}: " + ", ".join(f"`{key}={value}`" for key, value in values.items()))
        if (directory / "finetune_config.json").is_file():
            lines.append("- every fine-tuning setting: `finetune_config.json` in this repository")
    if evaluation:
        lines += ["", "## Evaluation while training", "",
                  f"Evaluated every {settings.get('eval_steps', '?')} steps on {evaluation.get('queries', 'dev queries')}"
                  f"; this model is step {evaluation.get('best_step')}, the best by {evaluation.get('metric')} "
                  f"({evaluation.get('best_value', 0):.4f}; a maximum over the evaluations, so slightly optimistic "
                  "for these queries). Every evaluation: `evaluation.json` in this repository."]
    if recipe:
        lines += ["", "## Recipe", "", f"`pretrieve run` with this resolved recipe (`{recipe.get('name', '')}`):", "",
                  "```yaml", yaml.safe_dump(_relative(dict(recipe)), sort_keys=False).strip(), "```"]
    if results:
        body = results.split("\n", 1)[1] if results.startswith("# ") else results
        lines += ["", "## Results", "", "From the recipe's `results.md` (paired two-sided t-tests of the final row)"
                  + (f"; this model is the row `{row}`:" if row else ":"), "", body.strip()]
    lines += ["", "## Usage", ""] + _usage(name, kind, info.get("tied", True) is False or mote)
    papers = _papers(records, kind, mote)
    lines += ["", "## Citation", "", "Please cite the papers of the methods this model was built with:", ""]
    lines += [f"- {c.first_author} et al. ({c.year}). *{c.title}* ({c.paper})." for c in papers]
    lines += ["", "## License", "", f"`{license}` (check the base model's license as well).", ""]
    return "\n".join(lines)


def hub_model(name: Any) -> str | None:
    """``name`` as a Hub model id: an offline alias (or its packaged folder) → the Hub model it holds
    (:data:`HUB_MODELS`); a hub-style name as is; a local path → None."""
    text = str(name).rstrip("/")
    for alias, hub_id in HUB_MODELS.items():
        if text == alias:
            return hub_id
        try:
            location = OFFLINE_MODELS[alias][1]()
        except Exception:  # noqa: BLE001 - a missing optional package: not that alias
            location = None
        if location is not None and text == str(location).rstrip("/"):
            return hub_id
    if text in OFFLINE_MODELS or text == "unknown" or _looks_local(text):   # splade-tiny: no known Hub id
        return None
    return text


def hub_dataset(collection: Any) -> str | None:
    """A collection as a Hub dataset id: a BEIR collection published on the Hub (by its folder's name,
    :data:`BEIR_ON_HUB`) → ``BeIR/<name>``, else None (Cranfield: no Hub dataset)."""
    name = _collection_name(collection)
    return f"BeIR/{name}" if name in BEIR_ON_HUB else None


def _collection_name(collection: Any) -> str:
    return Path(str(collection).rstrip("/")).name.lower()


def dev_metrics(evaluation: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """``{"<collection>:<split>": {measure: value}}`` of the best step of an evaluation while training ({} without)."""
    values = best_values(evaluation) if evaluation else {}
    return {f"{evaluation['collection']}:{evaluation['split']}": values} if values and evaluation.get("collection") \
        else {}


def metrics_of(rows: Any, retriever: str | None) -> dict[str, dict[str, float]]:
    """``{collection: {measure: value}}`` of ``retriever``'s rows in a recipe's ``results.json`` rows (the final
    row's retriever when None)."""
    rows = [row for row in rows or [] if isinstance(row, Mapping)]
    if retriever is None:
        retriever = next((row.get("retriever") for row in rows if row.get("final")), None)
    found: dict[str, dict[str, float]] = {}
    for row in rows:
        if row.get("retriever") != retriever or not row.get("collection"):
            continue
        values = {key: float(value) for key, value in row.items()
                  if "@" in str(key) and isinstance(value, (int, float)) and not isinstance(value, bool)}
        if values:
            found[str(row["collection"])] = values
    return found


def metrics_from_file(path: str | Path, run: str | None = None) -> dict[str, dict[str, float]]:
    """``{collection: {measure: value}}`` of one model in a results file (``pretrieve export --metrics``): a recipe's
    ``results.json`` (its rows of retriever ``run``, the final row's by default) or ``pretrieve evaluate --json``
    output (the run named ``run``, or its only run; the collection of one-collection output is its qrels' folder,
    the split its qrels file). Bad files are one :class:`~pretrieve.errors.InputError` naming the file and field."""
    where = Path(path)
    if not where.is_file():
        raise InputError("results file not found", path=where)
    data = _json(where)
    if data is None:
        raise InputError("not a JSON object (a recipe's results.json or `pretrieve evaluate --json` output)",
                         path=where)
    if isinstance(data.get("rows"), list):
        found = metrics_of(data["rows"], run)
    elif isinstance(data.get("runs"), list):
        runs = {str(entry.get("name")): entry for entry in data["runs"] if isinstance(entry, Mapping)}
        if run is None and len(runs) != 1:
            raise InputError(f"{len(runs)} runs ({', '.join(runs)}); name this model's run with --metrics-run",
                             path=where, field="runs")
        entry = runs.get(run if run is not None else next(iter(runs)))
        if entry is None:
            raise InputError(f"no run {run!r} (runs: {', '.join(runs)})", path=where, field="runs")
        split = str(data.get("split") or "test")
        if isinstance(entry.get("scores"), Mapping):   # several collections
            found = {(name if split == "test" else f"{name}:{split}"): dict(values)
                     for name, values in entry["scores"].items() if isinstance(values, Mapping)}
        elif data.get("qrels"):   # one collection: <collection>/qrels/<split>.tsv
            qrels = Path(str(data["qrels"]))
            name, split = qrels.parent.parent.name, qrels.stem
            found = {(name if split == "test" else f"{name}:{split}"): dict(entry.get("aggregate") or {})}
        else:
            raise InputError("one-collection results without 'qrels': the collection is not known", path=where,
                             field="qrels")
    else:
        raise InputError("neither 'rows' (a recipe's results.json) nor 'runs' (`pretrieve evaluate --json`)",
                         path=where)
    found = {name: {measure: float(value) for measure, value in values.items()
                    if isinstance(value, (int, float)) and not isinstance(value, bool)}
             for name, values in found.items()}
    found = {name: values for name, values in found.items() if values}
    if not found:
        raise InputError(f"no measures of {run or 'the model'} in it", path=where)
    return found


def _eval_results(metrics: Mapping[str, Mapping[str, float]] | None) -> list:
    from huggingface_hub import EvalResult  # lazy: huggingface_hub

    results = []
    for collection, values in (metrics or {}).items():
        name, _, split = str(collection).partition(":")
        for measure, value in values.items():
            results.append(EvalResult(task_type="information-retrieval", task_name="Information Retrieval",
                                      dataset_type=hub_dataset(name) or name, dataset_name=name,
                                      dataset_split=split or "test",
                                      metric_type=measure.lower().replace("@", "_at_"), metric_name=measure,
                                      metric_value=round(float(value), 4)))
    return results


def _settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The training settings among a run's recorded configuration (scalars set, not paths or bookkeeping)."""
    return {key: value for key, value in values.items()
            if key not in NOT_SETTINGS and value is not None and isinstance(value, (int, float, str, bool))
            and value != ""}


def write_model_card(directory: str | Path, **kwargs: Any) -> Path:
    """Write :func:`model_card` to ``directory/README.md``; returns its path."""
    path = Path(directory) / "README.md"
    path.write_text(model_card(directory, **kwargs), encoding="utf-8")
    return path


def _describe(kind: str, representation: Mapping[str, Any], tied: bool, mote: bool) -> str:
    if kind != "dense":
        return {"sparse": "SPLADE-style sparse retriever", "hybrid": "hybrid dense + sparse retriever",
                "dupmae": "DupMAE ([CLS] + ordinary-token) retriever"}.get(kind, f"{kind} retriever")
    how = ("with shared attention and query/passage FFN experts (CoT-MoTE)" if mote
           else "with separate query and passage towers" if not tied else "siamese")
    return f"dense retriever ({representation.get('pooling', 'cls')} pooling, {how})"


def _usage(name: str, kind: str, routed: bool) -> list[str]:
    lines = []
    if kind == "dense":
        lines += ["```python", "from sentence_transformers import SentenceTransformer", "",
                  f'model = SentenceTransformer("{name}")',
                  'queries = model.encode_query(["what causes rain?"])',
                  'passages = model.encode_document(["Rain falls when ..."])',
                  "scores = model.similarity(queries, passages)", "```", ""]
        if routed:
            lines += ["Queries and passages take their own route (sentence-transformers' `Router`): use "
                      "`encode_query` / `encode_document`, not `encode`.", ""]
    lines += ["With pretrieve:", "", "```python", "import pretrieve", "",
              f'retriever = pretrieve.load_retriever("{name}")',
              'vectors = pretrieve.encode(retriever, ["what causes rain?"], side="query")', "```", "",
              "```bash", f"pretrieve dense --model {name} --data scifact --out run.trec", "```"]
    return lines


def _papers(methods: list[Any], kind: str, mote: bool) -> list[Citation]:
    """The papers of the pre-training ``methods`` (resolved method records or preset names), the experts and the
    representation, once each."""
    found: list[Citation] = []
    for method in methods:
        try:
            resolved = (method_from_mapping(method, "pretrain_config.json: method") if isinstance(method, Mapping)
                        else preset(str(method)) if str(method) in PRESETS else None)
        except Exception:  # noqa: BLE001 - a method record of another pretrieve version: cite what can be read
            resolved = preset(method["name"]) if isinstance(method, Mapping) and method.get("name") in PRESETS \
                else None
        found += method_citations(resolved) if resolved is not None else []
    found += ([COT_MOTE] if mote else []) + list(REPRESENTATION_PAPERS.get(kind, ()))
    return list(dict.fromkeys(found))


def _history(init: Any, depth: int = 0) -> dict[str, Any]:
    """Base model, pre-training methods and corpus, and MoTE, by following ``init`` checkpoints back."""
    found: dict[str, Any] = {"base": None, "methods": [], "records": [], "corpus": None, "mote": False,
                             "pretrain": None}
    if not init:
        return found
    path = Path(str(init))
    if depth > 8 or not path.is_dir():
        found["base"] = str(init)
        return found
    found["mote"] = bool((_json(path / "config.json") or {}).get("mote"))
    pretrain = _json(path / "pretrain_config.json")
    dual = _json(path / "dual_encoder.json")
    if pretrain is not None:
        method = pretrain.get("method")
        name = method.get("name") if isinstance(method, Mapping) else method
        earlier = _history(pretrain.get("model"), depth + 1)
        found.update(base=earlier["base"], corpus=pretrain.get("corpus"), pretrain=pretrain,
                     methods=earlier["methods"] + ([str(name)] if name else []),
                     records=earlier["records"] + ([method] if method else []),
                     mote=found["mote"] or bool(isinstance(method, Mapping) and method.get("mote")))
    elif dual is not None:
        earlier = _history((dual.get("training") or {}).get("init"), depth + 1)
        found.update(base=earlier["base"], corpus=earlier["corpus"], methods=earlier["methods"],
                     records=earlier["records"],
                     mote=found["mote"] or earlier["mote"], pretrain=earlier["pretrain"])
    else:
        found["base"] = str(init)
    return found


def _json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).exists()


def _shown(value: Any) -> str:
    """A path as its last two parts (a machine's absolute paths say nothing to the card's reader)."""
    text = str(value)
    if not text.startswith(("/", "~")):
        return text
    return "/".join(Path(text).parts[-2:])


def _relative(value: Any) -> Any:
    """The recipe with absolute paths shortened by :func:`_shown`."""
    if isinstance(value, Mapping):
        return {key: _relative(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_relative(item) for item in value]
    return _shown(value) if isinstance(value, str) else value

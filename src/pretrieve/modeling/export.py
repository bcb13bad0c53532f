"""Export a fine-tuned dual encoder so that retrieval tools load it as they are.

:func:`export_retriever` writes a :class:`~pretrieve.modeling.dual_encoder.DualEncoder` (``save``), its tokenizer
and, for dense representations, a sentence-transformers model built from sentence-transformers' own modules and
written by its own ``save`` (so the files follow the installed sentence-transformers, ≥ 6.2):

* ``Transformer`` with ``query_length`` (the query length of training) and ``document_length`` / the tokenizer's
  ``model_max_length`` (the passage length), which ``encode_query`` / ``encode_document`` truncate to, so long
  queries are cut where pretrieve cuts them;
* ``Pooling`` (``cls`` or ``mean``, the representation's) → ``Normalize`` (when the representation normalises or
  is trained on cosine similarity);
* the model's ``similarity_fn_name`` (``"cosine"`` for cosine/normalised representations, else ``"dot"``) and
  ``prompts`` (``{"query": …, "document": …}``, when the model is used with instructions, E5/BGE-style
  ``"query: "``), so ``encode_query`` / ``encode_document`` prepend them.

Three dense layouts, all loading with ``SentenceTransformer(path)``, with
:func:`pretrieve.retrieval.load.load_retriever` (``pretrieve dense --model path``) and ``DualEncoder.load``:

* **siamese** (one tower): the ``Transformer`` at the folder's root;
* **separate towers** (``tied=False``): sentence-transformers' ``Router.for_query_document`` — the task
  ``"query"`` runs the ``Transformer`` in ``query_0_Transformer/``, ``"document"`` (the default) the one in
  ``document_0_Transformer/``, the folders where ``DualEncoder.save`` keeps the two towers
  (:data:`~pretrieve.modeling.dual_encoder.TOWER_FOLDERS`), so each tower is stored once;
* **CoT-MoTE** (one tower with query/passage FFN experts, Ma et al. 2023): the root keeps the MoTE checkpoint
  (``DualEncoder.load``, further fine-tuning), and each side is also written as a plain transformer — shared
  weights + that side's experts (:func:`expert_model`) — in the two Router folders as above. Exact (no
  approximation), at the cost of two plain copies of the weights beside the MoTE one.

What sentence-transformers cannot express stays pretrieve's own: representations other than dense (sparse,
hybrid, DupMAE) get no sentence-transformers files — their folder is pretrieve's format (``dual_encoder.json`` + a
Hugging Face checkpoint with its MLM head), loaded by ``load_retriever`` / ``pretrieve dense`` — and the MoTE
checkpoint at a CoT-MoTE export's root (experts routed per token type) is read by pretrieve alone (docs/export.md).

:func:`export_model` (``pretrieve export``, ``pretrieve.export``) turns a fine-tuned model folder into a clean
export of this layout plus its model card (:mod:`pretrieve.modeling.model_card`), and :func:`push_to_hub` uploads
the folder with ``huggingface_hub``. A push is checked before anything is exported (:func:`hub_token`, then
:func:`check_hub`: the Hub reachable and the token accepted) and every Hub failure is one
:class:`~pretrieve.errors.ConfigError` line; :func:`upload_plan` lists what a push would upload (a dry run).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import HfApi, get_token
from torch import nn
from transformers import AutoTokenizer

from pretrieve.errors import ConfigError, InputError
from pretrieve.modeling.dual_encoder import TOWER_FOLDERS, DualEncoder, read_dual_encoder_config
from pretrieve.modeling.model_card import DEFAULT_LICENSE, write_model_card
from pretrieve.train.evaluator import EVALUATION_FILE
from pretrieve.modeling.mote import EXPERTS, CONFIG_KEY, is_mote, routed_modules
from pretrieve.models import no_remote_code
from pretrieve.modeling.representations import DenseRepresentation

logger = logging.getLogger(__name__)

SIDES = {"query": "query", "document": "passage"}
"""sentence-transformers' task → pretrieve's text type of its side."""


def export_retriever(model: DualEncoder, tokenizer, directory: str | Path, max_seq_length: int,
                     training: Mapping[str, Any] | None = None,
                     prompts: Mapping[str, str | None] | None = None) -> Path:
    """Save ``model`` + ``tokenizer`` into ``directory`` in the layout described in the module docstring.

    ``prompts``: ``{"query": …, "passage": …}`` instructions the model is used with (None or empty: none)."""
    directory = Path(directory)
    model.save(directory, training=training)
    folders = [""] if model.tied else list(TOWER_FOLDERS.values())
    for folder in folders:
        _save_tokenizer(tokenizer, directory / folder, max_seq_length)
    if not isinstance(model.representation, DenseRepresentation):
        logger.info("representation '%s' is not dense: no sentence-transformers files written",
                    model.representation.kind)
        return directory
    query_length = int((training or {}).get("query_max_len") or max_seq_length)
    save_sentence_transformer(model, tokenizer, directory, max_seq_length, query_length, prompts or {})
    return directory


def save_sentence_transformer(model: DualEncoder, tokenizer, directory: Path, passage_length: int, query_length: int,
                              prompts: Mapping[str, str | None]) -> None:
    """Write the sentence-transformers files of the dense ``model`` saved in ``directory``: its modules, built from
    the saved towers, saved by sentence-transformers (the module docstring's layouts)."""
    from sentence_transformers import SentenceTransformer  # lazy: sentence_transformers
    from sentence_transformers.base.modules import Normalize, Router, Transformer  # lazy: sentence_transformers
    from sentence_transformers.sentence_transformer.modules import Pooling  # lazy: sentence_transformers

    def transformer(folder: Path, length: int):
        return Transformer(str(folder), max_seq_length=length, query_length=query_length,
                           document_length=passage_length)

    mote = model.tied and tower_is_mote(model.query_tower)
    if model.tied and not mote:
        first = transformer(directory, passage_length)
    else:
        if mote:
            experts = next(module for module in model.query_tower.modules() if is_mote(module))
            for side, folder in TOWER_FOLDERS.items():
                expert_model(experts, side).save_pretrained(str(directory / folder), safe_serialization=True)
                _save_tokenizer(tokenizer, directory / folder, passage_length)
        first = Router.for_query_document(
            [transformer(directory / TOWER_FOLDERS["query"], query_length)],
            [transformer(directory / TOWER_FOLDERS["passage"], passage_length)])
    representation = model.representation
    modules = [first, Pooling(model.query_tower.hidden_size, pooling_mode=representation.pooling)]
    modules += [Normalize()] if representation.unit_vectors else []
    saved = {task: prompts.get(side) for task, side in SIDES.items() if prompts.get(side)}
    SentenceTransformer(modules=modules, device="cpu", prompts=saved,
                        similarity_fn_name="cosine" if representation.unit_vectors else "dot",
                        ).save(str(directory), create_model_card=False)


def export_model(model_dir: str | Path, out: str | Path, *, query_prompt: str | None = None,
                 passage_prompt: str | None = None, recipe: Mapping[str, Any] | None = None,
                 results: str | None = None, row: str | None = None, license: str = DEFAULT_LICENSE,
                 repo_id: str | None = None, metrics: Mapping[str, Mapping[str, float]] | None = None) -> Path:
    """Export the retriever fine-tuned by pretrieve in ``model_dir`` to ``out`` (:func:`export_retriever`'s layout,
    its ``finetune_config.json``, and a ``README.md`` model card); returns ``out``.

    ``query_prompt`` / ``passage_prompt`` replace the prompts the model saved (``""``: none); ``recipe`` (a resolved
    recipe) and ``results`` (its ``results.md``) go into the card, ``row`` names the model's row there; ``repo_id``
    names the model in the card's usage; ``metrics`` (``{collection: {measure: value}}``) its ``model-index``.
    """
    model_dir, out = Path(model_dir), Path(out)
    info = read_dual_encoder_config(model_dir)
    if out.resolve() == model_dir.resolve():
        raise ConfigError(f"out: {out} is the model folder itself; export into another folder")
    if out.exists() and any(out.iterdir()) and not (out / "dual_encoder.json").is_file():
        raise InputError("exists and is not an export (not overwritten)", path=out)
    model = DualEncoder.load(model_dir, info=info).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), **no_remote_code(model_dir))
    training = dict(info.get("training") or {})
    length = int(training.get("passage_max_len") or tokenizer.model_max_length)
    prompts = saved_prompts(model_dir)
    for side, given in (("query", query_prompt), ("passage", passage_prompt)):
        if given is not None:
            prompts[side] = given
    if out.exists():
        shutil.rmtree(out)
    export_retriever(model, tokenizer, out, length, training=training, prompts=prompts)
    for name in ("finetune_config.json", EVALUATION_FILE):   # the training's record: the card reads them
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    write_model_card(out, recipe=recipe, results=results, row=row, license=license, repo_id=repo_id, metrics=metrics)
    return out


def saved_prompts(directory: str | Path) -> dict[str, str]:
    """``{"query": …, "passage": …}`` from an export's ``config_sentence_transformers.json`` (empty without)."""
    path = Path(directory) / "config_sentence_transformers.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("prompts") or {}
    except (OSError, ValueError):
        return {}
    return {side: saved[task] for task, side in SIDES.items() if saved.get(task)}


def push_to_hub(directory: str | Path, repo_id: str, private: bool = False, token: str | None = None) -> str:
    """Upload the export in ``directory`` to the Hugging Face Hub model repository ``repo_id`` (created when
    missing, ``private`` then); returns the repository's URL. Needs a token (``token``, ``$HF_TOKEN`` or
    ``hf auth login``)."""
    directory = Path(directory)
    if not (directory / "README.md").is_file():
        raise InputError("not an export with a model card (README.md missing); run pretrieve export first",
                         path=directory)
    api = HfApi(token=hub_token(token))
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(directory), repo_type="model",
                          commit_message="Upload retriever exported by pretrieve")
    except Exception as exc:  # noqa: BLE001 - network, permission, quota: one line, the export stays
        raise ConfigError(f"push_to_hub: uploading to {repo_id} failed ({_reason(exc)}); the export is in "
                          f"{directory}") from None
    return str(url)


def check_hub(token: str) -> str:
    """Before any work: the Hub answers and accepts ``token`` (``whoami``); returns the account's name. No network,
    offline mode or a refused token is one ConfigError line."""
    try:
        who = HfApi(token=token).whoami()
    except Exception as exc:  # noqa: BLE001 - httpx/requests connection errors, HTTP 401, offline mode
        raise ConfigError(f"push_to_hub: the Hugging Face Hub cannot be used ({_reason(exc)}); nothing was exported "
                          "(check the network and the token, or export without pushing)") from None
    return str((who or {}).get("name") or "?")


def upload_plan(directory: str | Path) -> list[tuple[str, int]]:
    """``[(relative path, bytes)]`` of the files a push of ``directory`` uploads (all of them, sorted)."""
    directory = Path(directory)
    return sorted((path.relative_to(directory).as_posix(), path.stat().st_size)
                  for path in directory.rglob("*") if path.is_file())


def _reason(exc: BaseException) -> str:
    """One line about ``exc``: its type and the first line of its message."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def hub_token(token: str | None = None) -> str:
    """``token``, else the one ``huggingface_hub`` finds (``$HF_TOKEN``, ``hf auth login``); ConfigError without."""
    token = token or get_token()
    if not token:
        raise ConfigError("push_to_hub: no Hugging Face token; set HF_TOKEN or run `hf auth login`")
    return token


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


def expert_model(model: nn.Module, expert: str) -> nn.Module:
    """A plain copy of the MoTE model ``model`` whose every layer runs the ``expert`` (``"query"`` or
    ``"passage"``) FFN: shared weights + that expert, under the original parameter names (loads with
    ``AutoModel``)."""
    if expert not in EXPERTS:
        raise ValueError(f"expert must be one of {EXPERTS}, got {expert!r}")
    plain = copy.deepcopy(model)
    for name, routed in routed_modules(plain):
        parent_name, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent_name) if parent_name else plain, child, getattr(routed, expert))
    del plain.mote_router
    if hasattr(plain.config, CONFIG_KEY):
        delattr(plain.config, CONFIG_KEY)
    return plain

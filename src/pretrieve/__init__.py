"""pretrieve: pre-train, fine-tune, index and evaluate dense passage retrievers.

The verbs of the command line are functions here (:mod:`pretrieve.api`; docs/python.md): :func:`pretrain`,
:func:`finetune`, :func:`load_retriever`, :func:`encode`, :func:`search`, :func:`bm25`, :func:`fuse`,
:func:`evaluate`, :func:`run_recipe` and :func:`export`. They are imported on first use (PEP 562), so ``import pretrieve`` (and the
``pretrieve`` command's start) loads neither torch nor transformers, and importing it changes no global state.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "pretrieve.api": ("bm25", "encode", "evaluate", "export", "finetune", "fuse", "load_retriever", "pretrain",
                      "run_recipe", "search"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = ["__version__", *sorted(_MODULE_OF)]


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'pretrieve' has no attribute '{name}'")
    return getattr(importlib.import_module(_MODULE_OF[name]), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))

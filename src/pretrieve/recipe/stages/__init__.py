"""The recipe's stage kinds, one module each; importing a module registers its stage
(:func:`pretrieve.recipe.schema.stage`).

A new stage kind is one new module here plus its line below: its options dataclass, its function under ``@stage``,
and what it declares there — what it ``needs`` and ``gives`` (the names its products are kept under in
:class:`~pretrieve.recipe.runner.RunState`: ``state.give("mined", label, path)``, ``state.latest("mined")``), how
``--smoke`` shrinks it (``smoke``), the collections it ``reads``, the ``rows`` it adds to later evaluate stages and
its ``name_options``. No stage imports another: what several share is in :mod:`pretrieve.recipe.rows`.
"""

# registration: each import adds its stage kind
from pretrieve.recipe.stages import pretrain, finetune, mine, reranker, teacher, fuse, select, evaluate  # noqa: F401

"""The recipe's stage kinds, one module each; importing a module registers its stage
(:func:`pretrieve.recipe.schema.stage`).

A new stage kind is one new module here (its options dataclass, what it ``needs`` and ``gives``, and its function
under ``@stage``) plus its line below.
"""

# registration: each import adds its stage kind
from pretrieve.recipe.stages import pretrain, finetune, mine, reranker, teacher, fuse, select, evaluate  # noqa: F401

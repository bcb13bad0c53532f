"""Models: the encoder wrapper, the pre-training objectives ("heads") and the pre-training model.

* :class:`Encoder` — a BERT-style ``*ForMaskedLM`` model of any family, with a generic MLM head;
* :mod:`pretrieve.modeling.objectives` — the objective interface, registry and built-in objectives;
* :class:`PretrainModel` — encoder + weighted objectives, with its checkpoint layout;
* :mod:`pretrieve.modeling.dual_encoder`, :mod:`pretrieve.modeling.cross_encoder` — fine-tuned retrievers and
  rerankers, with their losses in :mod:`pretrieve.modeling.losses` (cross-device negatives:
  :mod:`pretrieve.modeling.distributed`).

Knows nothing about files other than checkpoints, the CLI or the training loop.
"""

from pretrieve.modeling.encoder import Encoder, EncoderOutput
from pretrieve.modeling.objectives import (OBJECTIVES, Objective, ObjectiveOutput, build_objective,
                                           register_objective)
from pretrieve.modeling.pretrain_model import PretrainModel

__all__ = ["OBJECTIVES", "Encoder", "EncoderOutput", "Objective", "ObjectiveOutput", "PretrainModel",
           "build_objective", "register_objective"]

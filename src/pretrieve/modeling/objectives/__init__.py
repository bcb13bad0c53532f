"""Pre-training objectives ("heads") and their registry.

Importing this package registers the built-in objectives: ``mlm`` (encoder MLM, Drop your Decoder (Ma et al. 2024) eq. 3), ``bow``
(bag-of-words prediction, eq. 11–13), ``ae`` (auto-encoding decoder, eq. 4–5), ``ar`` (auto-regressive
decoder, eq. 6–7), ``enhanced`` (RetroMAE enhanced decoding, eq. 8–10), ``cpdae`` / ``mlm_views`` (CPDAE,
CPDAE (Ma et al. 2022)), ``ot_bow`` (DupMAE's ordinary-token bag of words, DupMAE (Xiao & Liu 2022)) and ``context_ae`` /
``context_ar`` / ``mlm_spans`` (CoT-MAE's contextual decoders, CoT-MoTE (Ma et al. 2023)). A new objective is one new module
here with a ``@register_objective`` class, plus its import below.
"""

from pretrieve.modeling.objectives.base import (BOTTLENECKS, OBJECTIVES, Objective, ObjectiveOutput, bottleneck,
                                                build_objective, check_objective_params, objective_class,
                                                objective_params, register_objective, token_prediction_loss)
from pretrieve.modeling.objectives.mlm import MaskedLanguageModeling
from pretrieve.modeling.objectives.bow import BagOfWords, bow_cross_entropy
from pretrieve.modeling.objectives.autoencoding import AutoEncodingDecoder
from pretrieve.modeling.objectives.autoregression import AutoRegressiveDecoder, causal_visibility
from pretrieve.modeling.objectives.enhanced import EnhancedDecoder
from pretrieve.modeling.objectives import cpdae  # noqa: E402,F401  (registers cpdae, mlm_views)
from pretrieve.modeling.objectives import ot_bow  # noqa: E402,F401  (registers ot_bow: DupMAE)
from pretrieve.modeling.objectives import contextual  # noqa: E402,F401  (context_ae, context_ar, mlm_spans: CoT-MAE)

__all__ = [
    "BOTTLENECKS", "OBJECTIVES", "AutoEncodingDecoder", "AutoRegressiveDecoder", "BagOfWords", "EnhancedDecoder",
    "MaskedLanguageModeling", "Objective", "ObjectiveOutput", "bottleneck", "bow_cross_entropy", "build_objective",
    "causal_visibility", "check_objective_params", "objective_class", "objective_params", "register_objective",
    "token_prediction_loss",
]

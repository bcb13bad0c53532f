"""The named pre-training methods (``--method bow``), as plain data in the method-file format (docs/methods.md).

Plain mappings, without torch, so that ``pretrieve pretrain --help`` lists them and a recipe can name them without
loading a model; :func:`pretrieve.train.method.preset` turns one into a validated
:class:`~pretrieve.train.method.MethodConfig` (checked against the objective and masker registries). A new preset
is one entry here (and its paper in docs/methods.md).
"""

from __future__ import annotations

from typing import Any

ENCODER_MASKER = {"kind": "wwm", "ratio": 0.3}
DECODER_MASKER = {"kind": "wwm", "ratio": 0.5}
"""The decoder masker a method gets when its objectives need one and it names none."""
_BERT_TOKEN_MASKER = {"kind": "token", "ratio": 0.15}   # CPDAE §3.1.1: "the masking strategy in BERT"
_BOW_DECAY = {"cosine_decay_to": 0.1}
_DUPMAE_QUERY = {"query_stream": "embeddings"}
_COTMOTE_DECODER = {"num_layers": 1, "direction_weights": [1.0, 0.0], "attention_window": 3}


def _cpdae(contrast: str) -> dict[str, Any]:
    return {"encoder_masker": _BERT_TOKEN_MASKER, "objectives": [
        "mlm_views", {"name": "cpdae", "params": {"contrast": contrast, "cl_weight": 0.1, "rec_reduction": "mean"}}]}


_CDMAE = {"encoder_masker": ENCODER_MASKER, "decoder_masker": {"kind": "pmi", "ratio": 0.5},
          "objectives": ["mlm", {"name": "ae", "params": {"num_layers": 2, "projection": True}}]}
_DUPMAE_OBJECTIVES = ["mlm", {"name": "enhanced", "params": _DUPMAE_QUERY}]
_COTMOTE = {"encoder_masker": ENCODER_MASKER, "context": {"kind": "pairs"}, "mote": True,
            "objectives": ["mlm_spans", {"name": "context_ar", "params": _COTMOTE_DECODER}]}

PRESETS: dict[str, dict[str, Any]] = {
    "mlm": {"encoder_masker": ENCODER_MASKER, "objectives": ["mlm"]},
    # BoW (Drop your Decoder, Ma et al. 2024): the authors' code decays the BoW weight by a cosine from 1 to 0.1
    # (objectives/bow.py)
    "bow": {"encoder_masker": ENCODER_MASKER, "objectives": ["mlm", {"name": "bow", "params": _BOW_DECAY}]},
    "ae": {"encoder_masker": ENCODER_MASKER, "decoder_masker": DECODER_MASKER,
           "objectives": ["mlm", {"name": "ae", "params": {"num_layers": 1}}]},
    "ar": {"encoder_masker": ENCODER_MASKER, "objectives": ["mlm", {"name": "ar", "params": {"num_layers": 1}}]},
    "retromae": {"encoder_masker": ENCODER_MASKER, "decoder_masker": DECODER_MASKER,
                 "objectives": ["mlm", "enhanced"]},
    "cpdae": _cpdae("js"),
    "cpdae-r": _cpdae("dense"),
    "cdmae": _CDMAE,
    # the matched control of CDMAE's "PMI masking > random masking": only the decoder masker differs
    "cdmae-random": {**_CDMAE, "decoder_masker": DECODER_MASKER},
    # DupMAE (Xiao & Liu 2022, §3.2 eq. 9, masks §4); "-code": the authors' OT-BoW variant and 0.1 weight
    # (ot_bow.py); both: the decoder query stream through the embedding layer, as the authors' modeling_duplex.py
    # (enhanced.py)
    "dupmae": {"encoder_masker": ENCODER_MASKER, "decoder_masker": DECODER_MASKER,
               "objectives": [*_DUPMAE_OBJECTIVES, "ot_bow"]},
    "dupmae-code": {"encoder_masker": ENCODER_MASKER, "decoder_masker": DECODER_MASKER,
                    "objectives": [*_DUPMAE_OBJECTIVES, {"name": "ot_bow", "weight": 0.1,
                                                         "params": {"variant": "code"}}]},
    # CoT-MAE (Wu et al. 2023): encoder 0.30, decoder 0.45, 2-layer AE decoder, mixed same-document spans
    "cotmae": {"encoder_masker": ENCODER_MASKER, "decoder_masker": {"kind": "wwm", "ratio": 0.45},
               "context": {"kind": "mixed"},
               "objectives": ["mlm_spans", {"name": "context_ae", "params": {"num_layers": 2}}]},
    # CoT-MoTE (Ma et al. 2023, §3.2, §4.1): passage/query pairs, 1-layer auto-regressive decoder generating the
    # query from the passage's [CLS] only (eq. 12), attention window 3 (CoT-MAE-qc's code), MoTE experts
    "cotmote": _COTMOTE,
    "cotmote-swap": {**_COTMOTE, "mote_swap": True},
    # TSDAE (Wang et al. 2021): sentence-transformers' DenoisingAutoEncoderLoss, trained by pretrieve.train.tsdae
    "tsdae": {"encoder_masker": {"ratio": 0.0}, "objectives": [], "trainer": "tsdae"},
}

"""Fine-tuning losses: InfoNCE with in-batch and cross-device negatives, cross-encoder KL distillation,
the reranker's listwise cross-entropy and the FLOPS sparsity regulariser.

These are plain functions of representations or scores, so the dual-encoder model and the trainer (built on
top of them) stay free of loss details, and any representation plugs in through ``score_fn``.

Batch layout (Tevatron's): ``q`` is ``[B, ...]``; ``p`` is ``[B·G, ...]`` where the ``G`` passages of query
``i`` are the contiguous rows ``p[i·G : (i+1)·G]``, the positive first (row ``i·G``) and then its ``G − 1``
hard negatives. So the positive of query ``i`` is candidate ``i·G`` of the batch.

Contrastive loss (CDMAE, Li et al. 2023, eq. 10; DupMAE (Xiao & Liu 2022) eq. 13–14)::

    L_cont = mean_i [ −s(q_i, d_i⁺)/τ + log Σ_{d ∈ C_i} exp(s(q_i, d)/τ) ]

with ``C_i`` = every passage of the batch (``in_batch=True``: the other queries' positives and hard
negatives become negatives, ``B·G − 1`` negatives per query, as in CDMAE (Li et al. 2023) §4.3 "Scaling Hard Negatives") or
only query ``i``'s own group (``in_batch=False``). With ``gather=True`` under ``torch.distributed`` the batch
is the concatenation of all processes' batches (cross-device negatives); see
:mod:`pretrieve.modeling.distributed` for the gradient scaling that makes that exact under DDP.

Scores and temperature. The papers use the plain dot product ``s(q, d) = q·d`` with τ = 1 (CDMAE, Li et al. 2023, §3.4,
DupMAE (Xiao & Liu 2022) eq. 13–15, Tevatron's default). Cosine similarity bounds ``s`` to [−1, 1], so with τ = 1 the
softmax can hardly separate a positive from negatives; use τ ≈ 0.01–0.05 with ``similarity="cos"`` (SimLM
0.01, BGE/FlagEmbedding 0.02, Contriever 0.05). ``temperature`` divides the scores in every loss here.

Custom scores. ``score_fn(q, p) -> [len(q), len(p)]`` replaces the built-in similarity for any
representation whose relevance is not a plain dot product of one vector — DupMAE's [CLS ; ordinary-token]
vector, a SPLADE-style sparse vector, a dense+sparse hybrid with weights. The representation must be a tensor
with one row per text (``gather`` concatenates along dim 0); pack several parts into one tensor and split
them inside ``score_fn``.

Under DDP every loss here without ``gather`` is a mean over this process's queries; DDP's gradient average
then equals the mean over all queries when every process holds the same number of queries (use
``drop_last``; with uneven batches the smaller one weighs more, as for any per-process loss).

Full-corpus loss (query-side fine-tuning, :mod:`pretrieve.train.query_side`): with the passage vectors frozen and
held as one matrix ``P`` (the whole corpus), :func:`full_corpus_loss` scores each query against every passage —
the exact softmax that in-batch negatives approximate — and averages over every (query, positive) pair
``−s(q_i, d⁺)/τ + log Σ_{d ∈ C ∖ D_i⁺ ∪ {d⁺}} exp(s(q_i, d)/τ)``, the query's other positives ``D_i⁺`` left out.

In-batch false negatives (the same passage in two queries' groups) are not masked, as in Tevatron, SimLM and
RetroMAE: the data pipeline should avoid them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from pretrieve.errors import ConfigError
from pretrieve.modeling.distributed import gather_with_grad, is_distributed, scale_grad, world_size
from pretrieve.precision import full_precision

Similarity = Literal["dot", "cos"]
SIMILARITIES: tuple[str, ...] = ("dot", "cos")
ScoreFn = Callable[[Tensor, Tensor], Tensor]
"""``score_fn(q, p)`` returns the ``[len(q), len(p)]`` relevance matrix of every query with every passage."""

ALPHA_PAPER_003 = 0.2
"""Weight of the contrastive term in the distillation stage (CDMAE, Li et al. 2023, §4.1, following SimLM)."""


# ---------------------------------------------------------------------------------------------- scores


def similarity_scores(q: Tensor, p: Tensor, similarity: Similarity = "dot") -> Tensor:
    """``[len(q), len(p)]`` matrix of dot products, or of cosine similarities (``similarity="cos"``)."""
    _check_similarity(similarity, None)
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"similarity '{similarity}' needs q [B, d] and p [N, d], got {tuple(q.shape)} and "
                         f"{tuple(p.shape)}; pass a score_fn for other representations")
    if similarity == "cos":
        q, p = F.normalize(q, dim=-1), F.normalize(p, dim=-1)
    return q @ p.T


def score_matrix(q: Tensor, p: Tensor, similarity: Similarity = "dot", score_fn: ScoreFn | None = None) -> Tensor:
    """Relevance of every query with every passage: ``score_fn(q, p)`` if given, else :func:`similarity_scores`.

    The shape of ``score_fn``'s result is checked (``[len(q), len(p)]``).
    """
    _check_similarity(similarity, score_fn)
    if score_fn is None:
        return similarity_scores(q, p, similarity)
    scores = score_fn(q, p)
    expected = (q.shape[0], p.shape[0])
    if scores.dim() != 2 or tuple(scores.shape) != expected:
        raise ValueError(f"score_fn must return a [len(q), len(p)] = {list(expected)} matrix, "
                         f"got {list(scores.shape)}")
    return scores


def group_size(q: Tensor, p: Tensor) -> int:
    """``G``, the number of passages per query (positive + hard negatives); checks ``len(p) == len(q)·G``."""
    if q.dim() == 0 or p.dim() == 0 or q.shape[0] == 0:
        raise ValueError(f"need at least one query and its passages, got q {tuple(q.shape)} and p {tuple(p.shape)}")
    if p.shape[0] == 0 or p.shape[0] % q.shape[0]:
        raise ValueError(f"{p.shape[0]} passages cannot be split into groups of equal size for {q.shape[0]} "
                         "queries: p must hold G passages per query, each query's group contiguous, positive first")
    return p.shape[0] // q.shape[0]


def positive_indices(num_queries: int, group_size: int, query_offset: int = 0,
                     device: torch.device | str | None = None) -> Tensor:
    """Column of each query's positive in a score matrix over a batch of groups: ``(query_offset + i)·G``.

    ``query_offset`` is the index of the first of these queries in the (gathered) batch — 0 for a local
    batch or for the full gathered batch, ``Σ_{s<r} B_s`` for rank ``r``'s queries scored against the
    passages of all ranks.
    """
    return (torch.arange(num_queries, device=device) + query_offset) * group_size


def own_group_scores(scores: Tensor, group_size: int, query_offset: int = 0) -> Tensor:
    """``[B, G]`` scores of each query with its own group, taken from a ``[B, N·G]`` score matrix (see
    :func:`positive_indices` for ``query_offset``). Column 0 is the positive."""
    starts = positive_indices(scores.shape[0], group_size, query_offset, device=scores.device)
    columns = starts[:, None] + torch.arange(group_size, device=scores.device)
    return scores.gather(1, columns)


def group_scores(q: Tensor, p: Tensor, similarity: Similarity = "dot", score_fn: ScoreFn | None = None) -> Tensor:
    """``[B, G]`` scores of each query with its own group only (no in-batch candidates), positive first."""
    size = group_size(q, p)
    _check_similarity(similarity, score_fn)
    if score_fn is not None:
        return own_group_scores(score_matrix(q, p, score_fn=score_fn), size)
    if q.dim() != 2 or p.dim() != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"similarity '{similarity}' needs q [B, d] and p [B·G, d], got {tuple(q.shape)} and "
                         f"{tuple(p.shape)}; pass a score_fn for other representations")
    if similarity == "cos":
        q, p = F.normalize(q, dim=-1), F.normalize(p, dim=-1)
    return torch.einsum("bd,bgd->bg", q, p.reshape(q.shape[0], size, q.shape[1]))


# ---------------------------------------------------------------------------------------------- losses


def contrastive_loss(q: Tensor, p: Tensor, temperature: float = 1.0, similarity: Similarity = "dot",
                     in_batch: bool = True, score_fn: ScoreFn | None = None, gather: bool = False,
                     scale_grad_by_world_size: bool = True) -> Tensor:
    """InfoNCE of each query's positive against its hard negatives (and in-batch negatives); mean over queries.

    Args:
        q: ``[B, ...]`` query representations.
        p: ``[B·G, ...]`` passage representations, query ``i``'s group contiguous, its positive first.
        temperature: τ dividing the scores (1 for dot products as in the papers; ≈0.01–0.05 for cosine).
        similarity: ``"dot"`` or ``"cos"``; ignored in favour of ``score_fn`` when that is given (then it
            must stay ``"dot"``, the default, to avoid an ambiguous call).
        in_batch: every passage of the batch is a candidate for every query (CDMAE, Li et al. 2023, eq. 10, DupMAE (Xiao & Liu 2022)
            eq. 14); False: only the query's own group (the positive and its hard negatives).
        score_fn: custom ``score_fn(q, p) -> [len(q), len(p)]``.
        gather: with ``in_batch`` under ``torch.distributed``, score the gathered queries against the gathered
            passages of every process (cross-device negatives). A no-op in a single process; ignored when
            ``in_batch`` is False (own groups do not interact across processes). It issues collectives, so
            every process must call the loss the same number of times.
        scale_grad_by_world_size: with ``gather``, multiply the gradient (not the value) by the world size
            ``W`` so that DDP's gradient average yields exactly the single-process gradient of the whole
            gathered batch (proof in :mod:`pretrieve.modeling.distributed`). Turn off only when gradients are
            summed, not averaged, across processes.

    Returns:
        The scalar loss. With ``gather`` it is the mean over all gathered queries — the same value on every
        process, equal to the loss of one process holding the whole batch.

    The choice of a ``gather`` flag over a separate ``distributed_contrastive_loss``: one function keeps the
    single-process and the multi-process runs on the same code path, and the flag defaults to False so that
    a loss computed on one rank only (evaluation, logging) never waits on a collective.
    """
    _check_temperature("temperature", temperature)
    _check_similarity(similarity, score_fn)
    _warn_if_cosine_without_temperature(similarity, score_fn, temperature)
    size = group_size(q, p)
    if not in_batch:
        return listwise_ce(group_scores(q, p, similarity, score_fn), temperature)
    if gather and is_distributed():
        all_q, all_p = gather_with_grad(q), gather_with_grad(p)
        if all_p.shape[0] != all_q.shape[0] * size:
            raise ValueError(f"processes use different group sizes: {all_p.shape[0]} gathered passages for "
                             f"{all_q.shape[0]} gathered queries (this process: G = {size})")
        loss = _in_batch_infonce(score_matrix(all_q, all_p, similarity, score_fn), size, temperature)
        return scale_grad(loss, world_size()) if scale_grad_by_world_size else loss
    return _in_batch_infonce(score_matrix(q, p, similarity, score_fn), size, temperature)


def distillation_loss(student_scores: Tensor, teacher_scores: Tensor, temperature: float = 1.0) -> Tensor:
    """``KL(P_teacher ‖ P_student)`` over each query's own group, summed over the group, mean over queries.

    ``P = softmax(scores / temperature)`` over the ``G`` candidates of each query (CDMAE, Li et al. 2023, eq. 11: the
    cross-encoder teacher scores only the query's positive and hard negatives, so no in-batch candidates).
    ``temperature`` divides both score sets (Hinton et al.'s soft targets; the papers use 1); there is no
    ``T²`` factor — multiply by it when sweeping T if comparable gradient magnitudes matter.

    Reduction, ``batchmean``: Σ_g p_t (log p_t − log p_s) for each query, averaged over the queries — eq. 11
    averaged over the batch, and what SimLM (``KLDivLoss(reduction="batchmean", log_target=True)``), which
    CDMAE (Li et al. 2023) follows, computes. The other reference implementations differ:
    RetroMAE/DupMAE's bi-encoder fine-tuning uses ``nn.KLDivLoss(reduction="mean")``, a mean over all B·G
    elements, i.e. this KL divided by ``G`` (a distillation term ``G`` times weaker against the contrastive
    one); FlagEmbedding's current ``kl_div`` is the soft-label cross-entropy −Σ p_t log p_s (DupMAE eq. 15),
    equal to this KL plus the teacher's entropy — same gradient, a value that does not reach 0.

    The teacher gets no gradient (its scores are detached): it is a fixed reranker's output.
    """
    _check_temperature("temperature", temperature)
    if student_scores.dim() != 2 or student_scores.shape != teacher_scores.shape:
        raise ValueError(f"student and teacher scores must both be [B, G], got {tuple(student_scores.shape)} "
                         f"and {tuple(teacher_scores.shape)}")
    student_log_p = F.log_softmax(_as_logits(student_scores, temperature), dim=-1)
    teacher_p = F.softmax(_as_logits(teacher_scores.detach(), temperature), dim=-1)
    return F.kl_div(student_log_p, teacher_p, reduction="batchmean")


class DistillationLoss(NamedTuple):
    """The stage-3 objective and its two terms (for logging): ``loss = kl + alpha · contrastive``."""

    loss: Tensor
    kl: Tensor
    contrastive: Tensor


def combined_distillation_loss(q: Tensor, p: Tensor, teacher_scores: Tensor, alpha: float = ALPHA_PAPER_003,
                               temperature: float = 1.0, teacher_temperature: float = 1.0,
                               similarity: Similarity = "dot", in_batch: bool = True,
                               score_fn: ScoreFn | None = None, gather: bool = False,
                               scale_grad_by_world_size: bool = True) -> DistillationLoss:
    """CDMAE's (Li et al. 2023) stage-3 loss ``L = L_kl + α · L_cont`` (eq. 10–11, α = 0.2 following SimLM).

    ``L_kl`` = :func:`distillation_loss` between the student's own-group scores ``s(q, d)/temperature`` and
    the teacher's ``teacher_scores / teacher_temperature`` (``[B, G]``, same layout as the groups: column 0
    is the positive); ``L_cont`` = :func:`contrastive_loss` with the same scores, temperature and options.
    With ``gather``, only ``L_cont`` uses cross-device negatives (and its gradient scaling); ``L_kl`` is a
    mean over this process's queries, which DDP averages.
    """
    if not math.isfinite(alpha) or alpha < 0:
        raise ConfigError(f"alpha (weight of the contrastive term) must be a finite number ≥ 0, got {alpha}")
    _check_temperature("temperature", temperature)
    _check_temperature("teacher_temperature", teacher_temperature)
    _check_similarity(similarity, score_fn)
    size = group_size(q, p)
    if teacher_scores.shape != (q.shape[0], size):
        raise ValueError(f"teacher_scores must be [B, G] = {[q.shape[0], size]}, got {list(teacher_scores.shape)}")
    _warn_if_cosine_without_temperature(similarity, score_fn, temperature)
    if in_batch and gather and is_distributed():
        student = group_scores(q, p, similarity, score_fn)
        contrastive = contrastive_loss(q, p, temperature=temperature, similarity=similarity, in_batch=True,
                                       score_fn=score_fn, gather=True,
                                       scale_grad_by_world_size=scale_grad_by_world_size)
    elif in_batch:  # one local score matrix serves both terms
        scores = score_matrix(q, p, similarity, score_fn)
        student = own_group_scores(scores, size)
        contrastive = _in_batch_infonce(scores, size, temperature)
    else:
        student = group_scores(q, p, similarity, score_fn)
        contrastive = listwise_ce(student, temperature)
    kl = distillation_loss(_as_logits(student, temperature), _as_logits(teacher_scores, teacher_temperature))
    return DistillationLoss(loss=kl + alpha * contrastive, kl=kl, contrastive=contrastive)


def full_corpus_loss(scores: Tensor, positives: Tensor, temperature: float = 1.0) -> Tensor:
    """The full-corpus softmax cross-entropy of the module docstring, averaged over the (query, positive) pairs.

    ``scores`` ``[B, N]``: each query's score against every passage of the corpus (``q · P``: normalised vectors
    make it the cosine; the caller computes it once and may reuse it); ``positives`` ``[B, M]``: the rows of each
    query's positives in the corpus, padded at the end with −1 (every query has at least one). Scores are divided
    by ``temperature``."""
    _check_temperature("temperature", temperature)
    if positives.dim() != 2 or positives.shape[0] != scores.shape[0]:
        raise ValueError(f"positives must be [B, M] with B = {scores.shape[0]}, got {tuple(positives.shape)}")
    present = positives >= 0
    if not bool(present[:, 0].all()):
        raise ValueError("every query needs at least one positive, in the first column")
    logits = scores / temperature                                             # [B, N]
    rows = torch.where(present, positives, positives[:, :1])                  # padding → the first positive
    positive_logits = logits.gather(1, rows)                                  # [B, M]
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter(1, rows, True)
    negatives = torch.logsumexp(logits.masked_fill(mask, float("-inf")), dim=1, keepdim=True)   # [B, 1]
    pair_losses = torch.logaddexp(negatives, positive_logits) - positive_logits
    return pair_losses[present].mean()


def listwise_ce(scores: Tensor, temperature: float = 1.0) -> Tensor:
    """Listwise cross-entropy of ``[B, G]`` scores with the positive in column 0; mean over queries.

    The cross-encoder reranker's loss (CDMAE, Li et al. 2023, §3.4: the retriever's contrastive loss with ``s_ce`` and no
    in-batch negatives; RetroMAE's reranker), and :func:`contrastive_loss` with ``in_batch=False``.
    """
    _check_temperature("temperature", temperature)
    if scores.dim() != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"scores must be [B, G] with B, G ≥ 1 (positive in column 0), got {tuple(scores.shape)}")
    targets = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
    return F.cross_entropy(_as_logits(scores, temperature), targets)


def flops_regularizer(reps: Tensor) -> Tensor:
    """FLOPS regulariser ``Σ_j (mean_i |w_ij|)²`` of a ``[B, V]`` batch of sparse representations.

    Paria et al. (2020), "Minimizing FLOPs to learn efficient sparse representations": the squared mean
    activation of each vocabulary term approximates the expected number of multiplications of an inverted-
    index dot product, so minimising it pushes whole terms to zero across the batch (unlike an L1 norm, which
    treats every entry alike). SPLADE (Formal et al., 2021) adds it separately for queries and documents,
    ``λ_q·FLOPS(q) + λ_d·FLOPS(d)`` with λ warmed up quadratically; the weights belong to the caller. SPLADE
    representations are non-negative already; ``|·|`` makes the definition hold for any sign. Under DDP it
    is computed per process (as SPLADE does): the square of a mean is not the mean of per-process squares.
    """
    if reps.dim() != 2 or reps.shape[0] == 0:
        raise ValueError(f"reps must be [B, V] with B ≥ 1, got {tuple(reps.shape)}")
    return reps.abs().mean(dim=0).pow(2).sum()


# ---------------------------------------------------------------------------------------------- helpers


def _in_batch_infonce(scores: Tensor, group_size: int, temperature: float) -> Tensor:
    """Cross-entropy of a ``[B, B·G]`` score matrix against each query's positive column ``i·G``."""
    targets = positive_indices(scores.shape[0], group_size, device=scores.device)
    return F.cross_entropy(_as_logits(scores, temperature), targets)


def _as_logits(scores: Tensor, temperature: float) -> Tensor:
    """``scores / temperature``, in float32 at least (a log-sum-exp in fp16/bf16 loses the small terms)."""
    scores = full_precision(scores)
    return scores / temperature if temperature != 1 else scores


def _check_temperature(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _check_similarity(similarity: str, score_fn: ScoreFn | None) -> None:
    if similarity not in SIMILARITIES:
        raise ConfigError(f"unknown similarity '{similarity}'; choose one of {', '.join(SIMILARITIES)} "
                          "or pass a score_fn")
    if score_fn is not None and similarity != "dot":
        raise ConfigError(f"similarity='{similarity}' and a score_fn were both given; the score_fn defines the "
                          "similarity (normalise inside it for cosine)")


def _warn_if_cosine_without_temperature(similarity: str, score_fn: ScoreFn | None, temperature: float) -> None:
    if similarity == "cos" and score_fn is None and temperature >= 0.5:
        warnings.warn(f"cosine similarity with temperature {temperature}: scores lie in [-1, 1], so the softmax "
                      "barely separates the positive; the usual temperature is 0.01-0.05", stacklevel=3)

"""Fine-tuning losses against hand computations on a tiny batch (single process).

The batch: 2 queries × (1 positive + 2 hard negatives), d = 3, small integers so every dot product is worked
out below by hand. Layout: passages 0–2 are query 0's group, 3–5 query 1's, positive first, so the
positives are candidates 0 and 3.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pretrieve.errors import ConfigError
from pretrieve.modeling.distributed import gather_with_grad, scale_grad
from pretrieve.modeling.losses import (
    DistillationLoss,
    combined_distillation_loss,
    contrastive_loss,
    distillation_loss,
    flops_regularizer,
    group_scores,
    listwise_ce,
    own_group_scores,
    positive_indices,
    similarity_scores,
)

Q = torch.tensor([[1.0, 0.0, 2.0],
                  [0.0, 1.0, -1.0]], dtype=torch.float64)
P = torch.tensor([[1.0, 1.0, 0.0],    # query 0: positive
                  [0.0, 0.0, 1.0],    #          hard negative
                  [2.0, -1.0, 0.0],   #          hard negative
                  [0.0, 2.0, -1.0],   # query 1: positive
                  [1.0, 0.0, 0.0],    #          hard negative
                  [0.0, 1.0, 1.0]],   #          hard negative
                 dtype=torch.float64)
# q·p by hand, e.g. q0·p1 = 0·0 + 0·0 + 2·1 = 2, q1·p3 = 0·0 + 1·2 + (−1)(−1) = 3
DOT = [[1.0, 2.0, 2.0, -2.0, 1.0, 2.0],
       [1.0, -1.0, -1.0, 3.0, 0.0, 0.0]]
# cosines: |q0| = √5, |q1| = √2; |p| = √2, 1, √5, √5, 1, √2
COS = [[1 / math.sqrt(10), 2 / math.sqrt(5), 2 / 5, -2 / 5, 1 / math.sqrt(5), 2 / math.sqrt(10)],
       [1 / 2, -1 / math.sqrt(2), -1 / math.sqrt(10), 3 / math.sqrt(10), 0.0, 0.0]]
TARGETS = [0, 3]
TEACHER = torch.tensor([[3.0, 1.0, 0.5],
                        [2.0, 2.5, -1.0]], dtype=torch.float64)


def hand_infonce(scores: list[list[float]], candidates: list[list[int]], temperature: float = 1.0) -> float:
    """mean_i [ −s_i,target/τ + log Σ_{j ∈ candidates_i} exp(s_ij/τ) ], the log-sum-exp written out."""
    losses = []
    for row, target, columns in zip(scores, TARGETS, candidates):
        log_sum_exp = math.log(sum(math.exp(row[j] / temperature) for j in columns))
        losses.append(-row[target] / temperature + log_sum_exp)
    return sum(losses) / len(losses)


def hand_kl(student: list[list[float]], teacher: list[list[float]]) -> float:
    """batchmean KL(P_t ‖ P_s): Σ_g p_t (log p_t − log p_s) per query, mean over queries."""
    total = 0.0
    for s_row, t_row in zip(student, teacher):
        s_norm = sum(math.exp(s) for s in s_row)
        t_norm = sum(math.exp(t) for t in t_row)
        p_s = [math.exp(s) / s_norm for s in s_row]
        p_t = [math.exp(t) / t_norm for t in t_row]
        total += sum(pt * (math.log(pt) - math.log(ps)) for pt, ps in zip(p_t, p_s))
    return total / len(student)


ALL_SIX = [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]
OWN_GROUP = [[0, 1, 2], [3, 4, 5]]
STUDENT_OWN = [[DOT[0][j] for j in OWN_GROUP[0]], [DOT[1][j] for j in OWN_GROUP[1]]]   # [[1,2,2],[3,0,0]]


def test_score_matrices_match_the_hand_products():
    torch.testing.assert_close(similarity_scores(Q, P), torch.tensor(DOT, dtype=torch.float64))
    torch.testing.assert_close(similarity_scores(Q, P, "cos"), torch.tensor(COS, dtype=torch.float64))
    assert positive_indices(2, 3).tolist() == TARGETS
    assert group_scores(Q, P).tolist() == STUDENT_OWN


def test_in_batch_infonce_equals_hand_computation():
    # query 0: −1 + log(e¹ + e² + e² + e⁻² + e¹ + e²); query 1: −3 + log(e¹ + e⁻¹ + e⁻¹ + e³ + e⁰ + e⁰)
    expected = hand_infonce(DOT, ALL_SIX)
    assert expected == pytest.approx(((-1 + math.log(2 * math.e + 3 * math.e ** 2 + math.e ** -2))
                                      + (-3 + math.log(math.e + 2 / math.e + math.e ** 3 + 2))) / 2, abs=1e-12)
    assert contrastive_loss(Q, P).item() == pytest.approx(expected, abs=1e-6)


def test_own_group_infonce_equals_hand_computation():
    expected = hand_infonce(DOT, OWN_GROUP)   # −1 + log(e¹+e²+e²), −3 + log(e³+e⁰+e⁰)
    assert contrastive_loss(Q, P, in_batch=False).item() == pytest.approx(expected, abs=1e-6)
    assert expected < hand_infonce(DOT, ALL_SIX)   # in-batch candidates only add negatives


def test_cosine_with_temperature_equals_hand_computation():
    for in_batch, candidates in [(True, ALL_SIX), (False, OWN_GROUP)]:
        expected = hand_infonce(COS, candidates, temperature=0.05)
        loss = contrastive_loss(Q, P, temperature=0.05, similarity="cos", in_batch=in_batch)
        assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_dot_with_temperature_divides_every_score():
    assert contrastive_loss(Q, P, temperature=2.0).item() == pytest.approx(hand_infonce(DOT, ALL_SIX, 2.0), abs=1e-6)


def test_score_fn_replaces_the_similarity():
    doubled = contrastive_loss(Q, P, score_fn=lambda q, p: 2 * q @ p.T)
    torch.testing.assert_close(doubled, contrastive_loss(Q, P, temperature=0.5))

    def split_score(q, p):   # a DupMAE-like [dense ; lexical] vector with a weighted second part
        return q[:, :2] @ p[:, :2].T + 0.5 * q[:, 2:] @ p[:, 2:].T

    expected_scores = [[DOT[i][j] - 0.5 * Q[i, 2].item() * P[j, 2].item() for j in range(6)] for i in range(2)]
    for in_batch, candidates in [(True, ALL_SIX), (False, OWN_GROUP)]:
        loss = contrastive_loss(Q, P, in_batch=in_batch, score_fn=split_score)
        assert loss.item() == pytest.approx(hand_infonce(expected_scores, candidates), abs=1e-6)


def test_gradient_reaches_queries_and_passages():
    q, p = Q.clone().requires_grad_(), P.clone().requires_grad_()
    contrastive_loss(q, p).backward()
    # d/dq_i = −p_target + Σ_j softmax_ij p_j, written out for query 0
    weights = torch.softmax(torch.tensor(DOT[0], dtype=torch.float64), dim=0)
    torch.testing.assert_close(q.grad[0], (-P[0] + weights @ P) / 2)
    assert p.grad.abs().sum() > 0


def test_kl_equals_hand_computation():
    expected = hand_kl(STUDENT_OWN, TEACHER.tolist())
    student = torch.tensor(STUDENT_OWN, dtype=torch.float64)
    assert distillation_loss(student, TEACHER).item() == pytest.approx(expected, abs=1e-6)
    halved = hand_kl([[s / 2 for s in row] for row in STUDENT_OWN], (TEACHER / 2).tolist())
    assert distillation_loss(student, TEACHER, temperature=2.0).item() == pytest.approx(halved, abs=1e-6)
    assert distillation_loss(TEACHER, TEACHER).item() == pytest.approx(0.0, abs=1e-12)


def test_kl_gives_no_gradient_to_the_teacher():
    student = torch.tensor(STUDENT_OWN, dtype=torch.float64, requires_grad=True)
    teacher = TEACHER.clone().requires_grad_()
    distillation_loss(student, teacher).backward()
    assert teacher.grad is None and student.grad is not None


def test_combined_loss_is_kl_plus_point_two_contrastive():
    kl, ce = hand_kl(STUDENT_OWN, TEACHER.tolist()), hand_infonce(DOT, ALL_SIX)
    out = combined_distillation_loss(Q, P, TEACHER)
    assert isinstance(out, DistillationLoss)
    assert out.kl.item() == pytest.approx(kl, abs=1e-6)
    assert out.contrastive.item() == pytest.approx(ce, abs=1e-6)
    assert out.loss.item() == pytest.approx(kl + 0.2 * ce, abs=1e-6)
    own = combined_distillation_loss(Q, P, TEACHER, alpha=1.0, in_batch=False)
    assert own.loss.item() == pytest.approx(kl + hand_infonce(DOT, OWN_GROUP), abs=1e-6)


def test_combined_loss_applies_the_temperatures():
    out = combined_distillation_loss(Q, P, TEACHER, temperature=0.05, teacher_temperature=2.0, similarity="cos")
    student = [[COS[i][j] / 0.05 for j in OWN_GROUP[i]] for i in range(2)]
    kl = hand_kl(student, (TEACHER / 2).tolist())
    assert out.kl.item() == pytest.approx(kl, abs=1e-6)
    assert out.loss.item() == pytest.approx(kl + 0.2 * hand_infonce(COS, ALL_SIX, 0.05), abs=1e-6)


def test_listwise_ce_equals_torch_cross_entropy():
    scores = torch.randn(5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(listwise_ce(scores), F.cross_entropy(scores, torch.zeros(5, dtype=torch.long)))
    torch.testing.assert_close(listwise_ce(scores, temperature=0.1),
                               F.cross_entropy(scores / 0.1, torch.zeros(5, dtype=torch.long)))
    torch.testing.assert_close(listwise_ce(group_scores(Q, P)), contrastive_loss(Q, P, in_batch=False))


def test_flops_regularizer_equals_hand_computation():
    reps = torch.tensor([[0.0, 1.0, 2.0],
                         [3.0, -1.0, 0.0]])
    # mean |w| per term: 1.5, 1, 1 → 1.5² + 1² + 1² = 4.25
    assert flops_regularizer(reps).item() == pytest.approx(4.25, abs=1e-6)
    w = reps.clone().requires_grad_()
    flops_regularizer(w).backward()
    # ∂/∂w_ij = 2·mean_j · sign(w_ij) / B
    torch.testing.assert_close(w.grad, torch.tensor([[0.0, 1.0, 1.0], [1.5, -1.0, 0.0]]))


def test_own_group_scores_follow_the_query_offset():
    scores = torch.arange(2 * 12, dtype=torch.float64).view(2, 12)   # 2 queries of a 4-query gathered batch, G=3
    assert own_group_scores(scores, 3, query_offset=2).tolist() == [[6, 7, 8], [21, 22, 23]]
    assert positive_indices(2, 3, query_offset=2).tolist() == [6, 9]


def test_low_precision_scores_are_reduced_in_float32():
    loss = contrastive_loss(Q.to(torch.bfloat16), P.to(torch.bfloat16))
    assert loss.dtype == torch.float32


def test_single_process_gather_is_a_no_op():
    t = torch.randn(3, 2, requires_grad=True)
    assert gather_with_grad(t) is t
    assert contrastive_loss(Q, P, gather=True).item() == pytest.approx(hand_infonce(DOT, ALL_SIX), abs=1e-6)


def test_scale_grad_keeps_the_value_and_scales_the_gradient():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = scale_grad(x * 3, 4.0)
    assert y.tolist() == [3.0, -6.0]
    y.sum().backward()
    assert x.grad.tolist() == [12.0, 12.0]


def test_cosine_with_unit_temperature_warns():
    with pytest.warns(UserWarning, match="temperature"):
        contrastive_loss(Q, P, similarity="cos")


@pytest.mark.parametrize("kwargs", [dict(similarity="l2"), dict(temperature=0.0), dict(temperature=float("nan")),
                                    dict(similarity="cos", score_fn=lambda q, p: q @ p.T)])
def test_bad_options_raise_config_errors(kwargs):
    with pytest.raises(ConfigError):
        contrastive_loss(Q, P, **kwargs)


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="groups"):
        contrastive_loss(Q, P[:5])
    with pytest.raises(ValueError, match="score_fn"):
        contrastive_loss(Q, P, score_fn=lambda q, p: q @ p[:3].T)
    with pytest.raises(ValueError, match="teacher"):
        combined_distillation_loss(Q, P, TEACHER[:, :2])
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="alpha"):
        combined_distillation_loss(Q, P, TEACHER, alpha=-1.0)

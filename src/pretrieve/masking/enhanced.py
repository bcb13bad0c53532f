"""Position-specific attention masks of RetroMAE's enhanced decoding (two-stream decoder).

This module owns the [B, L, L] visibility matrices of the enhanced decoder (RetroMAE, DupMAE (Xiao & Liu 2022)
§3.1 eq. 5; Drop your Decoder (Ma et al. 2024) eq. 8-10): the query stream at position ``i`` reconstructs token ``x_i`` from
the sentence embedding (position 0) and a random sample ``s(X_{≠i})`` of the other tokens, never from
itself.

Rule implemented (``True`` = visible), for a sequence with ``n`` valid (non-pad) positions:

* Every valid row ``i`` sees exactly ``v`` positions, the diagonal never, padding columns never.
* With ``visible_ratio = r``: ``v = n - 1 - round((1 - r) * n)``, i.e. each row hides its own
  position plus ``round(p * n)`` others, where ``p = 1 - r`` is the *decoder mask ratio*. This is the
  authors' rule: in RetroMAE's collator (staoxiao/RetroMAE ``src/pretrain/data.py``,
  ``RetroMAECollator``) each row takes a whole-word mask drawn with ``decoder_mlm_probability``
  (default 0.5 in its ``arguments.py`` and README, so ``visible_ratio=0.5`` reproduces it), whose
  size is ``max(1, round(p * n))`` tokens (Hugging Face 4.x ``_whole_word_mask``, ``n`` counting
  [CLS]/[SEP]), then also hides its own position (``mask[i] = 1``). Here the ``max(1, .)`` is dropped
  so that ``visible_ratio=1`` means "see every other position". With ``num_visible = k``: ``v = k``.
  Either way ``v`` is clipped to
  ``[1, n - 1]`` when ``n >= 2`` (so no valid row is ever fully masked) and is 0 when ``n < 2``
  (a lone [CLS] has nothing else to see; its row is all False).
* Rows ``i != 0`` always see position 0 (the sentence-embedding slot, eq. 5 ``j|i≠0 = 0``): it is one
  of their ``v`` positions, the other ``v - 1`` are drawn uniformly among the valid positions other
  than 0 and ``i``.
* Row 0 is sampled like any other row (``v`` positions drawn uniformly among the valid positions
  1..n-1): the reference does the same (its row 0 hides only itself plus the sampled mask), and
  its decoder label at position 0 is -100, so row 0 is never trained on; it just must not be empty.

Deliberate deviations from the reference, for a vectorised O(B·L²) construction:

* Tokens, not whole words, are hidden (the reference's per-row mask is a whole-word mask, which
  under-fills the budget by a fraction of a word).
* The reference never hides [SEP] (its whole-word sampler skips [CLS]/[SEP]); here the last valid
  position is an ordinary candidate, since only the attention mask is known.
* The reference draws each row's mask from a pool of ``min(n, 256)`` masks with replacement (so
  about a third of the rows reuse a mask another row already drew); here each row's set is an exact
  uniform sample (rows of one sequence are correlated with the default ``cyclic`` sampler, as the
  reference's are; the ``independent`` sampler makes them independent at ~15× the cost).
* The number hidden is exactly ``round(p * n)``, also for rows whose own position the reference's
  sampled mask would have covered (there the reference hides one fewer).

Padding is assumed on the right (position 0 is the [CLS] slot of every non-empty sequence); with
left padding, column 0 is a padding column and is simply never visible.

Two samplers build the same per-row distribution (each valid row's sampled set is exactly a
uniform random subset of the right size); they differ in how rows relate to each other:

* ``"independent"`` (eq. 5 read most literally): every row is sampled independently. Random
  scores over [B, L, L]; ineligible entries (padding, diagonal) get a score that never wins;
  column 0 of rows ``i != 0`` a score that always wins; the ``v`` smallest scores of each row are
  kept with one ``kthvalue`` over the batch (rows needing fewer than the batch maximum get "filler"
  entries from their own ineligible columns, so one k serves every row). Rows hit by a float tie at
  the threshold (rare) are redone exactly by ranking. About 35 ms for 128 x 150 on 2 CPU threads
  (55 ms on 1), dominated by the [B, L, L] random numbers and the ``kthvalue`` selection: about
  30x the 1.2-1.5 ms of ``RandomMasker`` on the same batch.
* ``"cyclic"`` (default: the mask alone costs 2–3× a random-masking call instead of ~30×, and a
  whole enhanced-decoding collation stays at ~1.5× a plain MLM collation — docs/benchmarks.md): one
  random cyclic order of the candidate positions per *sequence*; row ``i`` keeps
  the first positions of that order, read from an independent random offset, skipping ``i``.
  A uniformly random cyclic order read from any offset, with one element removed, is a uniformly
  random order of the rest, so each row's set is still a uniform random subset of the valid
  positions other than 0 and ``i``; but rows of one sequence see windows of the same order, so they
  are correlated (the reference's rows are correlated too: they share a pool of masks). Only
  [B, L] random numbers and a few integer passes over [B, L, L]: 2.2-2.8 ms for 128 x 150,
  about 1.5-2x ``RandomMasker``.

No Python loop over rows in either.
"""

from __future__ import annotations

import torch

from pretrieve.errors import ConfigError, InputError

_FILLER = -2.0  # ineligible entries that pad a row's count up to the batch-wide k (never visible)
_FORCED = -1.0  # column 0 of rows i != 0: always among the kept entries
_NEVER = 2.0  # ineligible entries: padding columns, the diagonal, padding rows
SAMPLERS = ("independent", "cyclic")


def enhanced_decoding_mask(attention_mask: torch.Tensor, visible_ratio: float | None = None,
                           num_visible: int | None = None, generator: torch.Generator | None = None,
                           *, sampler: str = "cyclic") -> torch.Tensor:
    """Position-specific visibility BoolTensor[B, L, L] (row = query position, True = may attend).

    Give exactly one of ``visible_ratio`` (fraction of the sequence each row sees, ``1 - decoder mask
    ratio``; RetroMAE uses 0.5) or ``num_visible`` (positions each row sees). ``sampler`` is
    ``"independent"`` (rows sampled independently) or ``"cyclic"`` (faster, rows of a sequence
    correlated). See the module docstring for the exact rule and its source. All randomness comes
    from ``generator``.
    """
    if sampler not in SAMPLERS:
        raise ConfigError(f"unknown enhanced-decoding sampler '{sampler}'; choose from {list(SAMPLERS)}")
    valid = _checked_attention_mask(attention_mask)
    visible_count = visible_per_row(valid.sum(dim=1), visible_ratio, num_visible)
    if valid.numel() == 0:
        return torch.zeros(*valid.shape, valid.shape[1], dtype=torch.bool, device=valid.device)
    if sampler == "cyclic":
        return _cyclic_windows(valid, visible_count, generator)
    batch, length = valid.shape
    scores = torch.rand(batch, length, length, generator=generator, device=valid.device)
    return _keep_smallest(scores, _eligible(valid), valid, visible_count)


def visible_per_row(n_valid: torch.Tensor, visible_ratio: float | None = None,
                    num_visible: int | None = None) -> torch.Tensor:
    """Positions each valid row sees (LongTensor[B]) for sequences of ``n_valid`` valid positions."""
    if (visible_ratio is None) == (num_visible is None):
        raise ConfigError("give exactly one of visible_ratio and num_visible")
    n_valid = n_valid.long()
    if visible_ratio is not None:
        ratio = float(visible_ratio)
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"visible_ratio must be in [0, 1], got {visible_ratio}")
        hidden = torch.round(n_valid.to(torch.float64) * (1.0 - ratio)).long()
        count = n_valid - 1 - hidden
    else:
        if int(num_visible) != num_visible or num_visible < 1:
            raise ConfigError(f"num_visible must be a positive integer, got {num_visible}")
        count = torch.full_like(n_valid, int(num_visible))
    count = torch.minimum(count.clamp(min=1), n_valid - 1)
    return torch.where(n_valid >= 2, count, 0)


def to_additive_mask(visible: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention mask [B, 1, L, L]: 0 where visible, the dtype's most negative value elsewhere.

    The finite minimum (not -inf), as in Hugging Face's extended attention masks, keeps a fully
    masked row (padding) at a uniform softmax instead of NaN.
    """
    if visible.dim() != 3 or visible.dtype != torch.bool:
        raise InputError(f"visible must be a BoolTensor[B, L, L], got {visible.dtype} of shape "
                         f"{tuple(visible.shape)}", field="visible")
    if not dtype.is_floating_point:
        raise ConfigError(f"an additive attention mask needs a floating dtype, got {dtype}")
    additive = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    additive.masked_fill_(~visible, torch.finfo(dtype).min)
    return additive.unsqueeze(1)


def _checked_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    if attention_mask.dim() != 2:
        raise InputError(f"attention_mask must be a [batch, length] tensor, got shape "
                         f"{tuple(attention_mask.shape)}", field="attention_mask")
    return attention_mask.to(torch.bool)


def _eligible(valid: torch.Tensor) -> torch.Tensor:
    """BoolTensor[B,L,L]: row i and column j valid and j != i (column 0 included)."""
    length = valid.shape[1]
    off_diagonal = ~torch.eye(length, dtype=torch.bool, device=valid.device)
    return valid.unsqueeze(2) & valid.unsqueeze(1) & off_diagonal


def _keep_smallest(scores: torch.Tensor, eligible: torch.Tensor, valid: torch.Tensor,
                   visible_count: torch.Tensor) -> torch.Tensor:
    """Keep, in each valid row, column 0 (rows i != 0) plus the smallest-scored eligible columns.

    ``scores`` FloatTensor[B,L,L] in [0, 1) is overwritten. Each valid row of sequence b keeps
    exactly ``visible_count[b]`` columns.
    """
    scores.masked_fill_(~eligible, _NEVER)
    scores[:, 1:, 0].masked_fill_(eligible[:, 1:, 0], _FORCED)
    k = int(visible_count.max()) if visible_count.numel() else 0
    if k == 0:
        return torch.zeros_like(eligible)
    need = k - visible_count  # fillers per row of each sequence
    if bool((need > scores.shape[2] - valid.sum(dim=1) + 1).any()):
        return _keep_smallest_by_rank(scores, eligible, visible_count.view(-1, 1).expand(valid.shape))
    scores.masked_fill_(_fillers(valid, need), _FILLER)
    threshold = scores.kthvalue(k, dim=2, keepdim=True).values
    visible = (scores <= threshold) & eligible
    return _fix_ties(visible, scores, eligible, valid, visible_count)


def _fillers(valid: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """BoolTensor[B,L,L]: per row, ``need[b]`` ineligible entries (the diagonal, then the first pad columns)."""
    batch, length = valid.shape
    diagonal = torch.eye(length, dtype=torch.bool, device=valid.device).unsqueeze(0)
    pad_rank = torch.cumsum(~valid, dim=1) - 1  # 0, 1, ... over padding columns
    pad_fillers = ~valid & (pad_rank < (need - 1).unsqueeze(1))  # [B, L] columns
    return (diagonal & (need > 0).view(batch, 1, 1)) | pad_fillers.unsqueeze(1)


def _fix_ties(visible: torch.Tensor, scores: torch.Tensor, eligible: torch.Tensor, valid: torch.Tensor,
              visible_count: torch.Tensor) -> torch.Tensor:
    """Redo by exact ranking the (rare) rows where equal float scores at the threshold kept too many."""
    expected = torch.where(valid, visible_count.unsqueeze(1), 0)
    wrong = visible.sum(dim=2) != expected
    if bool(wrong.any()):
        rows = wrong.nonzero(as_tuple=True)
        visible[rows] = _keep_smallest_by_rank(scores[rows], eligible[rows], expected[rows])
    return visible


def _keep_smallest_by_rank(scores: torch.Tensor, eligible: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Exact top-``count`` smallest scores per row by sorting (any leading shape, last dim = columns).

    Ineligible entries (fillers included) are first reset to ``_NEVER``, so ``count`` counts eligible
    entries only; column 0's forced score makes it come first among them. Ties keep column order.
    """
    scores = torch.where(eligible, scores, _NEVER)
    order = torch.argsort(scores, dim=-1, stable=True)
    rank = torch.empty_like(order)
    positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(order)
    rank.scatter_(-1, order, positions)
    return (rank < count.unsqueeze(-1)) & eligible


def _cyclic_windows(valid: torch.Tensor, visible_count: torch.Tensor,
                    generator: torch.Generator | None) -> torch.Tensor:
    """The ``"cyclic"`` sampler: windows of one random cyclic order per sequence (see module docstring).

    Candidates ``C`` = valid positions except 0 (``m`` of them). ``place[b, j]`` is j's place in a
    random order of ``C``; row i reads that order cyclically from a random offset ``s_i``:
    ``sigma_ij = (place_j - s_i) mod m``, and keeps the ``q_i`` first candidates other than i. When i
    itself falls among the first ``q_i`` places (``sigma_ii < q_i``) the window grows by one so that
    it still holds ``q_i`` others; the diagonal is cleared afterwards. So row i keeps
    ``sigma_ij < q_i + [sigma_ii < q_i]``, a per-row threshold. Comparisons over [B, L, L] use sign
    bits of integer differences: on CPU, comparisons producing booleans cost several times more than
    integer arithmetic.
    """
    batch, length = valid.shape
    device = valid.device
    dtype, sign_shift = (torch.int16, 15) if length < 8192 else (torch.int32, 31)
    far = 2 * length + 2  # a place no window reaches, even after subtracting an offset
    columns = torch.arange(length, device=device)
    candidate = valid & (columns != 0)
    size = candidate.sum(dim=1, keepdim=True)

    key = torch.rand(batch, length, generator=generator, device=device).masked_fill_(~candidate, 2.0)
    place = torch.empty(batch, length, dtype=torch.long, device=device)
    place.scatter_(1, key.argsort(dim=1), columns.expand(batch, length))
    place.masked_fill_(~candidate, far)
    offset = (torch.rand(batch, length, generator=generator, device=device) * size).long()

    forced = (columns != 0) & valid[:, :1]  # rows whose column 0 is forced visible
    quota = torch.where(valid, visible_count.unsqueeze(1) - forced.long(), 0).clamp_(min=0)
    own = torch.where(candidate, torch.remainder(place - offset, size.clamp(min=1)), far)
    threshold = quota + (own < quota).long()

    sigma = place.to(dtype).unsqueeze(1) - offset.to(dtype).unsqueeze(2)  # [B, L(row), L(column)]
    sigma += (sigma >> sign_shift) & size.to(dtype).unsqueeze(2)  # negatives wrap around: mod m
    sigma -= threshold.to(dtype).unsqueeze(2)
    sigma >>= sign_shift  # -1 exactly where sigma < threshold
    keep = sigma.bool()
    keep.diagonal(dim1=1, dim2=2).fill_(False)
    keep[:, :, 0] = valid & forced
    return keep

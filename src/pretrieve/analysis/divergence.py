"""Query–passage embedding divergence and t-SNE plots (CoT-MoTE, Ma et al. 2023, §2.2, §5.3, Appendix A.1).

The paper encodes 400 query–passage pairs with a dual encoder and asks how far apart the query and passage
embedding *distributions* are (Table 1, Figure 4): a t-SNE map with cosine distance (Figures 2 and 4 A) and KL/JS
divergences between the two distributions (Figure 4 B). Appendix A.1, followed step by step here:

1. **Distances (eq. 14).** The cosine distance ``1 − cos(x, y)`` between every two of the ``2N`` embeddings
   (queries and passages together): :func:`cosine_distance_matrix`.
2. **2-D map.** t-SNE on that precomputed distance matrix ("the cosine similarity is used as the distance
   measure", §2.2): :func:`tsne_points` (scikit-learn's Barnes–Hut t-SNE, perplexity 30,
   random initialisation — the one sklearn allows with precomputed distances — and a fixed seed).
3. **Densities (eq. 15–16).** A Gaussian kernel density estimate in the 2-D space, one fitted on the query points
   and one on the passage points (``scipy.stats.gaussian_kde``, Scott's bandwidth), each evaluated at all ``2N``
   points and normalised to a discrete distribution ``P_q``, ``P_p`` over them: :func:`kde_distributions`.
   (The printed equations are lost in our copy of the paper; evaluating both densities on the pooled points is
   our reading of "the Gaussian probability distribution of each point of q-p pairs".)
4. **KL (eq. 17)** ``KL(P_q ‖ P_p) = Σ P_q log(P_q / P_p)`` ("query-to-passage", computed as an entropy —
   scipy's ``entropy(pk, qk)``), and **JS (eq. 18–19)** ``½ KL(P_q ‖ M) + ½ KL(P_p ‖ M)`` with
   ``M = ½(P_q + P_p)``, natural logarithms.

Small values mean overlapping query and passage distributions (the paper: siamese 7.2e-5 / 1.8e-5, fully
separate 1.4e-4 / 3.5e-5 on MS MARCO with BERT-base; the absolute scale depends on the KDE bandwidth and on N,
so compare encoders at the same N and seed). :func:`plot_tsne` draws one panel per encoder (PNG).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pretrieve.errors import ConfigError

DEFAULT_PAIRS = 400


@dataclass
class DivergenceResult:
    """KL/JS of one encoder's query and passage embeddings, and the t-SNE points they were computed on."""

    kl: float
    js: float
    query_points: np.ndarray
    passage_points: np.ndarray

    def as_dict(self) -> dict[str, float]:
        return {"kl": self.kl, "js": self.js, "pairs": int(len(self.query_points))}


def cosine_distance_matrix(vectors: np.ndarray) -> np.ndarray:
    """Eq. 14: ``1 − cos`` between all rows of ``vectors [M, D]`` → ``[M, M]`` (zero diagonal, clipped at 0)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ConfigError("an embedding is the zero vector: its cosine distance is undefined")
    unit = vectors / norms
    distance = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    np.fill_diagonal(distance, 0.0)
    return distance


def tsne_points(queries: np.ndarray, passages: np.ndarray, seed: int = 0,
                perplexity: float = 30.0) -> tuple[np.ndarray, np.ndarray]:
    """2-D t-SNE of queries and passages together on their cosine distances → ``(query [N, 2], passage [N', 2])``."""
    from sklearn.manifold import TSNE  # lazy: sklearn

    queries, passages = np.asarray(queries), np.asarray(passages)
    stacked = np.concatenate([queries, passages])
    perplexity = min(perplexity, (len(stacked) - 1) / 3)
    points = TSNE(n_components=2, metric="precomputed", init="random", perplexity=perplexity,
                  random_state=seed).fit_transform(cosine_distance_matrix(stacked))
    return points[:len(queries)], points[len(queries):]


def kde_distributions(query_points: np.ndarray, passage_points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 15–16: query and passage Gaussian KDEs evaluated at all points, each normalised to sum 1."""
    from scipy.stats import gaussian_kde  # lazy: scipy

    pooled = np.concatenate([query_points, passage_points]).T
    p_query = gaussian_kde(np.asarray(query_points).T)(pooled)
    p_passage = gaussian_kde(np.asarray(passage_points).T)(pooled)
    return p_query / p_query.sum(), p_passage / p_passage.sum()


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """``Σ p log(p / q)`` of two discrete distributions (normalised here; terms with ``p = 0`` are 0)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    keep = p > 0
    if (q[keep] == 0).any():
        return float("inf")
    return float(np.sum(p[keep] * np.log(p[keep] / q[keep])))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """``½ KL(p ‖ m) + ½ KL(q ‖ m)``, ``m = ½(p + q)`` (symmetric, at most log 2)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    middle = (p + q) / 2
    return 0.5 * kl_divergence(p, middle) + 0.5 * kl_divergence(q, middle)


def embedding_divergence(queries: np.ndarray, passages: np.ndarray, seed: int = 0,
                         perplexity: float = 30.0) -> DivergenceResult:
    """Appendix A.1 end to end for one encoder's query and passage embeddings (see the module docstring)."""
    if len(queries) < 4 or len(passages) < 4:
        raise ConfigError("the divergence needs at least 4 queries and 4 passages")
    query_points, passage_points = tsne_points(queries, passages, seed=seed, perplexity=perplexity)
    p_query, p_passage = kde_distributions(query_points, passage_points)
    return DivergenceResult(kl=kl_divergence(p_query, p_passage), js=js_divergence(p_query, p_passage),
                            query_points=query_points, passage_points=passage_points)


def sample_pairs(collection, split: str, count: int = DEFAULT_PAIRS, seed: int = 0) -> list[tuple[str, str]]:
    """``count`` (query, relevant passage) text pairs of a BEIR collection's ``split``, drawn with ``seed``: each
    query with its first relevant document first, further relevant documents only when queries run out."""
    corpus = collection.load_corpus()
    queries = collection.load_queries(split)
    first, further = [], []
    for qid, judged in collection.load_qrels(split).items():
        relevant = [doc for doc, grade in judged.items() if grade > 0 and doc in corpus]
        if qid not in queries or not relevant:
            continue
        pairs = [(queries[qid], corpus.full_text(corpus.row(doc))) for doc in relevant]
        first.append(pairs[0])
        further.extend(pairs[1:])
    pool = first if len(first) >= count else first + further
    order = np.random.default_rng(seed).permutation(len(pool))[:count]
    return [pool[i] for i in sorted(order)]


def plot_tsne(results: Mapping[str, DivergenceResult], path: str | Path, title: str | None = None) -> Path:
    """One scatter panel per encoder (queries and passages in two colours, KL/JS in the panel title) → PNG."""
    # only when plotting; the object API, no pyplot: the caller's backend is left alone
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib
    from matplotlib.figure import Figure  # lazy: matplotlib

    names: Sequence[str] = list(results)
    figure = Figure(figsize=(4.2 * len(names), 4.2))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(names), squeeze=False)
    for axis, name in zip(axes[0], names):
        result = results[name]
        axis.scatter(*result.passage_points.T, s=6, alpha=0.6, label="passages", color="tab:orange")
        axis.scatter(*result.query_points.T, s=6, alpha=0.6, label="queries", color="tab:blue")
        axis.set_title(f"{name}\nKL {result.kl:.2e}  JS {result.js:.2e}", fontsize=9)
        axis.set_xticks([])
        axis.set_yticks([])
    axes[0][0].legend(loc="best", fontsize=8, markerscale=2)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path

"""Interpreting representations (no training code here).

* :mod:`pretrieve.analysis.coverage` — input-token coverage of the [CLS] vector projected to the vocabulary
  (Drop your Decoder, Ma et al. 2024, §3.2, Algorithm 1, Fig. 2–5), the ✓/✗ top-token examples and the coverage-vs-k plot.
"""

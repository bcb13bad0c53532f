"""Speed benchmarks, measured side by side in one process so that ratios survive a shared, noisy machine.

* :mod:`pretrieve.bench.pretrain_speed` — pre-training step speed of every method, the Hugging Face
  full-vocabulary reference and the encoder-only floor (Drop your Decoder, Ma et al. 2024, Table 4 on our hardware);
* :mod:`pretrieve.bench.report` — markdown tables, the environment a number was measured in, and the
  ``FILE.md`` + ``FILE.json`` pair every ``pretrieve bench`` command writes.

Masking latency and encoding throughput live beside what they measure
(:mod:`pretrieve.masking.latency`, :mod:`pretrieve.bench.encode_speed`); ``pretrieve bench`` calls them.
Results are in ``docs/benchmarks.md``.
"""

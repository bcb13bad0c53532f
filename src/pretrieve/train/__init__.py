"""Training: the settings, the shared loop and the three trainers.

* :mod:`~pretrieve.train.settings` — every training setting, declared once and torch-free (default, help, check);
  :mod:`~pretrieve.train.presets` — the named pre-training methods as plain data.
* :mod:`~pretrieve.train.run_config` — a run's configuration from a config file and flags (validated, method
  resolved); :mod:`~pretrieve.train.method` — a pre-training method (maskers + objectives), validated.
* :mod:`~pretrieve.train.loop` — the shared training loop; :mod:`~pretrieve.train.run` — a training run's template
  (output, freshness, resume, export); :mod:`~pretrieve.train.collator` — batches of texts and of groups.
* The trainers: :mod:`~pretrieve.train.pretrainer`, :mod:`~pretrieve.train.finetuner`,
  :mod:`~pretrieve.train.reranker` (and :mod:`~pretrieve.train.tsdae`).
"""

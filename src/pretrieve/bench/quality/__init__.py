"""Retrieval quality of pre-training methods at an equal budget (``pretrieve bench quality``, issues #8 and #20).

Drop your Decoder's (Ma et al. 2024) Tables 5/6 compare pre-training methods by what a retriever initialised from
each checkpoint reaches after the same fine-tuning. :func:`pretrieve.bench.quality.run.run_quality_bench` runs that
protocol on one machine, built so that a skeptic can accept its decisions (issue #20):

1. **Shared inputs.** The training collection's ``train`` split loses ``dev_queries`` seeded queries to a ``dev``
   part (:mod:`pretrieve.data.folds`: a derived collection in ``<out>/collections/<name>``): dev is held out of
   every fold's fine-tuning and of every pooled score, used for selection only. Several pre-training sources are
   one corpus (their union, written once in ``<out>/pretrain-data/``).
2. **One fine-tuning protocol, chosen once on dev** (``grid``: lr × epochs): the selection arm (``mlm``: it favours
   the baseline), first seed, first fold, fine-tuned at every grid point and scored by dev nDCG@10; the best point
   is chosen once every point has a record (``<records>/select/``) and applied to every arm and fold.
3. **Every arm × seed** (:mod:`pretrieve.bench.quality.recipes`): pre-training (same steps, batch, max length and
   lr for every method; ``none`` skips it), then each **fold** ``a:b`` — fine-tune stage 1 on split ``a`` (BM25
   negatives), evaluate on split ``b`` and on every zero-shot collection — so that cross-fitting
   (``train:test,test:train``) scores every judged query with a model that never trained on it. Then the
   input-token coverage (Drop your Decoder, Ma et al. 2024, Fig. 2/4, :mod:`pretrieve.analysis.coverage`) of the
   checkpoint on the first ``coverage_texts`` passages of the pre-training corpus: raw, stopwords excluded, and
   the 500 most frequent corpus tokens excluded.
4. **The report** (:mod:`pretrieve.bench.quality.summary`, :mod:`pretrieve.bench.quality.report`), computed from
   the records only (:mod:`pretrieve.bench.quality.records`: one small file per cell, meant for git): per-arm
   tables, the secondary t-tests, and for the declared family of contrasts the
   paired multi-bootstrap over queries × seeds stratified by fold with Holm's correction, σ_q, τ, the MDE and the
   decision of the rule fixed before the runs (:mod:`pretrieve.evaluation.significance`).

Arms (:mod:`pretrieve.bench.quality.arms`, torch-free, where ``pretrieve --help`` reads the default list): any
method the method registry knows, ``none``, and ``NAME-aa`` (an A/A control: NAME with shifted seeds).

Method specifics: ``cotmote`` / ``cotmote-swap`` pre-train on the training split's judged (passage, query) pairs
(``<out>/pairs/``, dev left out; a stand-in for docT5query pseudo-queries, docs/cotmote.md), so no fold may then
evaluate on the train split. ``cotmae`` cuts its spans from the pre-training corpus; ``cdmae`` counts its n-gram
statistics on it. Token and span caches are shared by all runs (``<out>/cache``). Fine-tuning is the same for every
method, DupMAE included (``representation: dupmae`` is a per-method override, ``finetune_per_method``, recorded).

Cells, records and resuming (:mod:`pretrieve.bench.quality.run`, :mod:`pretrieve.bench.quality.cell`). A dev-grid
point and an arm × seed are **cells**; each ends in a record in the records directory (``tier.json``, ``select/``,
``cells/``, and ``folds/`` for each fold of an arm × seed as it ends), which is the comparison's state: a cell with
a current record is done on any machine, so a fresh clone with committed records runs only the rest, and cells run
side by side as separate processes (``jobs``), in the order :mod:`pretrieve.bench.quality.plan` hands them out (grid
points, the grid's growth, cells first seeds first; a process that would idle while the grid's last points run
pre-trains a cell ahead). A cell that fails (an exception, a diverged loss) records its error, the others go on, and it
is not retried unless ``retry_failed``. In the scratch ``out`` everything is reused only while current
(:mod:`pretrieve.artifacts`), so an interrupted cell resumes on the same machine; a rerun whose result-determining
settings differ from ``tier.json``'s is refused, naming them. After a successful arm × seed its training checkpoints
are deleted unless ``keep_checkpoints``.

This package's modules import the recipe runner only through :mod:`pretrieve.bench.quality.recipes`.
"""

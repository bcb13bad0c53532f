"""Run fusion (pretrieve.retrieval.fusion, `pretrieve fuse`): hand-computed values, conventions, fitting on train only."""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from pretrieve import artifacts
from pretrieve.data.collection import BeirCollection
from pretrieve.data.trec import read_run, write_run
from pretrieve.errors import ConfigError
from pretrieve.retrieval.fusion import (FusionSpec, cross_fit_folds, fit_fusion, fit_on_split, fuse_runs,
                                        parse_candidates, simplex_grid)

R1 = {"q1": {"a": 3.0, "b": 2.0, "c": 1.0}, "q2": {"x": 1.0, "y": 0.5}}
R2 = {"q1": {"b": 10.0, "d": 5.0, "a": 1.0}, "q2": {"y": 2.0, "z": 1.0}, "q3": {"m": 1.0}}


def close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for qid in a:
        assert a[qid].keys() == b[qid].keys(), qid
        for doc in a[qid]:
            assert a[qid][doc] == pytest.approx(b[qid][doc], abs=1e-12), (qid, doc)


def test_rrf_matches_hand_computation():
    # q1 ranks: R1 a1 b2 c3, R2 b1 d2 a3; q2: R1 x1 y2, R2 y1 z2; q3 only in R2.
    expected = {"q1": {"a": 1 / 61 + 1 / 63, "b": 1 / 62 + 1 / 61, "c": 1 / 63, "d": 1 / 62},
                "q2": {"x": 1 / 61, "y": 1 / 62 + 1 / 61, "z": 1 / 62},
                "q3": {"m": 1 / 61}}
    fused = fuse_runs([R1, R2], FusionSpec("rrf"))
    close(fused, expected)
    assert list(fused["q1"]) == ["b", "a", "d", "c"]          # best first
    close(fuse_runs([R1, R2], FusionSpec("rrf", k=1)),
          {"q1": {"a": 1 / 2 + 1 / 4, "b": 1 / 3 + 1 / 2, "c": 1 / 4, "d": 1 / 3},
           "q2": {"x": 1 / 2, "y": 1 / 3 + 1 / 2, "z": 1 / 3}, "q3": {"m": 1 / 2}})


def test_rrf_ranks_ties_as_trec_eval_does():
    # equal scores: trec_eval ranks the larger document id first, so "b" is rank 1 and "a" rank 2
    fused = fuse_runs([{"q": {"a": 1.0, "b": 1.0}}, {"q": {"c": 5.0}}], FusionSpec("rrf"))
    assert fused["q"]["b"] == pytest.approx(1 / 61)
    assert fused["q"]["a"] == pytest.approx(1 / 62)


def test_minmax_weighted_sum_matches_hand_computation():
    # q1: R1 lacks d (filled with R1's floor 1 → 0 after min-max): a 1, b .5, c 0, d 0;
    #     R2 lacks c (floor 1): b 1, d (5-1)/9, a 0, c 0.
    expected = {"q1": {"a": 0.3 * 1, "b": 0.3 * 0.5 + 0.7 * 1, "c": 0.0, "d": 0.7 * 4 / 9},
                "q2": {"x": 0.3 * 1, "y": 0.7 * 1, "z": 0.0},
                "q3": {"m": 0.0}}     # one document: max = min, ranx scores it 0
    close(fuse_runs([R1, R2], FusionSpec("wsum", "minmax", (0.3, 0.7))), expected)


def test_zscore_weighted_sum_matches_hand_computation():
    def z(values: dict) -> dict:
        mean = sum(values.values()) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values.values()) / len(values))
        return {k: (v - mean) / std for k, v in values.items()}

    # unretrieved documents get the run's lowest score for the query before normalisation
    q1 = (z({"a": 3, "b": 2, "c": 1, "d": 1}), z({"b": 10, "d": 5, "a": 1, "c": 1}))
    q2 = (z({"x": 1, "y": 0.5, "z": 0.5}), z({"y": 2, "z": 1, "x": 1}))
    expected = {"q1": {doc: 0.25 * q1[0][doc] + 0.75 * q1[1][doc] for doc in "abcd"},
                "q2": {doc: 0.25 * q2[0][doc] + 0.75 * q2[1][doc] for doc in "xyz"},
                "q3": {"m": 0.0}}
    fused = fuse_runs([R1, R2], FusionSpec("wsum", "zscore", (0.25, 0.75)))
    close(fused, expected)
    # the filled floor keeps the unretrieved "c" below everything R2 retrieved: not at R2's mean (0)
    assert fused["q1"]["c"] < fused["q1"]["a"]


def reference(runs, spec):
    """A plain-Python fusion with the module's conventions, for the random cross-check."""
    from pretrieve.evaluation.metrics import trec_eval_ranking

    out = {}
    for qid in dict.fromkeys(q for run in runs for q in run):
        lists = [{d: run.get(qid, {})[d] for d in trec_eval_ranking(run.get(qid, {}))[:spec.depth]} for run in runs]
        union = list(dict.fromkeys(d for docs in lists for d in docs))
        scores = dict.fromkeys(union, 0.0)
        for i, docs in enumerate(lists):
            if spec.method == "rrf":
                for rank, d in enumerate(docs, start=1):
                    scores[d] += 1 / (spec.k + rank)
                continue
            if not docs:
                continue
            filled = {d: docs.get(d, min(docs.values())) for d in union}
            lo, hi = min(filled.values()), max(filled.values())
            mean = sum(filled.values()) / len(filled)
            std = max(math.sqrt(sum((v - mean) ** 2 for v in filled.values()) / len(filled)), 1e-9)
            for d, v in filled.items():
                norm = (v - lo) / (hi - lo) if spec.norm == "minmax" and hi > lo else \
                    0.0 if spec.norm == "minmax" else (v - mean) / std
                scores[d] += spec.weights[i] * norm
        out[qid] = dict(sorted(scores.items(), key=lambda kv: -kv[1])[:spec.depth])
    return out


@pytest.mark.parametrize("spec", [FusionSpec("rrf", depth=15), FusionSpec("wsum", "minmax", (0.2, 0.5, 0.3), depth=15),
                                  FusionSpec("wsum", "zscore", (0.6, 0.1, 0.3), depth=15)])
def test_random_runs_agree_with_a_plain_reference(spec):
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(40)]
    runs = [{f"q{q}": {d: round(rng.uniform(-3, 9), 1) for d in rng.sample(docs, rng.randint(1, 25))}
             for q in range(12) if rng.random() < 0.9} for _ in range(3)]
    fused, expected = fuse_runs(runs, spec), reference(runs, spec)
    assert fused.keys() == expected.keys()
    for qid in fused:
        assert len(fused[qid]) == len(expected[qid]) <= 15
        for doc, score in fused[qid].items():       # the same scores (ties at the cut may keep other docs)
            if doc in expected[qid]:
                assert score == pytest.approx(expected[qid][doc], abs=1e-9)
        assert sorted(fused[qid].values()) == pytest.approx(sorted(expected[qid].values()), abs=1e-9)


@pytest.mark.parametrize("spec, message", [
    (FusionSpec("rrf", weights=(0.5, 0.5)), "neither"),
    (FusionSpec("wsum", "minmax", (0.5, 0.6)), "sum to 1"),
    (FusionSpec("wsum", "minmax", (1.0,)), "one weight per run"),
    (FusionSpec("wsum", "minmax", (-0.5, 1.5)), ">= 0"),
    (FusionSpec("wsum", None), "normalisation"),
    (FusionSpec("comb", None), "method"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        fuse_runs([R1, R2], spec)


def test_simplex_grid_is_exact():
    assert simplex_grid(2, 0.25) == [(0.0, 1.0), (0.25, 0.75), (0.5, 0.5), (0.75, 0.25), (1.0, 0.0)]
    grid = simplex_grid(3, 0.05)
    assert len(grid) == 231 and all(abs(sum(w) - 1) < 1e-9 for w in grid)   # C(22, 2): stars and bars


def _train_example():
    """Run "good" ranks each query's relevant document first, "bad" last: the fit must weight "good" (ties of the
    fused scores rank the relevant document, "a-rel", below the negatives "n*", as trec_eval does)."""
    qrels, good, bad = {}, {}, {}
    for q in range(8):
        qid = f"t{q}"
        qrels[qid] = {f"{qid}-a-rel": 1}
        docs = [f"{qid}-a-rel"] + [f"{qid}-n{i}" for i in range(5)]
        good[qid] = {d: float(len(docs) - i) for i, d in enumerate(docs)}
        bad[qid] = {d: float(i) for i, d in enumerate(docs)}
    return [bad, good], qrels


def test_fit_prefers_the_better_run_and_records_how():
    runs, qrels = _train_example()
    spec = fit_fusion(runs, qrels, candidates=[("wsum", "minmax")], step=0.25)
    assert spec.method == "wsum" and spec.norm == "minmax"
    assert spec.weights[1] > 0.5                 # every weight > .5 on "good" ranks the relevant doc first
    assert spec.weights == (0.25, 0.75)          # of the tied best, the one closest to uniform
    assert spec.fit["split"] == "train" and spec.fit["queries"] == 8 and spec.fit["score"] == pytest.approx(1.0)
    assert len(spec.fit["trials"]) == 5
    auto = fit_fusion(runs, qrels, candidates=parse_candidates("auto", None), step=0.25)
    assert {t["fusion"].split("(")[0] for t in auto.fit["trials"]} == {"rrf", "wsum"}


@pytest.mark.parametrize("norm", ["minmax", "zscore"])
@pytest.mark.parametrize("measure", ["nDCG@10", "MAP"])
def test_fit_scores_every_weight_as_ranx_fuse_does(norm, measure):
    """The fit's fast weighted sum (one matrix, the top-10 kept for a measure @10) scores each grid point exactly
    as fusing with ranx and evaluating the whole fused run would: random runs with documents and a query missing
    from one run, integer scores so that fused scores tie."""
    from pretrieve.evaluation.metrics import RunEvaluator

    rng = random.Random(11)
    docs = [f"d{i}" for i in range(60)]
    runs = [{f"q{q}": {d: float(rng.randint(0, 6)) for d in rng.sample(docs, rng.randint(1, 40))}
             for q in range(15) if (q, i) != (3, 1)} for i in range(2)]
    qrels = {f"q{q}": {d: rng.randint(1, 2) for d in rng.sample(docs, 4)} for q in range(15)}
    spec = fit_fusion(runs, qrels, candidates=[("wsum", norm)], measure=measure, step=0.1)
    evaluator = RunEvaluator(qrels, [measure])
    for trial in spec.fit["trials"]:
        weights = tuple(float(w) for w in trial["fusion"].split(";")[1].rstrip(")").split(","))
        fused = fuse_runs(runs, FusionSpec("wsum", norm, weights))
        assert trial["score"] == pytest.approx(evaluator(fused).aggregate[measure], abs=1e-12), trial


def test_fit_refuses_the_test_split():
    runs, qrels = _train_example()
    with pytest.raises(ConfigError, match="never on the test split"):
        fit_fusion(runs, qrels, split="test")


# ------------------------------------------------------------------------------------------- files and CLI
def tiny_collection(root: Path) -> Path:
    """A BEIR-layout collection with disjoint train (t*) and test (s*) queries."""
    (root / "qrels").mkdir(parents=True)
    runs, qrels = _train_example()
    docs = sorted({d for run in runs for ds in run.values() for d in ds})
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "text": d}) + "\n" for d in docs))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": q}) + "\n" for q in [*qrels, "s1"]))
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                              + "".join(f"{q}\t{d}\t1\n" for q, ds in qrels.items() for d in ds))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\ns1\tt0-a-rel\t1\n")
    write_run(runs[0], root / "bad-train.trec")
    write_run(runs[1], root / "good-train.trec")
    write_run({"s1": {"t0-a-rel": 1.0, "t0-n1": 2.0}}, root / "bad-test.trec")
    write_run({"s1": {"t0-a-rel": 5.0, "t0-n1": 1.0}}, root / "good-test.trec")
    return root


@contextlib.contextmanager
def forbid_test_qrels(monkeypatch):
    """Any open() of a test-split qrels file (builtins, io or pathlib) fails; yields the names opened."""
    opened: list[str] = []
    real_open = builtins.open

    def spy(file, *args, **kwargs):
        name = str(file).replace("\\", "/")
        opened.append(name)
        if name.endswith("qrels/test.tsv"):
            raise AssertionError(f"test qrels opened while fitting: {name}")
        return real_open(file, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", spy)
        patch.setattr("io.open", spy)
        yield opened


def test_fit_on_split_never_reads_test_qrels(tmp_path, monkeypatch):
    root = tiny_collection(tmp_path / "c")
    with forbid_test_qrels(monkeypatch) as opened:
        spec = fit_on_split([root / "bad-train.trec", root / "good-train.trec"], root, "train", step=0.25)
        with pytest.raises(ConfigError, match="never on the test split"):
            fit_on_split([root / "bad-train.trec", root / "good-train.trec"], root, "test")
        with pytest.raises(AssertionError, match="test qrels opened"):    # the spy does catch a read
            BeirCollection(root).load_qrels("test")
    assert spec.weights == (0.25, 0.75)
    assert any(name.endswith("qrels/train.tsv") for name in opened)      # the spy saw the reads


def test_cli_fuse_fits_on_train_only_and_records_inputs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import pretrieve.retrieval.fusion as fusion
    from pretrieve.cli import app

    root = tiny_collection(tmp_path / "c")
    out = tmp_path / "fused.trec"
    real_fit = fusion.fit_on_split
    seen: list[str] = []

    def guarded_fit(*args, **kwargs):      # while the command fits, opening qrels/test.tsv fails it
        with forbid_test_qrels(monkeypatch) as opened:
            try:
                return real_fit(*args, **kwargs)
            finally:
                seen.extend(opened)

    monkeypatch.setattr(fusion, "fit_on_split", guarded_fit)
    result = CliRunner().invoke(app, ["fuse", str(root / "bad-test.trec"), str(root / "good-test.trec"), "--method",
                                      "wsum", "--norm", "minmax", "--fit-data", str(root), "--fit-split", "train",
                                      "--fit-runs", f"{root / 'bad-train.trec'},{root / 'good-train.trec'}",
                                      "--fit-step", "0.25", "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert any(name.endswith("qrels/train.tsv") for name in seen)
    fused = read_run(out)
    assert list(fused["s1"]) == ["t0-a-rel", "t0-n1"]      # 0.25·(0, 1) + 0.75·(1, 0)
    assert fused["s1"]["t0-a-rel"] == pytest.approx(0.75)
    sidecar = artifacts.read_sidecar(out)
    assert sidecar["settings"]["fusion"] == {"method": "wsum", "depth": 1000, "norm": "minmax", "weights": [0.25, 0.75]}
    assert sidecar["settings"]["fitted"]["split"] == "train"
    assert set(sidecar["inputs"]) == {"run1", "run2", "fit_run1", "fit_run2", "fit_qrels"}
    assert artifacts.is_current(out, sidecar["settings"], {"run1": root / "bad-test.trec", "run2": root / "good-test.trec",
                                                           "fit_run1": root / "bad-train.trec",
                                                           "fit_run2": root / "good-train.trec",
                                                           "fit_qrels": root / "qrels" / "train.tsv"})


@pytest.mark.parametrize("args, message", [
    (["--fit-split", "test"], "never on the test split"),
    (["--weights", "0.5,0.5"], "either --weights or"),
    (["--method", "rrf"], "nothing to fit"),
])
def test_cli_fuse_bad_fitting_options_exit_2(tmp_path, args, message):
    from pretrieve.cli import app
    from typer.testing import CliRunner

    root = tiny_collection(tmp_path / "c")
    base = ["fuse", str(root / "bad-test.trec"), str(root / "good-test.trec"), "--out", str(tmp_path / "f.trec"),
            "--fit-data", str(root), "--fit-runs", str(root / "bad-train.trec"), "--fit-runs",
            str(root / "good-train.trec")]
    if "--method" not in args:
        base += ["--method", "wsum"]
    result = CliRunner().invoke(app, base + args)
    assert result.exit_code != 0
    assert message in str(result.exception) + result.output
    assert not (tmp_path / "f.trec").exists()


def test_cli_rrf_with_weights_is_refused(tmp_path):
    from pretrieve.cli import app
    from typer.testing import CliRunner

    root = tiny_collection(tmp_path / "c")
    result = CliRunner().invoke(app, ["fuse", str(root / "bad-test.trec"), str(root / "good-test.trec"),
                                      "--weights", "0.5,0.5", "--out", str(tmp_path / "f.trec")])
    assert result.exit_code != 0 and "--method wsum" in str(result.exception)


def test_fusion_needs_no_torch(tmp_path):
    """The fusion library path (fit on train files, write the fused run) never imports torch."""
    root = tiny_collection(tmp_path / "c")
    code = f"""
import sys
from pathlib import Path
from pretrieve.retrieval import fusion
root = Path({str(root)!r})
spec = fusion.fit_on_split([root / 'bad-train.trec', root / 'good-train.trec'], root, 'train', step=0.5)
fusion.write_fused_run([root / 'bad-test.trec', root / 'good-test.trec'], root / 'f.trec', spec)
assert 'torch' not in sys.modules, 'torch was imported'
print('ok')
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# ------------------------------------------------------------------------------------------- bounded memory
def _random_fit_inputs(seed: int = 5):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(80)]
    runs = [{f"q{q}": {d: float(rng.randint(0, 9)) for d in rng.sample(docs, rng.randint(1, 50))}
             for q in range(23) if (q, i) not in ((4, 1), (9, 0))} for i in range(2)]
    qrels = {f"q{q}": {d: rng.randint(1, 2) for d in rng.sample(docs, 3)} for q in range(25)}   # q23, q24: no run
    return runs, qrels


def test_a_fit_scored_block_by_block_is_the_fit_of_every_query_at_once():
    runs, qrels = _random_fit_inputs()
    candidates = parse_candidates("auto", None)
    whole = fit_fusion(runs, qrels, candidates=candidates, step=0.1, block=1000)
    for block in (1, 4, 22):
        spec = fit_fusion(runs, qrels, candidates=candidates, step=0.1, block=block)
        assert spec == whole and spec.fit == whole.fit, block
    assert whole.fit["queries"] == 23 and len(whole.fit["trials"]) == 1 + 2 * 11
    with pytest.raises(ConfigError, match="block"):
        fit_fusion(runs, qrels, block=0)


def test_the_cross_fitted_score_scores_each_fold_with_weights_fitted_on_the_others():
    """Amendment 2: a weighted sum's cross-fitted score equals fitting on four folds' queries and scoring the fifth
    with those weights, fold by fold, every query once; RRF's cross-fitted score is its plain score."""
    from pretrieve.evaluation.metrics import RunEvaluator

    runs, qrels = _random_fit_inputs(0)
    spec = fit_fusion(runs, qrels, candidates=[("wsum", "zscore")], step=0.1)
    folds = cross_fit_folds(list(qrels))
    assert len(folds) == 5 and sorted(q for fold in folds for q in fold) == sorted(qrels)
    assert cross_fit_folds(list(reversed(list(qrels)))) == folds          # seeded, not order-dependent
    per_query = {}
    for fold in folds:
        others = {qid: rel for qid, rel in qrels.items() if qid not in fold}
        weights = fit_fusion([{q: r for q, r in run.items() if q in others} for run in runs], others,
                             candidates=[("wsum", "zscore")], step=0.1).weights
        fused = fuse_runs(runs, FusionSpec("wsum", "zscore", weights))
        scores = RunEvaluator(qrels, ["nDCG@10"])(fused).per_query["nDCG@10"]
        per_query.update({qid: scores.get(qid, 0.0) for qid in fold})
    assert spec.fit["folds"] == 5
    assert spec.fit["cross_fitted"] == pytest.approx(sum(per_query.values()) / len(qrels), abs=1e-12)
    assert spec.fit["cross_fitted"] < spec.fit["score"]       # noise runs: the in-sample fit is optimistic
    # each query's value in the cross-fitted score is kept (the recipe's dev gate pairs two fits on them)
    assert spec.fit["per_query"] == pytest.approx(per_query, abs=1e-12) and list(spec.fit["per_query"]) == list(qrels)
    rrf = fit_fusion(runs, qrels, candidates=[("rrf", None)])
    assert rrf.fit["cross_fitted"] == rrf.fit["score"]
    plain = RunEvaluator(qrels, ["nDCG@10"])(fuse_runs(runs, FusionSpec("rrf"))).per_query["nDCG@10"]
    assert rrf.fit["per_query"] == pytest.approx({qid: plain.get(qid, 0.0) for qid in qrels}, abs=1e-12)


def test_auto_chooses_the_method_by_the_cross_fitted_score_then_fits_it_on_every_query():
    """On noise runs the fitted weighted sum beats RRF on the fit queries only because it saw them: cross-fitted,
    it loses, so ``auto`` keeps RRF. Where the weighted sum wins cross-fitted, its weights are the in-sample fit's."""
    runs, qrels = _random_fit_inputs(0)
    auto = fit_fusion(runs, qrels, candidates=parse_candidates("auto", "zscore"), step=0.1)
    rrf_row, wsum_row = auto.fit["candidates"]
    assert wsum_row["score"] > rrf_row["score"] and wsum_row["cross_fitted"] < rrf_row["cross_fitted"]
    assert auto.method == "rrf" and auto.fit["cross_fitted"] == rrf_row["cross_fitted"]
    good_runs, good_qrels = _train_example()
    chosen = fit_fusion(good_runs, good_qrels, candidates=parse_candidates("auto", "minmax"), step=0.25)
    alone = fit_fusion(good_runs, good_qrels, candidates=[("wsum", "minmax")], step=0.25)
    assert chosen.method == "wsum" and chosen.weights == alone.weights


def test_a_streamed_fit_holds_one_block_of_queries_and_reads_each_file_once(tmp_path, monkeypatch):
    """fit_on_split: the same fit as from values, whatever each file's query order; at most ``block`` queries are
    prepared at a time, and files in the same query order keep no query read ahead."""
    from pretrieve.data import trec
    from pretrieve.retrieval import fusion

    runs, qrels = _random_fit_inputs()
    root = tmp_path / "c"
    (root / "qrels").mkdir(parents=True)
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{g}\n" for q, docs in qrels.items() for d, g in docs.items()))
    write_run(runs[0], root / "a.trec")
    write_run(dict(reversed(list(runs[1].items()))), root / "b.trec")      # the other order: read ahead, still exact
    write_run(runs[1], root / "c.trec")
    sizes, ahead, streams = [], [], []
    real_matrix, real_take, real_iter_run = fusion._ScoreMatrix.__init__, fusion._QueryReader.take, trec.iter_run

    def matrix(self, ranx_runs, queries):
        sizes.append(len(queries))
        real_matrix(self, ranx_runs, queries)

    def take(self, ids):
        out = real_take(self, ids)
        ahead.append(len(self.ahead))
        return out

    def iter_run(path):
        streams.append(Path(path).name)
        return real_iter_run(path)

    monkeypatch.setattr(fusion._ScoreMatrix, "__init__", matrix)
    monkeypatch.setattr(fusion._QueryReader, "take", take)
    monkeypatch.setattr(fusion, "iter_run", iter_run)
    expected = fit_fusion(runs, qrels, candidates=[("wsum", "zscore")], step=0.1)
    sizes.clear()
    same_order = fit_on_split([root / "a.trec", root / "c.trec"], root, "train", candidates=[("wsum", "zscore")],
                              step=0.1, block=5)
    assert same_order == expected and same_order.fit == expected.fit
    assert sizes and max(sizes) <= 5 and sum(sizes) == 23 and not any(ahead)
    assert sorted(streams) == ["a.trec", "c.trec"]                            # one pass over each file
    other_order = fit_on_split([root / "a.trec", root / "b.trec"], root, "train", candidates=[("wsum", "zscore")],
                               step=0.1, block=5)
    assert other_order == expected and other_order.fit == expected.fit and any(ahead)
    assert fusion.merged_order([["a", "b", "d"], ["a", "c", "d"], ["c", "e"]]) == ["a", "b", "c", "d", "e"]

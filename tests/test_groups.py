"""Training groups: parsing and located errors, skip/drop counting, Tevatron-style sampling,
and building groups from a retrieval run (hard-negative mining, teacher scores)."""

from __future__ import annotations

import gzip
import json
import logging
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pretrieve.data.beir import Corpus
from pretrieve.data.groups import (GroupSet, TrainingGroup, group_rng, groups_from_run, iter_groups, read_groups,
                                   sample_group, sample_group_indices, write_groups)
from pretrieve.errors import ConfigError, InputError


def write_groups_file(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def group_row(**overrides):
    row = {"query_id": "q1", "query": "what is x", "positives": ["d1"], "negatives": ["d2", "d3"]}
    row.update(overrides)
    return {k: v for k, v in row.items() if v is not ...}


def assert_located(path: Path, line: int, field: str | None, match: str, **kwargs) -> InputError:
    with pytest.raises(InputError) as info:
        read_groups(path, **kwargs)
    err = info.value
    assert err.path == str(path) and err.line == line and err.field == field
    assert f"{path.name}:{line}:" in str(err) and match in str(err)
    if field is not None:
        assert f"field '{field}'" in str(err)
    return err


# -------------------------------------------------------------------------------------------- parsing

def test_read_groups_parses_ids_scores_and_int_ids(tmp_path):
    path = write_groups_file(
        tmp_path / "train.jsonl",
        group_row(positive_scores=[9.5], negative_scores=[1, -2.5]),
        group_row(query_id=7, query="q two", positives=[11, "d4"], negatives=[]))
    groups = read_groups(path)
    assert isinstance(groups, GroupSet) and len(groups) == 2
    first, second = groups
    assert first == TrainingGroup("q1", "what is x", ["d1"], ["d2", "d3"], [9.5], [1.0, -2.5])
    assert first.has_scores and not second.has_scores
    assert (second.query_id, second.positives, second.negatives) == ("7", ["11", "d4"], [])
    assert groups.stats.seen == 2 and groups.stats.kept == 2 and groups.stats.problems() == {}
    assert groups.doc_ids() == {"d1", "d2", "d3", "11", "d4"}


def test_groups_round_trip_and_gzip(tmp_path):
    original = [TrainingGroup("q1", "naïve query", ["d1", "d9"], ["d2"], [3.0, 2.5], [0.125]),
                TrainingGroup("q2", "other", ["d5"], ["d6", "d7"])]
    path = tmp_path / "out" / "groups.jsonl"
    assert write_groups(original, path) == 2
    assert list(read_groups(path)) == original
    assert "positive_scores" not in path.read_text().splitlines()[1]
    gz = tmp_path / "groups.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert list(read_groups(gz)) == original


def test_write_groups_is_atomic(tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text("old\n")

    def failing():
        yield TrainingGroup("q1", "x", ["d1"], [])
        raise RuntimeError("crash while producing groups")

    with pytest.raises(RuntimeError):
        write_groups(failing(), path)
    assert path.read_text() == "old\n"


@pytest.mark.parametrize("row, field, match", [
    (group_row(query_id=...), "query_id", "missing required field"),
    (group_row(query=...), "query", "missing required field"),
    (group_row(positives=...), "positives", "missing required field"),
    (group_row(negatives=...), "negatives", "missing required field"),
    (group_row(query=""), "query", "must not be empty"),
    (group_row(query_id=["q"]), "query_id", "expected a string, got list"),
    (group_row(positives="d1"), "positives", "expected a list of document ids, got str"),
    (group_row(negatives={"d2": 1}), "negatives", "expected a list of document ids, got dict"),
    (group_row(negatives=["d2", {"id": "d3"}]), "negatives[1]", "expected a document id (string), got dict"),
    (group_row(positives=[True]), "positives[0]", "got bool"),
    (group_row(negatives=["d2", " "]), "negatives[1]", "empty document id"),
    (group_row(negatives=["d2", "d3", "d2"]), "negatives[2]", "'d2' listed twice (positions 0 and 2)"),
    (group_row(positive_scores=[1.0, 2.0]), "positive_scores", "has 2 scores but 'positives' has 1 ids"),
    (group_row(negative_scores=[1.0]), "negative_scores", "has 1 scores but 'negatives' has 2 ids"),
    (group_row(negative_scores="high"), "negative_scores", "expected a list of numbers, got str"),
    (group_row(negative_scores=[1.0, "2"]), "negative_scores[1]", "expected a number, got str"),
])
def test_read_groups_errors_are_located(tmp_path, row, field, match):
    path = write_groups_file(tmp_path / "train.jsonl", group_row(query_id="ok"), row)
    assert_located(path, 2, field, match)


def test_read_groups_bad_json_and_non_object(tmp_path):
    truncated = write_groups_file(tmp_path / "a.jsonl", group_row(), '{"query_id": "q2", "query": "x", "pos')
    assert_located(truncated, 2, None, "invalid JSON")
    listed = write_groups_file(tmp_path / "b.jsonl", group_row(), '["q2", "x", ["d1"], []]')
    assert_located(listed, 2, None, "expected a JSON object, got list")
    nan = write_groups_file(tmp_path / "c.jsonl", '{"query_id": "q", "query": "x", "positives": ["d1"], '
                                                  '"negatives": ["d2"], "negative_scores": [NaN]}')
    assert_located(nan, 1, "negative_scores[0]", "not finite")


def test_groups_without_positives_are_skipped_and_counted(tmp_path, caplog):
    path = write_groups_file(tmp_path / "train.jsonl", group_row(query_id="a"), group_row(query_id="b", positives=[]),
                             group_row(query_id="c"), group_row(query_id="d", positives=[]))
    with caplog.at_level(logging.WARNING, logger="pretrieve.data.groups"):
        groups = read_groups(path)
    assert [g.query_id for g in groups] == ["a", "c"]
    assert (groups.stats.seen, groups.stats.kept, groups.stats.skipped_no_positives) == (4, 2, 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kept 2 of 4" in warnings[0] and "skipped no positives: 2" in warnings[0]
    assert "train.jsonl" in warnings[0]


def test_file_with_no_usable_group_is_an_error(tmp_path):
    path = write_groups_file(tmp_path / "train.jsonl", group_row(positives=[]))
    with pytest.raises(InputError, match="no usable training group \\(1 read, 1 without positives\\)"):
        read_groups(path)


def test_negative_that_is_also_positive_is_dropped(tmp_path):
    path = write_groups_file(tmp_path / "train.jsonl",
                             group_row(positives=["d1", "d2"], negatives=["d3", "d1", "d4"],
                                       negative_scores=[0.3, 0.9, 0.4], positive_scores=[1.0, 0.8]))
    (group,) = read_groups(path)
    assert group.negatives == ["d3", "d4"] and group.negative_scores == [0.3, 0.4]
    assert read_groups(path).stats.negatives_dropped_as_positive == 1


def test_unknown_doc_ids_error_by_default(tmp_path):
    corpus = Corpus(["d1", "d2", "d3"], [""] * 3, ["a", "b", "c"])
    path = write_groups_file(tmp_path / "train.jsonl", group_row(), group_row(query_id="q2", negatives=["d2", "dX"]))
    assert len(read_groups(path)) == 2  # no corpus given: ids are not checked
    assert_located(path, 2, "negatives[1]", "unknown document id 'dX'", corpus=corpus)


def test_unknown_doc_ids_skip_mode_drops_and_counts(tmp_path):
    known = {"d1", "d2", "d3"}
    path = write_groups_file(
        tmp_path / "train.jsonl",
        group_row(negatives=["dX", "d2", "dY", "d3"], negative_scores=[5.0, 4.0, 3.0, 2.0]),
        group_row(query_id="q2", positives=["dZ"]))
    groups = read_groups(path, corpus=known, on_unknown="skip")
    (group,) = groups
    assert group.negatives == ["d2", "d3"] and group.negative_scores == [4.0, 2.0]
    assert groups.stats.unknown_ids_dropped == 3 and groups.stats.skipped_no_positives == 1


def test_invalid_on_unknown_and_streaming(tmp_path):
    path = write_groups_file(tmp_path / "train.jsonl", group_row(), '{"broken')
    with pytest.raises(ConfigError):
        read_groups(path, on_unknown="ignore")
    stream = iter_groups(path)
    assert next(stream).query_id == "q1"  # yielded before the broken line is read
    with pytest.raises(InputError, match="train.jsonl:2:"):
        next(stream)


# ------------------------------------------------------------------------------------------- sampling

GROUP = TrainingGroup("q", "query", ["p0", "p1", "p2"], [f"n{i}" for i in range(10)],
                      [3.0, 2.0, 1.0], [float(-i) for i in range(10)])


@pytest.mark.parametrize("make_rng", [random.Random, np.random.default_rng])
def test_sampling_is_deterministic_per_seed(make_rng):
    first = [sample_group(GROUP, 4, rng) for rng in [make_rng(13)] for _ in range(20)]
    second = [sample_group(GROUP, 4, rng) for rng in [make_rng(13)] for _ in range(20)]
    other = [sample_group(GROUP, 4, rng) for rng in [make_rng(14)] for _ in range(20)]
    assert first == second and first != other
    for positive, negatives in first:
        assert positive in GROUP.positives
        assert len(negatives) == 4 and len(set(negatives)) == 4 and set(negatives) <= set(GROUP.negatives)


def test_sampling_covers_positives_and_negatives_uniformly():
    rng = random.Random(0)
    positives, negatives = Counter(), Counter()
    for _ in range(3000):
        positive, negs = sample_group(GROUP, 3, rng)
        positives[positive] += 1
        negatives.update(negs)
    assert set(positives) == set(GROUP.positives) and min(positives.values()) > 850  # ≈ 1000 each
    assert set(negatives) == set(GROUP.negatives) and min(negatives.values()) > 780  # ≈ 900 each


@pytest.mark.parametrize("make_rng", [random.Random, np.random.default_rng])
def test_fewer_negatives_than_requested_cycles(make_rng):
    group = TrainingGroup("q", "query", ["p"], ["a", "b", "c"])
    positive, negatives = sample_group(group, 7, make_rng(1))
    assert positive == "p" and len(negatives) == 7
    assert sorted(negatives[:3]) == ["a", "b", "c"]  # every negative before any repeat
    assert sorted(Counter(negatives).values()) == [2, 2, 3]
    assert negatives[3:6] == negatives[:3]


def test_sample_indices_align_teacher_scores():
    pos, negs = sample_group_indices(GROUP, 5, random.Random(3))
    positive, negatives = sample_group(GROUP, 5, random.Random(3))
    assert GROUP.positives[pos] == positive and [GROUP.negatives[i] for i in negs] == negatives
    assert [GROUP.negative_scores[i] for i in negs] == [-float(n[1:]) for n in negatives]


def test_sampling_edge_cases():
    no_negatives = TrainingGroup("q", "query", ["p"], [])
    assert sample_group(no_negatives, 0, random.Random(0)) == ("p", [])
    with pytest.raises(InputError, match="query 'q' has no negatives but 3 are needed"):
        sample_group(no_negatives, 3, random.Random(0))
    with pytest.raises(InputError, match="has no positives"):
        sample_group(TrainingGroup("q", "query", [], ["n"]), 1, random.Random(0))
    with pytest.raises(ConfigError):
        sample_group(GROUP, -1, random.Random(0))
    assert sorted(sample_group(GROUP, 10, random.Random(0))[1]) == sorted(GROUP.negatives)


def test_group_rng_is_stable_and_varies_by_epoch_and_index():
    draw = lambda seed, epoch, index: sample_group(GROUP, 4, group_rng(seed, epoch, index))  # noqa: E731
    assert draw(42, 0, 5) == draw(42, 0, 5)
    assert len({tuple(draw(42, epoch, 5)[1]) for epoch in range(6)}) > 1
    assert len({tuple(draw(42, 0, index)[1]) for index in range(6)}) > 1


def test_training_group_checks_score_lengths():
    with pytest.raises(ValueError, match="1 negative scores for 2 negative ids"):
        TrainingGroup("q", "x", ["p"], ["a", "b"], None, [1.0])


# -------------------------------------------------------------------------------------- from a run

RUN = {
    "q1": {"d1": 9.0, "d2": 8.0, "d3": 7.0, "d4": 7.0, "d5": 6.0, "d6": 5.0, "d7": 1.0},
    "q2": {"d3": 2.0, "d2": 1.0},
    "q3": {"d1": 1.0},
    "q5": {"d1": 3.0, "d2": 2.0},
}
QRELS = {
    "q1": {"d2": 1, "d5": 2, "d3": 0, "dZ": 1},  # d3 judged non-relevant stays a negative
    "q2": {"d3": 0},  # no positive
    "q3": {"d1": 1},  # every retrieved doc is relevant: no negatives left
    "q4": {"d1": 1},  # not in the run
    "q5": {"d1": 1},  # no query text
    "q6": {"d9": 1},
}
QUERIES = {"q1": "first", "q2": "second", "q3": "third", "q4": "fourth", "q6": "sixth"}


def test_groups_from_run_mines_negatives_in_rank_order():
    groups = groups_from_run(RUN, QRELS, QUERIES, depth=6)
    (group,) = groups
    assert group.query_id == "q1" and group.query == "first"
    assert group.positives == ["d2", "d5", "dZ"]
    # top-6 = d1 d2 d3 d4 d5 d6 (d3/d4 tie keeps run order) minus relevant d2, d5
    assert group.negatives == ["d1", "d3", "d4", "d6"]
    assert group.positive_scores is None
    stats = groups.stats
    assert (stats.seen, stats.kept, stats.skipped_no_positives, stats.skipped_no_negatives,
            stats.skipped_not_in_run, stats.skipped_unknown_query) == (6, 1, 1, 1, 2, 1)


def test_groups_from_run_depth_pool_and_exclude_positives():
    assert groups_from_run(RUN, QRELS, QUERIES, depth=3)[0].negatives == ["d1", "d3"]
    assert groups_from_run(RUN, QRELS, QUERIES, depth=100, num_negatives_pool=2)[0].negatives == ["d1", "d3"]
    assert groups_from_run(RUN, QRELS, QUERIES, depth=100)[0].negatives == ["d1", "d3", "d4", "d6", "d7"]
    kept = groups_from_run(RUN, QRELS, QUERIES, depth=3, exclude_positives=False)[0]
    assert kept.negatives == ["d1", "d2", "d3"]
    relaxed = groups_from_run(RUN, QRELS, QUERIES, depth=1, min_negatives=0)
    assert [g.query_id for g in relaxed] == ["q1", "q3"] and relaxed[1].negatives == []
    with pytest.raises(ConfigError):
        groups_from_run(RUN, QRELS, QUERIES, depth=0)


def test_groups_from_run_with_teacher_scores_round_trips(tmp_path):
    teacher = {"q1": {"d1": 0.1, "d2": 0.9, "d3": 0.2, "d4": 0.3, "d5": 0.8, "dZ": 0.7, "d6": 0.05}}
    (group,) = groups_from_run(RUN, QRELS, QUERIES, depth=6, scores_from_run=teacher)
    assert group.positive_scores == [0.9, 0.8, 0.7]
    assert group.negative_scores == [0.1, 0.2, 0.3, 0.05]
    write_groups([group], tmp_path / "stage3.jsonl")
    assert list(read_groups(tmp_path / "stage3.jsonl")) == [group]
    del teacher["q1"]["d4"]
    with pytest.raises(InputError, match="no score for document 'd4' of query 'q1'"):
        groups_from_run(RUN, QRELS, QUERIES, depth=6, scores_from_run=teacher)
    with pytest.raises(InputError, match="no scores for query 'q1'"):
        groups_from_run(RUN, QRELS, QUERIES, depth=6, scores_from_run={})


def test_groups_from_run_then_sample(tmp_path):
    """Stage-1 flow: mined groups written, read back against the corpus, sampled."""
    corpus = Corpus([f"d{i}" for i in range(1, 8)] + ["dZ"], [""] * 8, ["t"] * 8)
    groups = groups_from_run(RUN, QRELS, QUERIES, depth=6)
    write_groups(groups, tmp_path / "stage1.jsonl")
    back = read_groups(tmp_path / "stage1.jsonl", corpus=corpus)
    positive, negatives = sample_group(back[0], 2, group_rng(42, 0, 0))
    assert positive in {"d2", "d5", "dZ"} and set(negatives) <= {"d1", "d3", "d4", "d6"}

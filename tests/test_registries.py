"""A masker and a lexical engine plug in by name: each is registered here, in this test module, and used through the
registries (:mod:`pretrieve.masking.registry`, :data:`pretrieve.retrieval.index.LEXICAL_BACKENDS`) with no other
file changed — the pattern objectives and search back-ends follow."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from pretrieve import artifacts
from pretrieve.data.trec import read_run
from pretrieve.errors import ConfigError
from pretrieve.masking import MASKERS, RandomMasker, register_masker
from pretrieve.retrieval import runs
from pretrieve.retrieval.index import LEXICAL_BACKENDS, lexical_backend, register_lexical

from test_bm25 import write_tiny_collection


# ------------------------------------------------------------------------------------------------ a masker
class CountingMasker(RandomMasker):
    """Token-level random masking that counts its calls (the test's own masker)."""

    calls = 0

    def __call__(self, *args, **kwargs):
        CountingMasker.calls += 1
        return super().__call__(*args, **kwargs)


def _check_counting(params, where):
    if params["every"] < 1:
        raise ConfigError(f"{where}.every must be >= 1")


@pytest.fixture
def counting_masker():
    @register_masker("counting", defaults={"every": 1}, check_params=_check_counting)
    def build(spec, info, statistics=None):
        return CountingMasker(info, ratio=spec.ratio, whole_word=False, replace_probs=spec.replace_probs)

    yield "counting"
    MASKERS.pop("counting")


def test_a_masker_registered_here_is_usable_by_name(counting_masker, tokenizer):
    from pretrieve.train.collator import PretrainCollator
    from pretrieve.train.method import MethodConfig, preset

    data = preset("mlm").to_dict()
    data["encoder_masker"] = {"kind": "counting", "ratio": 0.3}
    method = MethodConfig.from_dict(data)
    assert method.encoder_masker.params == {"every": 1}   # the registered defaults
    collator = PretrainCollator(tokenizer, method, max_len=32)
    batch = collator([{"input_ids": tokenizer("the cat sat on the mat")["input_ids"]}])
    assert CountingMasker.calls >= 1 and (batch["mlm_labels"] != -100).any()

    data["encoder_masker"] = {"kind": "counting", "ratio": 0.3, "params": {"every": 0}}
    with pytest.raises(ConfigError, match="every"):
        MethodConfig.from_dict(data)   # the registered check
    data["encoder_masker"] = {"kind": "nope", "ratio": 0.3}
    with pytest.raises(ConfigError, match="known maskers: wwm, token, pmi, counting"):
        MethodConfig.from_dict(data)


# ---------------------------------------------------------------------------------------- a lexical engine
class OverlapParams:
    """The toy engine's settings: ``bonus`` added to every score."""

    def __init__(self, bonus: float = 0.0, **ignored):
        self.bonus = bonus

    def settings(self) -> dict:
        return {"format": "overlap/1", "bonus": self.bonus}


class OverlapIndex:
    """Scores a document by the number of query words it shares (ties by corpus order)."""

    def __init__(self, corpus_path: Path, params: OverlapParams):
        self.docs = [json.loads(line) for line in Path(corpus_path).read_text(encoding="utf-8").splitlines()]
        self.params = params

    def iter_search(self, queries, k=1000, exclude_self=False, n_threads=None, show_progress=False, total=None):
        for qid, text in queries:
            words = set(text.lower().split())
            scored = [(doc["_id"], float(len(words & set(f"{doc['title']} {doc['text']}".lower().split()))))
                      for doc in self.docs]
            ranking = sorted((pair for pair in scored if pair[1] > 0), key=lambda pair: -pair[1])
            yield qid, [(doc_id, score + self.params.bonus) for doc_id, score in ranking[:k]]


class OverlapEngine:
    """The :class:`~pretrieve.retrieval.index.LexicalBackend` contract, as an object."""

    SCRATCH_NAME = "overlap-index"
    searches = 0

    def params(self, **options):
        return OverlapParams(**options)

    @contextlib.contextmanager
    def open_index(self, corpus_path, params, index_dir=None, scratch_dir=None, show_progress=False):
        OverlapEngine.searches += 1
        yield OverlapIndex(corpus_path, params)

    def index_space(self, corpus_path):
        return 0, 0


@pytest.fixture
def overlap_engine():
    register_lexical("overlap", OverlapEngine())
    yield "overlap"
    LEXICAL_BACKENDS.pop("overlap")


def test_a_lexical_engine_registered_here_is_usable_by_name(overlap_engine, tmp_path):
    data = write_tiny_collection(tmp_path / "toy")
    out = tmp_path / "runs" / "overlap.trec"
    out.parent.mkdir()
    queries, lines = runs.lexical_run_file(data, "test", out, k=2, engine="overlap",
                                           params=lexical_backend("overlap").params(bonus=0.5))
    run = read_run(out)
    assert queries == 3 and set(run) == {"q1", "q2", "q3"} and lines == sum(len(docs) for docs in run.values())
    assert next(iter(run["q1"])) == "d1" and min(run["q1"].values()) > 0.5
    assert out.read_text(encoding="utf-8").split()[5] == "overlap"   # the run tag is the engine's name
    settings, inputs = runs.lexical_run_record(runs.BeirCollection(data), "test", 2,
                                               lexical_backend("overlap").params(bonus=0.5), engine="overlap")
    assert settings["retriever"] == "overlap" and artifacts.check(out, settings, inputs, kind="run").current

    default = tmp_path / "runs" / "default.trec"
    before = OverlapEngine.searches
    runs.lexical_run(runs.BeirCollection(data), "test", 2, default, tmp_path / "index", engine="overlap")
    runs.lexical_run(runs.BeirCollection(data), "test", 2, default, tmp_path / "index", engine="overlap")
    assert OverlapEngine.searches == before + 1   # current: not searched again


def test_an_unknown_lexical_engine_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match="no lexical engine 'nope' .known: bm25"):
        lexical_backend("nope")

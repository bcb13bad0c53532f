"""The analysis commands on the command line: ``analyze masking-stats | word-distribution | stopword-mass``,
``stats pmi`` and ``bench masking --kinds pmi``, on a tiny corpus and tiny models written into tmp dirs.

Each command is run through the typer app and its printed/written results are checked against the library
functions (or counts by hand); checkpoints without a CPDAE decoder must be refused with exit code 2 and a
message naming what is missing.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pretrieve.cli import app, main
from pretrieve.errors import InputError

SENTENCES = [
    "Dense retrieval encodes the query and the passage into vectors.",
    "The contrastive loss pulls the two views of a text together.",
    "Mutual information of n-grams ranks the important tokens first!",
    "Stop-words such as the, of and and carry little meaning.",
    "Lymphocytes infiltrate the tumour in most of the patients.",
    "Protein folding is predicted from the amino acid sequence.",
    "A decoder reconstructs the bag of words of the passage.",
    "Masked language modelling hides fifteen percent of the tokens.",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def invoke(*args: str):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def tiny_pretrain(model_dir: Path, corpus: Path, out: Path, method) -> Path:
    from pretrieve.train.pretrainer import PretrainConfig, pretrain

    config = PretrainConfig(model=str(model_dir), corpus=str(corpus), out=str(out), method=method, max_len=32,
                            batch_size=4, lr=1e-3, max_steps=2, warmup_ratio=0.0, log_every=1, save_every=0,
                            show_progress=False, cache_dir=str(out.parent / "cache"))
    return pretrain(config)


@pytest.fixture(scope="module")
def cpdae_final(tiny_mlm_dir, corpus, tmp_path_factory) -> Path:
    """``final/`` of a 2-step CPDAE pre-training run (encoder, tokenizer, heads.safetensors, method.json)."""
    return tiny_pretrain(tiny_mlm_dir, corpus, tmp_path_factory.mktemp("cpdae") / "run", "cpdae")


@pytest.fixture(scope="module")
def no_cl_final(tiny_mlm_dir, corpus, tmp_path_factory) -> Path:
    """The same run without the contrastive loss (paper 002's ablation, ``contrast: none``)."""
    from pretrieve.train.method import preset

    method = preset("cpdae")
    objectives = tuple(replace(spec, params={**spec.params, "contrast": "none"}) if spec.name == "cpdae" else spec
                       for spec in method.objectives)
    method = replace(method, name="cpdae-no-cl", objectives=objectives)
    return tiny_pretrain(tiny_mlm_dir, corpus, tmp_path_factory.mktemp("nocl") / "run", method)


def corpus_ids(tokenizer) -> list[list[int]]:
    return tokenizer(SENTENCES * 3, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------- stats pmi
def test_stats_pmi_saves_the_counts_a_pmi_masker_can_use(corpus, cache, tmp_path, tiny_mlm_dir, tokenizer):
    from pretrieve.masking.pmi import NgramStatistics, resolve_statistics

    out = tmp_path / "pmi"
    result = invoke("stats", "pmi", "--corpus", corpus, "--model", tiny_mlm_dir, "--window", "3",
                    "--cache-dir", cache, "--out", out)
    assert result.exit_code == 0, result.output
    ids = corpus_ids(tokenizer)
    tokens = sum(len(seq) for seq in ids)
    assert f"{tokens:,} tokens in {len(ids)} chunks" in result.output
    assert "count" in result.output and "tokenize/load" in result.output and f"statistics: {out}" in result.output
    stats = NgramStatistics.load(out)
    assert stats.window == 3 and int(stats.totals[1]) == tokens and stats.num_docs == len(ids)
    assert int(stats.totals[2]) == sum(len(seq) - 1 for seq in ids)       # bigram positions by hand
    the, passage = tokenizer.convert_tokens_to_ids(["the", "passage"])
    by_hand = sum(1 for seq in ids for a, b in zip(seq, seq[1:]) if (a, b) == (the, passage))
    assert by_hand == 6 and stats.ngram_count([the, passage]) == by_hand
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["window"] == 3 and provenance["timings"]["count_s"] >= 0
    # a pmi masker pointed at the directory reads exactly these statistics
    loaded = resolve_statistics(str(out), window=3, vocab_size=len(tokenizer))
    assert np.array_equal(loaded.keys, stats.keys) and np.array_equal(loaded.unigram_counts, stats.unigram_counts)


def test_stats_pmi_default_target_is_the_cache_masking_stats_reads(corpus, cache, tiny_mlm_dir, tokenizer):
    from pretrieve.cli.tokenized import statistics_cache_path, tokenized_corpus
    from pretrieve.masking.pmi import NgramStatistics, corpus_statistics

    result = invoke("stats", "pmi", "--corpus", corpus, "--model", tiny_mlm_dir, "--max-len", "32",
                    "--cache-dir", cache)
    assert result.exit_code == 0, result.output
    data, _ = tokenized_corpus(str(corpus), tokenizer, 32, cache)
    target = statistics_cache_path(data, 4)
    assert f"saved to {target}" in result.output and NgramStatistics.is_saved(target)
    assert (target / "provenance.json").exists()
    cached = corpus_statistics(data, len(tokenizer), 4)       # found in the cache, not counted again
    assert np.array_equal(cached.keys, NgramStatistics.load(target).keys)


# ---------------------------------------------------------------------- analyze masking-stats
def test_masking_stats_at_ratio_one_gives_the_corpus_shares(corpus, cache, tmp_path, tiny_mlm_dir, tokenizer):
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    out = tmp_path / "all"
    result = invoke("analyze", "masking-stats", "--corpus", corpus, "--model", tiny_mlm_dir, "--ratio", "1.0",
                    "--max-len", "32", "--cache-dir", cache, "--out", out)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "masking_stats.json").read_text())["maskers"]
    # every token is masked, so both maskers see the whole corpus: shares by hand over all tokens
    tokens = [tokenizer.convert_ids_to_tokens(seq) for seq in corpus_ids(tokenizer)]
    flat = [t for seq in tokens for t in seq]
    stops = {w.lower() for w in STOPWORDS_EN_PLUS}
    stop_share = sum(t in stops for t in flat) / len(flat)
    punct_share = sum(t in {".", ",", "!", "-"} for t in flat) / len(flat)
    for name in ("random", "pmi"):
        assert data[name]["masked_tokens"] == len(flat)
        assert data[name]["stopword_share"] == pytest.approx(stop_share)
        assert data[name]["punctuation_share"] == pytest.approx(punct_share)
        assert data[name]["top_terms"][0]["term"] == "the"
    assert f"{stop_share:.1%}" in result.output and "punctuation" in result.output
    assert (out / "masking_stats.md").read_text().startswith("| masker |") and (out / "provenance.json").exists()


def test_masking_stats_same_budget_and_top_terms(corpus, cache, tmp_path, tiny_mlm_dir, tokenizer):
    out = tmp_path / "half"
    result = invoke("analyze", "masking-stats", "--corpus", corpus, "--model", tiny_mlm_dir, "--ratio", "0.5",
                    "--num-texts", "5", "--top", "3", "--max-len", "32", "--cache-dir", cache, "--out", out)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "masking_stats.json").read_text())
    assert saved["settings"]["examples"] == 5 and saved["settings"]["ratio"] == 0.5
    budget = sum(max(1, round(0.5 * len(seq))) for seq in corpus_ids(tokenizer)[:5])
    for name in ("random", "pmi"):
        stats = saved["maskers"][name]
        assert stats["masked_tokens"] == budget                         # the same number, different tokens
        assert len(stats["top_terms"]) == 3 and 0 <= stats["uninformative_share"] <= 1
        assert stats["top_terms"][0]["term"] in result.output
    assert "top-3 most often masked tokens" in result.output

    bad = invoke("analyze", "masking-stats", "--corpus", corpus, "--model", tiny_mlm_dir, "--cache-dir", cache,
                 "--statistics", tmp_path / "missing")
    assert bad.exit_code != 0 and isinstance(bad.exception, InputError)


# ---------------------------------------------------------------------- bench masking --kinds pmi
def test_bench_masking_pmi_counts_statistics_of_the_corpus(corpus, cache, tmp_path, tokenizer):
    out = tmp_path / "masking.md"
    result = invoke("bench", "masking", "--kinds", "random,pmi", "--batch-size", "4", "--max-len", "16",
                    "--repeats", "1", "--corpus", corpus, "--cache-dir", cache, "--out", out)
    assert result.exit_code == 0, result.output
    tokens = sum(len(seq) for seq in corpus_ids(tokenizer))           # whole corpus, not the 4 batch texts
    assert "| pmi |" in result.output and f"pmi statistics: {corpus} ({tokens:,} tokens)" in result.output
    assert set(json.loads(out.with_suffix(".json").read_text())["seconds"]) == {"random", "pmi"}


# ---------------------------------------------------------------------- CPDAE word distributions
def test_word_distribution_prints_table4_for_a_cpdae_checkpoint(cpdae_final, tmp_path, tokenizer):
    from pretrieve.analysis.word_distribution import decode_words

    text = "Lymphocytes infiltrate the tumour"
    out = tmp_path / "words"
    result = invoke("analyze", "word-distribution", "--model", cpdae_final.parent, "--text", text, "--top", "5",
                    "--out", out)                                      # the run directory stands for final/
    assert result.exit_code == 0, result.output
    expected = decode_words(cpdae_final, tokenizer, [text], top_k=5)[0]
    assert expected.render() in result.output
    assert f"stopword mass {expected.stopword_mass:.4f}" in result.output
    saved = json.loads((out / "word_distribution.json").read_text())
    assert saved["checkpoint"] == str(cpdae_final)
    words = saved["texts"][0]["words"]
    assert [w for w, _ in words] == ["Lymphocytes", "infiltrate", "the", "tumour"]
    assert [p for _, p in words] == pytest.approx([p for _, p in expected.words])
    assert len(saved["texts"][0]["top_tokens"]) == 5


def test_stopword_mass_compares_checkpoints(cpdae_final, no_cl_final, corpus, tmp_path, tokenizer):
    from pretrieve.analysis.word_distribution import stopword_mass

    out = tmp_path / "mass"
    result = invoke("analyze", "stopword-mass", "--model", cpdae_final, "--model", no_cl_final, "--corpus", corpus,
                    "--num-texts", "4", "--max-len", "32", "--out", out)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "stopword_mass.json").read_text())
    assert saved["settings"]["num_texts"] == 4
    for path in (cpdae_final, no_cl_final):
        direct = stopword_mass(path, tokenizer, SENTENCES[:4], max_len=32)
        assert saved["checkpoints"][str(path)]["stopword_mass"] == pytest.approx(direct, rel=1e-5)
        assert f"{direct:.4f}" in result.output
    assert "contrast=js" in result.output and "contrast=none" in result.output and "1.000×" in result.output


# ---------------------------------------------------------------------- checkpoints without a CPDAE decoder
@pytest.fixture(scope="module")
def mlm_checkpoint(tiny_mlm_dir, tmp_path_factory) -> Path:
    """A pre-training checkpoint of a method without CPDAE's decoder (mlm): method.json says so."""
    from pretrieve.modeling import Encoder
    from pretrieve.modeling.pretrain_model import PretrainModel
    from pretrieve.train.method import preset

    out = tmp_path_factory.mktemp("mlm_ckpt")
    PretrainModel(Encoder.from_pretrained(str(tiny_mlm_dir)), preset("mlm")).save(out)
    return out


def run_main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """The console entry point (``pretrieve ...``): exit code and stderr."""
    monkeypatch.setattr(sys, "argv", ["pretrieve", *map(str, args)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


def test_checkpoints_without_cpdae_decoder_exit_2(monkeypatch, capsys, tiny_mlm_dir, mlm_checkpoint, cpdae_final,
                                                  corpus, tmp_path):
    code, message = run_main(monkeypatch, capsys, "analyze", "word-distribution", "--model", tiny_mlm_dir,
                             "--text", "a text")
    assert code == 2 and "method.json missing" in message and "no CPDAE decoder" in message

    code, message = run_main(monkeypatch, capsys, "analyze", "word-distribution", "--model", mlm_checkpoint,
                             "--text", "a text")
    assert code == 2 and "method 'mlm'" in message and "no CPDAE MLP decoder" in message

    headless = tmp_path / "headless"
    shutil.copytree(cpdae_final, headless)
    (headless / "heads.safetensors").unlink()
    code, message = run_main(monkeypatch, capsys, "analyze", "stopword-mass", "--model", cpdae_final, "--model",
                             headless, "--corpus", corpus)
    assert code == 2 and "heads.safetensors" in message and str(headless) in message

    result = invoke("analyze", "word-distribution", "--model", tmp_path / "nowhere", "--text", "a text")
    assert result.exit_code != 0 and isinstance(result.exception, InputError)
    empty = invoke("analyze", "word-distribution", "--model", cpdae_final, "--text", "  ")
    assert empty.exit_code != 0 and "--text is empty" in str(empty.exception)

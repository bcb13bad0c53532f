"""`pretrieve export` / `pretrieve.export`: the export folder, its model card (recipe, results table with t-tests,
citations) and the push to the Hub, checked offline against a patched HfApi."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pretrieve
from pretrieve.cli import app, main
from pretrieve.modeling.dual_encoder import DualEncoder
from pretrieve.modeling.export import export_retriever
from pretrieve.modeling.representations import DenseRepresentation

RESULTS_MD = """# Results: tiny-recipe

| retriever | collection | nDCG@10 | MRR@10 | R@100 |
|---|---|---|---|---|
| bm25 | scifact | 0.6762 | 0.6413 | 0.9127 |
| finetune-s1 | scifact | 0.6508 | 0.6091 | 0.9237 |

Paired two-sided t-tests of `finetune-s1` against each baseline (nDCG@10 per query; Δ = final − baseline [95 % CI], ▲/▼: p ≤ 0.05):

| collection | vs `bm25`: Δ (p) |
|---|---|
| scifact | -0.0254 [-0.0500, -0.0008] (p = 0.043) |
"""


@pytest.fixture()
def fine_tuned(tiny_bert_dir, tokenizer, tmp_path) -> Path:
    """A fine-tuned-looking retriever folder with training leftovers that an export must not carry."""
    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean", normalize=True, temperature=0.05))
    out = export_retriever(model, tokenizer, tmp_path / "finetune-s1" / "final", 48,
                           training={"stage": 1, "query_max_len": 16, "passage_max_len": 48, "num_negatives": 3,
                                     "init": "bert-base-uncased"})
    (out / "finetune_config.json").write_text(json.dumps({"config": {"data": "scifact"},
                                                          "groups_stats": {"kept": 728}}))
    (out / "logs.jsonl").write_text("{}\n")
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "step-1.bin").write_bytes(b"x")
    return out


def test_export_command_writes_a_card_with_the_recipe_and_its_results(fine_tuned, tmp_path):
    recipe_out = tmp_path / "recipe-out"
    recipe_out.mkdir()
    (recipe_out / "recipe.resolved.json").write_text(json.dumps(
        {"name": "tiny-recipe", "model": "bert-base-uncased", "pretrain": {"method": "bow"},
         "stages": [{"pretrain": {}}, {"finetune": {"stage": 1}}]}))
    (recipe_out / "results.md").write_text(RESULTS_MD)
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(fine_tuned), "--out", str(out), "--recipe-out", str(recipe_out),
                                      "--query-prompt", "query: "])
    assert result.exit_code == 0, result.output
    card = (out / "README.md").read_text()
    assert "library_name: sentence-transformers" in card and "base_model: bert-base-uncased" in card
    assert "recipe `tiny-recipe`" in card and "method: bow" in card            # the recipe, as YAML
    assert "| finetune-s1 | scifact | 0.6508 | 0.6091 | 0.9237 |" in card        # the results table
    assert "| scifact | -0.0254 [-0.0500, -0.0008] (p = 0.043) |" in card        # the t-tests
    assert "728 training queries" in card and "`scifact`" in card
    assert "Ma et al. (2024). *Drop your Decoder" in card and "Reimers et al. (2019). *Sentence-BERT" in card
    assert "Devlin et al. (2019)" in card   # the bow preset: its objectives mlm (BERT) and bow (Drop your Decoder)
    assert "encode_query" in card and "pretrieve.load_retriever" in card and "apache-2.0" in card
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert {task: text for task, text in prompts.items() if text} == {"query": "query: "}
    assert not (out / "logs.jsonl").exists() and not (out / "checkpoints").exists()


class FakeHfApi:
    """Records what would be sent to the Hub: the repository created and the files of the uploaded folder."""

    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def whoami(self):
        FakeHfApi.calls.append(("whoami", self.token))
        return {"name": "someone"}

    def create_repo(self, repo_id, **kwargs):
        FakeHfApi.calls.append(("create_repo", repo_id, kwargs, self.token))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, repo_id, folder_path, **kwargs):
        files = sorted(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
        FakeHfApi.calls.append(("upload_folder", repo_id, kwargs, files))


def test_push_to_hub_uploads_the_export_folder_and_nothing_else(fine_tuned, tmp_path, monkeypatch):
    import pretrieve.modeling.export as export_module

    FakeHfApi.calls = []
    monkeypatch.setattr(export_module, "HfApi", FakeHfApi)
    out = pretrieve.export(fine_tuned, tmp_path / "exported", push_to_hub="someone/tiny-retriever", private=True,
                           token="hf_test")
    whoami, (create, repo, create_kwargs, token), (upload, upload_repo, upload_kwargs, files) = FakeHfApi.calls
    assert whoami == ("whoami", "hf_test")   # the Hub and the token checked first
    assert (create, repo, token) == ("create_repo", "someone/tiny-retriever", "hf_test")
    assert create_kwargs["private"] is True and create_kwargs["exist_ok"] is True
    assert (upload, upload_repo, upload_kwargs["repo_type"]) == ("upload_folder", "someone/tiny-retriever", "model")
    expected = {"README.md", "config.json", "model.safetensors", "dual_encoder.json", "finetune_config.json",
                "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "1_Pooling/config.json", "tokenizer.json", "tokenizer_config.json"}
    assert expected <= set(files)
    assert set(files) == {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not any(name.startswith(("checkpoints/", "logs")) for name in files)
    assert 'SentenceTransformer("someone/tiny-retriever")' in (out / "README.md").read_text()


def test_push_without_a_token_is_one_error_line_before_any_work(fine_tuned, tmp_path, monkeypatch, capsys):
    import pretrieve.modeling.export as export_module

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(export_module, "get_token", lambda: None)
    monkeypatch.setattr(export_module, "HfApi", FakeHfApi)
    out = tmp_path / "exported"
    monkeypatch.setattr(sys, "argv", ["pretrieve", "export", str(fine_tuned), "--out", str(out),
                                      "--push-to-hub", "someone/tiny-retriever"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and "token" in errors[0], errors
    assert not out.exists()


def test_export_refuses_a_folder_that_is_not_a_pretrieve_retriever(tiny_bert_dir, tmp_path):
    from pretrieve.errors import InputError

    with pytest.raises(InputError, match="dual_encoder.json"):
        pretrieve.export(tiny_bert_dir, tmp_path / "exported")


def test_a_recipe_exports_its_final_retriever_with_the_card(fine_tuned, tmp_path):
    """The recipe's last step (after results.md): ``export/`` holds the final row's retriever and its card."""
    from pretrieve.recipe.runner import RunState, export_final

    state = RunState(recipe={"name": "tiny-recipe", "stages": [{"finetune": {"stage": 1}}]}, out=tmp_path / "run",
                     data=Path("scifact"), base_model="bert-base-uncased",
                     given={"retriever": {"finetune-s1": str(fine_tuned)}})
    state.out.mkdir()
    (state.out / "results.md").write_text(RESULTS_MD)
    rows = [{"retriever": "bm25", "collection": "scifact"},
            {"retriever": "finetune-s1", "collection": "scifact", "final": True, "vs": {}}]
    exported = export_final(state, {"rows": rows})
    assert exported == state.out / "export"
    card = (exported / "README.md").read_text()
    assert "recipe `tiny-recipe`" in card and "this model is the row `finetune-s1`" in card
    assert "| finetune-s1 | scifact | 0.6508 | 0.6091 | 0.9237 |" in card and "(p = 0.043)" in card
    assert (exported / "modules.json").is_file()


def test_the_cards_yaml_header_is_what_the_hub_reads(tiny_bert_dir, tokenizer, minilm, tmp_path):
    """``base_model`` as a Hub id (the offline alias's folder), ``datasets``, a ``model-index`` with the recipe's
    metrics, the training settings of a CLI/API fine-tuning and the number of training queries it really used."""
    from huggingface_hub import ModelCard

    model = DualEncoder.from_pretrained(tiny_bert_dir, DenseRepresentation("mean", normalize=True, temperature=0.05))
    folder = export_retriever(model, tokenizer, tmp_path / "ft" / "final", 48,
                              training={"stage": 1, "query_max_len": 16, "passage_max_len": 48, "num_negatives": 1,
                                        "init": str(minilm)})
    (folder / "finetune_config.json").write_text(json.dumps({
        "config": {"data": "/somewhere/data/scifact", "max_groups": 16, "max_steps": 4, "batch_size": 4,
                   "lr": 2e-5, "num_negatives": 1, "out": "/somewhere/ft", "log_every": 1},
        "groups_stats": {"kept": 809}}))
    recipe_out = tmp_path / "recipe-out"
    recipe_out.mkdir()
    (recipe_out / "recipe.resolved.json").write_text(json.dumps({"name": "r", "model": "minilm"}))
    (recipe_out / "results.json").write_text(json.dumps({"rows": [
        {"retriever": "bm25", "collection": "scifact", "nDCG@10": 0.6762},
        {"retriever": "finetune-s1", "collection": "scifact", "final": True, "nDCG@10": 0.7012, "R@100": 0.93}]}))
    out = pretrieve.export(folder, tmp_path / "exported", recipe_out=recipe_out)
    card = ModelCard.load(out / "README.md")
    header = card.data.to_dict()
    assert header["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert header["datasets"] == ["BeIR/scifact"]
    results = header["model-index"][0]["results"]
    assert {(r["dataset"]["name"], m["name"], m["value"]) for r in results for m in r["metrics"]} == \
        {("scifact", "nDCG@10", 0.7012), ("scifact", "R@100", 0.93)}
    assert header["library_name"] == "sentence-transformers" and header["pipeline_tag"] == "sentence-similarity"
    text = card.text
    assert "16 training queries (groups of a positive and 1 negative)" in text and "809" not in text
    assert "`max_steps=4`" in text and "`batch_size=4`" in text and "`lr=2e-05`" in text
    assert "`out=" not in text and "site-packages" not in card.content


def test_every_evaluation_goes_into_the_model_index_with_language_and_real_hub_ids(fine_tuned, tmp_path):
    """A model fine-tuned with evaluation while training (``evaluation.json``) exported by ``pretrieve.export`` with
    what the caller measured: the dev measures of the best step and the given ones in ``model-index``, ``language:
    en``, and ``datasets`` only with ids the Hub has (no ``BeIR/cranfield``)."""
    from huggingface_hub import ModelCard

    (fine_tuned / "finetune_config.json").write_text(json.dumps({"config": {"data": "/x/scifact", "eval_steps": 2}}))
    (fine_tuned / "evaluation.json").write_text(json.dumps({
        "metric": "nDCG@10", "best_step": 4, "best_value": 0.61, "queries": "81 dev queries of scifact",
        "collection": "scifact", "split": "dev",
        "history": [{"step": 2, "eval/nDCG@10": 0.5, "eval/R@100": 0.8},
                    {"step": 4, "eval/nDCG@10": 0.61, "eval/R@100": 0.9}]}))
    out = pretrieve.export(fine_tuned, tmp_path / "exported",
                           metrics={"scifact": {"nDCG@10": 0.7}, "cranfield": {"nDCG@10": 0.4}})
    card = ModelCard.load(out / "README.md")
    header = card.data.to_dict()
    assert header["language"] == ["en"]
    assert header["datasets"] == ["BeIR/scifact"]
    results = header["model-index"][0]["results"]
    assert {(r["dataset"]["name"], r["dataset"]["split"], m["name"], m["value"]) for r in results
            for m in r["metrics"]} == {("scifact", "test", "nDCG@10", 0.7), ("cranfield", "test", "nDCG@10", 0.4),
                                       ("scifact", "dev", "nDCG@10", 0.61), ("scifact", "dev", "R@100", 0.9)}
    assert {r["dataset"]["type"] for r in results} == {"BeIR/scifact", "cranfield"}
    assert "this model is step 4, the best by nDCG@10" in card.text and (out / "evaluation.json").is_file()


def test_push_without_a_network_is_one_error_line_before_exporting(fine_tuned, tmp_path, monkeypatch, capsys):
    """A token but no Hub (a closed port stands for no network): exit 2, one ``error:`` line, nothing exported."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    out = tmp_path / "exported"
    monkeypatch.setattr(sys, "argv", ["pretrieve", "export", str(fine_tuned), "--out", str(out),
                                      "--push-to-hub", "someone/tiny-retriever"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.err + captured.out).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: push_to_hub: the Hugging Face Hub cannot be used"), lines
    assert not out.exists()


def test_dry_run_lists_what_would_be_uploaded_without_the_network(fine_tuned, tmp_path, monkeypatch):
    import pretrieve.modeling.export as export_module

    class NoNetwork:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a dry run contacted the Hub")

    monkeypatch.setattr(export_module, "HfApi", NoNetwork)
    monkeypatch.setattr(export_module, "get_token", lambda: None)
    out = tmp_path / "exported"
    result = CliRunner().invoke(app, ["export", str(fine_tuned), "--out", str(out), "--push-to-hub",
                                      "someone/tiny-retriever", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run: would upload" in result.output and "https://huggingface.co/someone/tiny-retriever" in result.output
    assert "README.md" in result.output and "model.safetensors" in result.output and "pushed:" not in result.output
    assert (out / "README.md").is_file()


def test_export_metrics_file_feeds_the_model_index_from_evaluate_or_recipe_results(fine_tuned, tmp_path, monkeypatch,
                                                                                  capsys):
    """``pretrieve export --metrics FILE``: ``pretrieve evaluate --json`` output (one collection: the qrels' folder
    and split; several: its ``scores``) or a recipe's ``results.json`` (the final row by default) becomes the card's
    ``model-index``; a file with several runs needs ``--metrics-run``, and a bad file is one error line, exit 2."""
    from huggingface_hub import ModelCard

    def index(out):
        results = ModelCard.load(out / "README.md").data.to_dict()["model-index"][0]["results"]
        return {(r["dataset"]["name"], r["dataset"]["split"], m["name"], m["value"]) for r in results
                for m in r["metrics"]}

    one = tmp_path / "evaluate.json"   # `pretrieve evaluate RUN... --data scifact --split dev --json`
    one.write_text(json.dumps({"measures": ["nDCG@10"], "qrels": "/data/scifact/qrels/dev.tsv",
                               "runs": [{"name": "bm25", "aggregate": {"nDCG@10": 0.5}},
                                        {"name": "tuned", "aggregate": {"nDCG@10": 0.61, "R@100": 0.9}}]}))
    def refused(*args):   # exit 2, one error line, nothing exported
        monkeypatch.setattr(sys, "argv", ["pretrieve", "export", str(fine_tuned), "--out", str(tmp_path / "x"), *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert exit_info.value.code == 2 and len(errors) == 1 and not (tmp_path / "x").exists(), errors
        return errors[0]

    runner = CliRunner()
    assert "2 runs (bm25, tuned)" in refused("--metrics", str(one))
    assert "no run 'other'" in refused("--metrics", str(one), "--metrics-run", "other")
    done = runner.invoke(app, ["export", str(fine_tuned), "--out", str(tmp_path / "a"), "--metrics", str(one),
                               "--metrics-run", "tuned"])
    assert done.exit_code == 0, done.output
    assert index(tmp_path / "a") == {("scifact", "dev", "nDCG@10", 0.61), ("scifact", "dev", "R@100", 0.9)}

    many = tmp_path / "beir.json"   # `pretrieve evaluate --model M --data scifact --data cranfield --json`
    many.write_text(json.dumps({"collections": ["scifact", "cranfield"], "measures": ["nDCG@10"],
                                "runs": [{"name": "tuned", "scores": {"scifact": {"nDCG@10": 0.7},
                                                                      "cranfield": {"nDCG@10": 0.4}}}]}))
    assert runner.invoke(app, ["export", str(fine_tuned), "--out", str(tmp_path / "b"), "--metrics",
                               str(many)]).exit_code == 0
    assert index(tmp_path / "b") == {("scifact", "test", "nDCG@10", 0.7), ("cranfield", "test", "nDCG@10", 0.4)}

    recipe = tmp_path / "results.json"
    recipe.write_text(json.dumps({"rows": [{"retriever": "bm25", "collection": "scifact", "nDCG@10": 0.67},
                                           {"retriever": "finetune-s1", "collection": "scifact", "nDCG@10": 0.65,
                                            "final": True}]}))
    assert runner.invoke(app, ["export", str(fine_tuned), "--out", str(tmp_path / "c"), "--metrics",
                               str(recipe)]).exit_code == 0
    assert index(tmp_path / "c") == {("scifact", "test", "nDCG@10", 0.65)}

    (tmp_path / "bad.json").write_text("[1, 2]")
    assert "bad.json" in refused("--metrics", str(tmp_path / "bad.json"))

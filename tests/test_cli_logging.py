"""The CLI's logging setup."""

from __future__ import annotations


def test_transformers_load_reports_are_condensed_to_one_line(caplog):
    import logging

    from pretrieve.cli import CompactLoadReport

    table = ("\x1b[1mBertForSequenceClassification LOAD REPORT\x1b[0m from: /models/tiny\n"
             "Key                     | Status     | \n"
             "------------------------+------------+-\n"
             "cls.predictions.bias    | UNEXPECTED | \n"
             "classifier.weight       | MISSING    | \n"
             "classifier.bias         | MISSING    | \n"
             "bert.pooler.dense.bias  | MISSING    | \n\nNotes:\n- MISSING:\tthose params were newly initialized")
    record = logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1, table, (), None)
    assert CompactLoadReport().filter(record)
    assert record.getMessage() == ("BertForSequenceClassification from /models/tiny: unused checkpoint weights: "
                                   "cls.predictions; newly initialised: classifier, bert.pooler.dense")
    other = logging.LogRecord("transformers.modeling_utils", logging.WARNING, __file__, 1, "other %s", ("x",), None)
    assert CompactLoadReport().filter(other) and other.getMessage() == "other x"

"""What README.md and docs/ quote from a stored table is that table's value now.

A document quotes a named quantity (flashnum.figures.quantities) as its rendered value
followed by an invisible marker, `1.84<!--q:FaThreeProtocolRatio-->`; the paper quotes the
same quantity as the macro \\FaThreeProtocolRatio of numbers.tex. A yes/no fact is quoted
as the words of its answer. Here every quantity is recomputed from the stored tables and
bench results, and every marked place must say it. A table is generated whole from
the store between <!-- table:Name --> and <!-- /table --> (flashnum.figures.docs.TABLES):
each block must be what the store gives now, byte for byte.
"""

from pathlib import Path

import pytest

from flashnum.figures.context import Figures
from flashnum.figures.docs import QUOTED, TABLES, documents, misquoted, write_tables
from flashnum.figures.numbers import FACTS, NUMBERS
from flashnum.figures.quantities import QUANTITIES
from flashnum.figures.quoting import (
    Fact,
    Quantity,
    markdown,
    quoted_as,
    quotes,
    require,
    sci,
    tables,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = documents(ROOT)


@pytest.fixture(scope="module")
def F(tmp_path_factory):
    return Figures(ROOT / "experiments", tmp_path_factory.mktemp("figures"))


def test_every_marked_quote_is_its_quantity_now(F):
    assert misquoted(F, DOCS) == []


def test_every_quantity_is_quoted_and_computable(F):
    """A quantity nobody quotes is dead weight; one whose source is missing cannot be checked."""
    marked = {name for path in DOCS for name, _ in quotes(path.read_text())}
    paper = (ROOT / "paper" / "paper.tex").read_text()
    for name, q in QUOTED.items():
        macro = f"\\if{name}" if q.fact else f"\\{name}"  # a yes/no: the paper branches on it
        assert name in marked or (q.paper and macro in paper), f"{name} is quoted nowhere"
        assert q.value(F) is not None, f"{name}: its table or bench result is missing"


def test_every_table_is_in_a_document_and_computable(F):
    blocks = [name for path in DOCS for name, _ in tables(path.read_text())]
    assert sorted(set(blocks)) == sorted(TABLES), "a table no document shows, or an unknown one"
    assert len(blocks) == len(set(blocks)), "a table shown twice"
    for name, fn in TABLES.items():
        assert len(fn(F)) > 0, f"{name}: its table has no rows"


def test_a_stale_table_is_reported_with_its_name_and_file_and_rewritten(F, tmp_path,
                                                                         monkeypatch):
    import pandas as pd

    import flashnum.figures.docs as docs

    monkeypatch.setitem(docs.TABLES, "Demo", lambda F: pd.DataFrame({"a": ["x"], "b": [1.5]}))
    want = "| a | b |\n|---|---|\n| x | 1.5 |\n"  # written out here: the oracle
    good = tmp_path / "good.md"
    good.write_text(f"before\n<!-- table:Demo -->\n{want}<!-- /table -->\nafter\n")
    assert misquoted(F, [good]) == [] and write_tables(F, [good]) == []
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- table:Demo -->\n| a | b |\n|---|---|\n| x | 1.6 |\n<!-- /table -->\n"
                   "<!-- table:NoSuchTable -->\n<!-- /table -->\n")
    said = misquoted(F, [bad])
    assert said == [f"{bad}: table Demo differs from what the store gives (python -m "
                    "flashnum.figures rewrites it)",
                    f"{bad}: unknown table 'NoSuchTable' (declare it in TABLES)"]
    assert write_tables(F, [bad]) == [bad]
    assert bad.read_text().startswith(f"<!-- table:Demo -->\n{want}<!-- /table -->\n")
    assert misquoted(F, [bad]) == said[1:]


def test_the_renderer_writes_a_header_a_rule_and_one_line_per_row():
    import pandas as pd

    df = pd.DataFrame({"N": [256, 512], "share": ["99.5%", "a|b"]})
    # a "|" in a cell would end the cell: written "/"
    assert markdown(df) == "| N | share |\n|---|---|\n| 256 | 99.5% |\n| 512 | a/b |\n"


def test_the_papers_quantities_have_a_macro_and_only_they():
    paper = {name for name, q in QUANTITIES.items() if q.paper and not q.fact}
    assert paper <= set(NUMBERS) and not (set(QUANTITIES) - paper) & set(NUMBERS)
    facts = {name for name, q in QUANTITIES.items() if q.paper and q.fact}
    assert facts <= set(FACTS)


def test_a_changed_number_or_an_unknown_name_is_reported(F, tmp_path):
    q = QUANTITIES["QiuYaoZSixteen"]
    z = q.value(F)
    good = tmp_path / "good.md"
    good.write_text(f"bias z = {q.md(z)}<!--q:QiuYaoZSixteen--> at logit std 16")
    assert misquoted(F, [good]) == []
    bad = tmp_path / "bad.md"
    bad.write_text(f"bias z = {q.md(z + 1)}<!--q:QiuYaoZSixteen-->; {q.md(z)}<!--q:NoSuchThing-->")
    said = misquoted(F, [bad])
    assert len(said) == 2 and "QiuYaoZSixteen" in said[0] and "NoSuchThing" in said[1]


def test_a_fact_is_quoted_as_the_words_of_its_answer(F, tmp_path):
    fact = QUOTED["SweepInvariantsHold"]
    assert fact.fact and fact.value(F) is True
    good = tmp_path / "good.md"
    good.write_text("In every row of every sweep m_ok and l_ok hold<!--q:SweepInvariantsHold-->.")
    assert misquoted(F, [good]) == []
    assert fact.md(False) == "m_ok or l_ok fails in a stored sweep"
    no = Fact("never", lambda F: False, "it holds", "it fails")
    assert no.md(no.value(F)) == "it fails"


def test_a_row_of_a_hand_written_table_is_quoted_in_its_last_cell(F, tmp_path, monkeypatch):
    import flashnum.figures.docs as docs

    monkeypatch.setitem(docs.QUOTED, "Demo", Quantity("a number", lambda F: 1.5, paper=False))
    good = tmp_path / "good.md"
    # the marker sits inside the last cell, so that the row keeps its number of cells
    good.write_text("| x | y |\n|---|---|\n| a | 1.5<!--q:Demo--> |\n")
    assert misquoted(F, [good]) == []
    bad = tmp_path / "bad.md"
    bad.write_text("| a | 1.6<!--q:Demo--> |\n")
    assert misquoted(F, [bad]) == [f"{bad}: Demo is quoted as ...'| a | 1.6', its value is 1.5"]


def test_a_statement_the_tables_no_longer_support_is_reported(F, tmp_path, monkeypatch):
    import flashnum.figures.docs as docs

    def value(F):
        require(1 > 2, "one is more than two")
        return "never"

    monkeypatch.setitem(docs.QUOTED, "Demo", Quantity("a claim that fails", value, paper=False))
    doc = tmp_path / "doc.md"
    doc.write_text("never<!--q:Demo-->")
    assert misquoted(F, [doc]) == [f"{doc}: Demo: the stored tables no longer say: one is more "
                                   "than two"]


def test_a_quote_is_a_whole_token():
    # 12.5 does not quote 2.5, nor -2.5 quote 2.5; the value may follow any punctuation
    assert quoted_as("ratio 2.5", "2.5") and quoted_as("(2.5", "2.5")
    assert not quoted_as("ratio 12.5", "2.5") and not quoted_as("z = -2.5", "2.5")
    assert quoted_as("per seed 1.57-2.23", "2.23") and not quoted_as("ratio 2.5", "2.50")
    assert sci(2)(3.27e-4) == "3.3e-4" and sci(3)(2.5e-4) == "2.50e-4"


def test_a_marker_in_code_is_an_example_not_a_quote():
    text = ("quoted 1.84<!--q:A--> here; `2<!--q:B-->` in a span\n"
            "```text\n3<!--q:C-->\n```\nand 4<!--q:D--> after the block; `a span\n"
            "over a line break 5<!--q:E-->`")
    assert [name for name, _ in quotes(text)] == ["A", "D"]
    # the text before a marker is read as Markdown renders it: other markers and line
    # breaks are not there
    assert quotes("a 1<!--q:A-->\nb  2<!--q:B-->") == [("A", "a 1"), ("B", "a 1 b 2")]


def test_a_view_shows_the_stored_rows_ranges_and_expressions(tmp_path):
    """flashnum.figures.docs.views: the rows `where` keeps, a group's range, an expression
    column, a missing value, and a `never` query that selects a row; the expected cells are
    written out here (the oracle)."""
    from types import SimpleNamespace

    import pandas as pd

    from flashnum.figures.docs.views import view
    from flashnum.figures.quoting import Contradicted

    (tmp_path / "demo").mkdir()
    pd.DataFrame({"g": ["x", "x", "y", "z"], "a": [1.0, 2.0, 3.0, -1.0],
                  "b": [0.5, 0.25, float("nan"), 4.0]}).to_parquet(
        tmp_path / "demo" / "results.parquet")
    F = SimpleNamespace(experiments=str(tmp_path))
    got = view("demo", "a > 0", ["a", "a / b"], by=["g"])(F)
    assert got.values.tolist() == [["x", "1-2", "2-8"], ["y", "3", "-"]]
    assert view("demo", "g == 'z'", ["g", "b"])(F).values.tolist() == [["z", "4"]]
    med = view("demo", "g == 'x'", ["a"], by=["g"], agg="median (span)")(F)
    assert med.values.tolist() == [["x", "1.5 (1-2)"]]
    with pytest.raises(Contradicted, match="every a is positive"):
        view("demo", "", ["a"], never={"a <= 0": "every a is positive"})(F)


def test_a_record_fills_each_row_from_a_bench_result(tmp_path):
    """flashnum.figures.docs.views.record: a template over the JSON, plain text, and a
    function of the record; the expected cells are written out here (the oracle)."""
    import json
    from types import SimpleNamespace

    from flashnum.figures.docs.views import record

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "demo.json").write_text(json.dumps(
        {"speed": {"ratio": 1.2345}, "memory": [{"n": 4}, {"n": 8}]}))
    F = SimpleNamespace(experiments=str(tmp_path / "experiments"))
    rows = [("ratio", "{speed[ratio]:.2f}", "<= 2"),
            ("sizes", lambda r: ", ".join(str(m["n"]) for m in r["memory"]), "")]
    got = record("demo", rows, ["what", "measured", "goal"])(F)
    assert got.values.tolist() == [["ratio", "1.23", "<= 2"], ["sizes", "4, 8", ""]]

"""What README.md and docs/ quote from a stored table is that table's value now.

A document quotes a named quantity (flashnum.figures.quantities) as its rendered value
followed by an invisible marker, `1.84<!--q:FaThreeProtocolRatio-->`; the paper quotes the
same quantity as the macro \\FaThreeProtocolRatio of numbers.tex. A yes/no fact is quoted
as the words of its answer; a passage (a table, a sentence with several numbers:
flashnum.figures.docs) as each of its fragments, each followed by its marker. Here every
quantity is recomputed from the stored tables and bench results, and every marked place
must say it, every passage fragment be marked somewhere. A table is generated whole from
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
    Passage,
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


def test_a_passage_checks_each_fragment_and_that_each_is_marked(F, tmp_path, monkeypatch):
    import flashnum.figures.docs as docs

    rows = lambda F: ["| a | 1.5 |", "| b | 2 |", "and 3 more"]  # noqa: E731
    monkeypatch.setitem(docs.QUOTED, "Demo", Passage("a table and a sentence", rows))
    good = tmp_path / "good.md"
    # a row's marker sits in its last cell, so that the row keeps its number of cells
    good.write_text("| x | y |\n|---|---|\n| a | 1.5<!--q:Demo--> |\n| b | 2<!--q:Demo--> |\n\n"
                    "and 3\nmore<!--q:Demo-->.")
    assert misquoted(F, [good]) == []
    bad = tmp_path / "bad.md"
    bad.write_text("| a | 1.6<!--q:Demo--> |\n| b | 2<!--q:Demo--> |\n")
    said = misquoted(F, [bad])
    assert any("no fragment of it ends" in x and "1.6" in x for x in said)
    assert any("'| a | 1.5 |', and no marked place does" in x for x in said)
    assert any("'and 3 more', and no marked place does" in x for x in said)


def test_a_statement_the_tables_no_longer_support_is_reported(F, tmp_path, monkeypatch):
    import flashnum.figures.docs as docs

    def rows(F):
        require(1 > 2, "one is more than two")
        return ["never"]

    monkeypatch.setitem(docs.QUOTED, "Demo", Passage("a claim that fails", rows))
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

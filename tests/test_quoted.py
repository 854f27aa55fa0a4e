"""A number README.md and docs/ quote through a named quantity is that quantity's value now.

A document quotes a named quantity (flashnum.figures.quantities) as its rendered value
followed by an invisible marker, `1.84<!--q:FaThreeProtocolRatio-->`; the paper quotes the
same quantity as the macro \\FaThreeProtocolRatio of numbers.tex. Here every quantity is
recomputed from the stored tables and bench results, and every marked place must say it.
"""

from pathlib import Path

import pytest

from flashnum.figures.context import Figures
from flashnum.figures.numbers import NUMBERS
from flashnum.figures.quantities import QUANTITIES, misquoted, quoted_as, quotes, sci

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.fixture(scope="module")
def F(tmp_path_factory):
    return Figures(ROOT / "experiments", tmp_path_factory.mktemp("figures"))


def test_every_marked_quote_is_its_quantity_now(F):
    assert misquoted(F, DOCS) == []


def test_every_quantity_is_quoted_and_computable(F):
    """A quantity nobody quotes is dead weight; one whose source is missing cannot be checked."""
    marked = {name for path in DOCS for name, _ in quotes(path.read_text())}
    paper = (ROOT / "paper" / "paper.tex").read_text()
    for name, q in QUANTITIES.items():
        assert name in marked or (q.paper and f"\\{name}" in paper), f"{name} is quoted nowhere"
        assert q.value(F) is not None, f"{name}: its table or bench result is missing"


def test_the_papers_quantities_have_a_macro_and_only_they():
    paper = {name for name, q in QUANTITIES.items() if q.paper}
    assert paper <= set(NUMBERS) and not (set(QUANTITIES) - paper) & set(NUMBERS)


def test_a_changed_number_or_an_unknown_name_is_reported(F, tmp_path):
    z = QUANTITIES["QiuYaoZ"].value(F)
    good = tmp_path / "good.md"
    good.write_text(f"bias z = {z:.1f}<!--q:QiuYaoZ--> at logit std 16")
    assert misquoted(F, [good]) == []
    bad = tmp_path / "bad.md"
    bad.write_text(f"bias z = {z + 1:.1f}<!--q:QiuYaoZ-->; {z:.1f}<!--q:NoSuchThing-->")
    said = misquoted(F, [bad])
    assert len(said) == 2 and "QiuYaoZ" in said[0] and "NoSuchThing" in said[1]


def test_a_quote_is_a_whole_token():
    # 12.5 does not quote 2.5, nor -2.5 quote 2.5; the value may follow any punctuation
    assert quoted_as("ratio 2.5", "2.5") and quoted_as("(2.5", "2.5")
    assert not quoted_as("ratio 12.5", "2.5") and not quoted_as("z = -2.5", "2.5")
    assert quoted_as("per seed 1.57-2.23", "2.23") and not quoted_as("ratio 2.5", "2.50")
    assert sci(2)(3.27e-4) == "3.3e-4" and sci(3)(2.5e-4) == "2.50e-4"



def test_a_marker_in_code_is_an_example_not_a_quote():
    text = ("quoted 1.84<!--q:A--> here; `2<!--q:B-->` in a span\n"
            "```text\n3<!--q:C-->\n```\nand 4<!--q:D--> after the block")
    assert [name for name, _ in quotes(text)] == ["A", "D"]

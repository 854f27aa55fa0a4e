"""Every `flashnum.` dotted path and every flashnum/ file that README.md, docs/, conf/ and
paper/ name exists: a dotted path imports (its longest importable prefix, then attribute
by attribute), and `from flashnum.x import a, b` names x.a and x.b.
"""

import importlib
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "conf").rglob("*.yaml"), *(ROOT / "paper").rglob("*.tex"),
                *(ROOT / "paper").rglob("*.md")])
DOTTED = re.compile(r"(?<![\w/.-])flashnum(?:\.[A-Za-z_]\w*)+")
FROM = re.compile(r"from\s+(flashnum(?:\.\w+)*)\s+import\s+\(?([\w\s,]+)")
FILE = re.compile(r"(?<![\w/.-])flashnum/[\w/]+\.(?:py|c)\b")


def named_paths(text: str) -> set[str]:
    text = text.replace("\\_", "_")  # TeX writes flashnum.studies.head\_stats
    found = set(DOTTED.findall(text))
    for m in FROM.finditer(text):
        found |= {f"{m.group(1)}.{n.split()[0]}" for n in m.group(2).split(",") if n.strip()}
    return found


def resolves(path: str) -> bool:
    """As Python reads the path after `import flashnum`: attribute by attribute, importing a
    submodule only where the attribute is missing (a function that shadows a module, as
    flashnum.reference_backward does, is what the dotted path names)."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], start=2):
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        if not isinstance(obj, types.ModuleType):
            return False
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            return False
    return True


def test_the_texts_are_found():
    assert len(TEXTS) > 30 and any(p.suffix == ".yaml" for p in TEXTS)


@pytest.mark.parametrize("text", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_path_named_resolves(text):
    paths = named_paths(text.read_text(errors="replace"))
    assert sorted(p for p in paths if not resolves(p)) == []


@pytest.mark.parametrize("text", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flashnum_file_named_exists(text):
    files = set(FILE.findall(text.read_text(errors="replace")))
    assert sorted(f for f in files if not (ROOT / f).exists()) == []


def test_the_checker_rejects_what_does_not_exist():
    assert named_paths("from flashnum.distributions import describe, make") >= {
        "flashnum.distributions.describe", "flashnum.distributions.make"}
    assert not resolves("flashnum.distributions.describe")
    assert not resolves("flashnum.engine.no_such_name")
    assert named_paths(r"\code{flashnum.studies.head\_stats}") == {"flashnum.studies.head_stats"}
    assert resolves("flashnum.inputs.distributions.describe")
    assert resolves("flashnum.reference.plain64")

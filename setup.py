"""Build hook: a wheel carries conf/ (the Hydra configs, whose only source is the top-level
conf/ folder) as flashnum/conf/, so that a non-editable install runs from any directory.

Everything else is in pyproject.toml. flashnum.harness.paths finds flashnum/conf/ in an
installed package and falls back to ../conf/ in a checkout or an editable install.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONF = Path(__file__).resolve().parent / "conf"


class BuildPyWithConf(build_py):
    """build_py, then copy conf/**/*.yaml to <build>/flashnum/conf/ (not in editable mode)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads conf/ in place
        for src in sorted(CONF.rglob("*.yaml")):
            dst = Path(self.build_lib) / "flashnum" / "conf" / src.relative_to(CONF)
            self.mkpath(str(dst.parent))
            self.copy_file(str(src), str(dst))


setup(cmdclass={"build_py": BuildPyWithConf})

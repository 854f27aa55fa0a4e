#!/usr/bin/env bash
# CI for the paper: install texlive if missing (Debian), regenerate paper/figures/ from the
# stored results tables (never rerunning an experiment), build paper/paper.pdf.
# Uses .venv/bin/python when it exists (make setup), else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v latexmk >/dev/null || ! command -v pdflatex >/dev/null; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends \
        latexmk texlive-latex-base texlive-latex-recommended texlive-latex-extra \
        texlive-fonts-recommended
fi
PYTHON=python3
if [ -x .venv/bin/python ]; then PYTHON="$(pwd)/.venv/bin/python"; fi
make -C paper figures PYTHON="$PYTHON"
make -C paper
test -s paper/paper.pdf
echo "built paper/paper.pdf"

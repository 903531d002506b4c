"""Where the course files live. The course runs from an editable checkout (``pip install -e .``), so
the repository root is the folder above the ``minillm`` package."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

"""Test-suite set-up: the Hypothesis profile comes from $HYPOTHESIS_PROFILE (dev by default)."""

from stateful import load_from_env

load_from_env()

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # so tests can import their helpers (broken.py)

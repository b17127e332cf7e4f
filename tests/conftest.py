"""Test-suite set-up.

- The Hypothesis profile comes from $HYPOTHESIS_PROFILE (dev by default).
- Tests import their helpers (broken.py, rqlite_support.py) from this folder.
- Every module of the project is imported here, up front.  Hypothesis draws some values from
  the literals of the local modules loaded so far, so without this a derandomized search could
  find a different example depending on which tests ran earlier in the same xdist worker.
"""

import importlib
import pkgutil
import sys
from pathlib import Path

from stateful import load_from_env

load_from_env()

sys.path.insert(0, str(Path(__file__).parent))


def _import_every_project_module() -> None:
    for package_name in ("harel_ref", "model", "stateful", "examples"):
        try:
            package = importlib.import_module(package_name)
        except ImportError:  # examples/ is importable only from the repository's root
            continue
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            try:
                importlib.import_module(module.name)
            except ImportError:  # an optional extra is not installed: its tests say so
                pass


_import_every_project_module()

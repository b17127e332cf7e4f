"""harel-ref installs one top-level import name, ``harel_ref`` (the model and the checkers are
``harel_ref.model`` and ``harel_ref.stateful``), so a project that has its own ``model`` or
``stateful`` can certify from its own directory, and its modules stay its own.

The wheel and the sdist are built here from a copy of the repository (nothing is written into
the checkout) with the installed setuptools, offline.  The project tests run the command, the
Python API and the pytest plugin with the current directory in a temporary project that has a
``model`` and a ``stateful`` of its own, each of which says whose it is.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Left out of the copy the packages are built from: what git ignores, and git itself.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".hypothesis",
                                    ".pytest_cache", "reports", "build", "dist", "*.db*")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An sdist built from a copy of the repository, and the wheel built from that sdist (so the
    wheel proves the sdist holds every file)."""
    work = tmp_path_factory.mktemp("build")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    dist = work / "dist"
    run = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def test_the_wheel_installs_only_harel_ref(built):
    _, wheel = built
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"harel_ref", "harel_ref-0.1.0.dist-info"}
    # the model and the checkers are in it, under the one name
    for module in ("harel_ref/model/_queue.py", "harel_ref/stateful/_machine.py",
                   "harel_ref/stateful/backends/sql.py", "harel_ref/certify/_engine.py"):
        assert module in names


def test_the_sdist_keeps_the_repository_layout(built):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"model/_queue.py", "stateful/_machine.py", "harel_ref/__init__.py", "pyproject.toml"} <= names


def _packages_not_as_listed(pyproject: str) -> set[str]:
    """The packages that are folders with an ``__init__.py`` but not in pyproject's explicit
    list, and those listed without such a folder."""
    import tomllib

    setuptools = tomllib.loads(pyproject)["tool"]["setuptools"]
    folders = {"harel_ref": ROOT / "harel_ref", **{name: ROOT / path for name, path in setuptools["package-dir"].items()}}
    found = set()
    for name, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(folder).parts]))
    return found ^ set(setuptools["packages"])


def test_every_package_folder_is_listed_in_pyproject():
    """A folder with an ``__init__.py`` that pyproject.toml's explicit package list forgot
    would be missing from the wheel, though an editable install would still find it."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert _packages_not_as_listed(pyproject) == set()
    # the check sees a package left out of the list
    forgot = pyproject.replace('    "harel_ref.stateful.backends",\n', "")
    assert forgot != pyproject
    assert _packages_not_as_listed(forgot) == {"harel_ref.stateful.backends"}


# --- a project of the user's own, with a `model` and a `stateful` ------------------------------

TRANSPORT = '''\
"""The user's transport: harel-ref's in-memory one, but a claim ignores min_priority."""
import model
import stateful
from harel_ref.transport import InMemoryTransport

assert model.WHOSE == "the user's" and stateful.WHOSE == "the user's", (model, stateful)


class IgnoresTheFloor(InMemoryTransport):
    def claim(self, worker_id, visibility, min_priority=0, routing_keys=None):
        return super().claim(worker_id, visibility, 0, routing_keys)


def factory(clock, namespace):
    return InMemoryTransport(clock=clock)


def broken(clock, namespace):
    return IgnoresTheFloor(clock=clock)
'''

USERS_TEST = '''\
import model
import stateful


def test_my_modules_are_mine():
    assert model.WHOSE == "the user's" and stateful.WHOSE == "the user's"
'''


@pytest.fixture(params=["modules", "packages"])
def project(request, tmp_path):
    """A project with ``model`` and ``stateful`` as modules (``model.py``) or as packages
    (``model/``), a ``tests/`` folder of its own, and its transport in ``myqueue.py``."""
    for name in ("model", "stateful"):
        if request.param == "modules":
            (tmp_path / f"{name}.py").write_text('WHOSE = "the user\'s"\n')
        else:
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text('WHOSE = "the user\'s"\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tmp_path / "tests" / "test_mine.py").write_text(USERS_TEST)
    (tmp_path / "myqueue.py").write_text(TRANSPORT)
    return tmp_path


def _in(project, *argv, env=None):
    return subprocess.run([*argv], cwd=project, capture_output=True, text=True, timeout=300, env=env)


def test_the_command_certifies_from_a_project_with_its_own_model(project):
    run = _in(project, "harel-ref", "certify", "myqueue:factory", "--profile", "quick", "--only", "fifo",
              "--only", "priority-floor", "--quiet", "--report-dir", "reports")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    verdicts = {p["property"]: p["verdict"] for p in json.loads((project / "reports/report.json").read_text())["properties"]}
    assert verdicts["fifo"] == verdicts["priority-floor"] == "passed"


def test_the_python_api_and_the_users_modules_side_by_side(project):
    script = (
        "import model, stateful\n"
        "from harel_ref import certify, Capabilities\n"
        "import harel_ref.model, harel_ref.stateful, myqueue\n"
        "assert model.WHOSE == stateful.WHOSE == \"the user's\"\n"
        "assert not hasattr(harel_ref.model, 'WHOSE') and hasattr(harel_ref.model, 'QueueModel')\n"
        "report = certify(myqueue.factory, profile='quick', properties=['fifo'])\n"
        "print(report.outcome)\n"
    )
    run = _in(project, sys.executable, "-c", script)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "passed"


def test_the_pytest_plugin_and_the_users_own_tests(project):
    """Installed, the plugin is loaded by every pytest run of the project: inactive, the user's
    tests run and import the user's modules; active, it certifies (and replaces the suite).
    The project's conftest.py, loaded both times, names whose ``model`` it got."""
    (project / "conftest.py").write_text(
        "import model, stateful\n\n"
        "def pytest_report_header(config):\n"
        "    return f'conftest: model is {model.WHOSE}, stateful is {stateful.WHOSE}'\n"
    )
    header = "conftest: model is the user's, stateful is the user's"
    own = _in(project, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA")
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]
    assert header in own.stdout
    assert "PASSED tests/test_mine.py::test_my_modules_are_mine" in own.stdout

    certified = _in(project, sys.executable, "-m", "pytest", "--harel-transport", "myqueue:factory",
                    "--harel-profile", "quick", "--harel-only", "fifo", "-p", "no:cacheprovider", "-rA")
    assert certified.returncode == 0, certified.stdout[-3000:] + certified.stderr[-3000:]
    assert header in certified.stdout
    assert "PASSED harel-certify::fifo" in certified.stdout


def test_a_reports_reproduction_runs_from_the_project(project):
    """The runnable Python of a failure imports harel_ref's modules by their package names and
    the user's factory from the directory certified in."""
    run = _in(project, "harel-ref", "certify", "myqueue:broken", "--profile", "quick", "--only", "priority-floor",
              "--quiet", "--report-dir", "reports")
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    (failure,) = [p for p in json.loads((project / "reports/report.json").read_text())["properties"]
                  if p["verdict"] == "failed"]
    reproduction = failure["failure"]["reproduction"]
    assert "from harel_ref.stateful import Capabilities" in reproduction
    replay = _in(project, sys.executable, "-c", reproduction)
    assert replay.returncode == 1
    assert "Divergence" in replay.stderr and "min_priority" in replay.stderr, replay.stderr[-3000:]


def test_the_built_wheel_works_from_the_project(built, project, tmp_path_factory):
    """The wheel, unpacked as pip installs it, imported first: the certifier's modules come
    from it, and the user's from the project."""
    _, wheel = built
    site = tmp_path_factory.mktemp("site")
    zipfile.ZipFile(wheel).extractall(site)
    script = (
        "import model, harel_ref.model, harel_ref.stateful.backends.memory\n"
        "from harel_ref import certify\n"
        f"assert harel_ref.model.__file__.startswith({str(site)!r}), harel_ref.model.__file__\n"
        "assert model.WHOSE == \"the user's\"\n"
        "import myqueue\n"
        "print(certify(myqueue.factory, profile='quick', properties=['close']).outcome)\n"
    )
    run = _in(project, sys.executable, "-c", script, env={**os.environ, "PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "passed"


def test_no_module_of_harel_ref_imports_a_top_level_model_or_stateful(project):
    """Every module of harel-ref imported from a project whose ``model`` and ``stateful`` refuse
    to be imported: none of them reaches for either."""
    for name in ("model", "stateful"):
        for path in (project / f"{name}.py", project / name / "__init__.py"):
            if path.exists():
                path.write_text(f"raise ImportError('harel-ref imported the user\\'s {name}')\n")
    script = (
        "import importlib, pkgutil, sys\n"
        "for package_name in ('harel_ref', 'harel_ref.model', 'harel_ref.stateful'):\n"
        "    package = importlib.import_module(package_name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, prefix=package_name + '.'):\n"
        "        try:\n"
        "            importlib.import_module(module.name)\n"
        "        except ImportError as error:\n"
        "            if 'the user' in str(error): raise\n"  # a missing optional driver is fine
        "assert not {'model', 'stateful'} & set(sys.modules), sorted(sys.modules)\n"
        "print(len([m for m in sys.modules if m.startswith('harel_ref.')]))\n"
    )
    run = _in(project, sys.executable, "-c", script)
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) > 30  # it did import them


def test_a_bundled_transports_reproduction_imports_harel_refs_modules(project):
    """The set-up a report writes for ``--bundled NAME`` defines ``factory`` from a project whose
    own ``stateful`` refuses to be imported."""
    from harel_ref.certify._target import Target

    for path in (project / "stateful.py", project / "stateful" / "__init__.py"):
        if path.exists():
            path.write_text("raise ImportError('harel-ref imported the user\\'s stateful')\n")
    setup = Target.from_bundled("memory", project).setup
    run = _in(project, sys.executable, "-c", setup + "\nprint(type(factory(lambda: 0.0, 'ns')).__name__)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["InMemoryTransport"]


@pytest.mark.parametrize("first", ["pass", "import harel_ref.certify", "from harel_ref.certify import Report",
                                   "import harel_ref.pytest_plugin"])
def test_from_harel_ref_import_certify_is_the_function_whatever_was_imported_first(first):
    """``harel_ref.certify`` is both a function and a subpackage: the import of the subpackage
    (the pytest plugin does it at start-up) must not turn the README's name into a module."""
    script = (
        f"{first}\n"
        "import inspect\n"
        "from harel_ref import certify\n"
        "from harel_ref.certify import Report, certify as the_function\n"
        "assert certify is the_function and inspect.isfunction(certify), certify\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]

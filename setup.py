"""Build step: a wheel carries the notebooks and the demo data inside the package.

Everything else is declared in pyproject.toml. `notebooks/` and `data/` stay at the top of the
repository (one copy in git); the build copies them to `diagkit/_shipped/`, where
`diagkit.core.shipped` looks first. Editable installs read the repository's folders directly.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = {"notebooks": "*.ipynb", "data": "*.pt"}


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for folder, pattern in SHIPPED.items():
            target = Path(self.build_lib) / "diagkit" / "_shipped" / folder
            target.mkdir(parents=True, exist_ok=True)
            for file in sorted((ROOT / folder).glob(pattern)):
                shutil.copy2(file, target / file.name)


setup(cmdclass={"build_py": BuildWithShippedFiles})

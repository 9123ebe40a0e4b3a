"""Package discovery for the fixed top-level layout (DESIGN section 2).

Each part's top-level folder installs under `gpulens.` and its name (`exporter/` as
`gpulens.exporter`, `sim/` as `gpulens.sim` ...), so that site-packages never gets generic
top-level names; `src/gpulens/` is the small shared core. setuptools'
automatic discovery cannot express that mapping for subpackages, hence this file.
"""

from setuptools import find_packages, setup

ROOTS = {
    "gpulens": "src/gpulens",
    "gpulens.exporter": "exporter",
    "gpulens.analyzer": "analyzer",
    "gpulens.dashboards": "dashboards",
    "gpulens.sim": "sim",
    "gpulens.remediate": "remediate",
    "gpulens.mixin": "mixin",
    "gpulens.devtools": "devtools",
}

packages: list[str] = []
package_dir: dict[str, str] = {}
for package, path in ROOTS.items():
    package_dir[package] = path
    packages.append(package)
    for sub in find_packages(path):
        packages.append(f"{package}.{sub}")
        package_dir[f"{package}.{sub}"] = f"{path}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)

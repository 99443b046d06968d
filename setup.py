"""Package discovery. The four code folders stay at the top of the repository (DESIGN's layout) and
install under the one name marius_py, so that installing adds no top-level `storage`, `pipeline` or
`orderings` (the package index has distributions by those names). Every package below each folder is
found by setuptools, so no subpackage can be left out of a wheel."""

from setuptools import find_packages, setup

# import name -> folder in the repository
PACKAGE_ROOTS = {
    "marius_py": "marius_py",
    "marius_py.storage": "storage",
    "marius_py.pipeline": "pipeline",
    "marius_py.orderings": "orderings",
}


def discovered_packages() -> list[str]:
    packages = []
    for name, folder in PACKAGE_ROOTS.items():
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(folder, include=["*"])]
    return packages


setup(packages=discovered_packages(), package_dir=PACKAGE_ROOTS)

"""The installed packages are the source tree's: every package under harness/, and the plugin folders at the top
of the repository (attacks/, defenses/, threats/, reports/, presets/ and their subpackages) installed under the project's
namespace (harness.attacks, ...) so they cannot collide with other packages of those names. Everything else is
declared in pyproject.toml."""
from setuptools import find_packages, setup

PLUGIN_FOLDERS = ("attacks", "defenses", "threats", "reports", "presets")

setup(
    packages=find_packages(include=["harness", "harness.*"])
    + [f"harness.{p}" for p in find_packages(include=[f"{f}{tail}" for f in PLUGIN_FOLDERS for tail in ("", ".*")])],
    package_dir={f"harness.{folder}": folder for folder in PLUGIN_FOLDERS},
)

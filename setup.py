"""Package list for setuptools (the rest of the configuration is in pyproject.toml).

Every ``mlflow_gpuopt*`` package found in the tree, plus ``mlflow_gpuopt.pricing_data``: the
repository's top-level ``pricing/`` folder (see ``package-dir`` in pyproject.toml), which
``find_packages`` cannot see under that name.
"""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["mlflow_gpuopt*"]), "mlflow_gpuopt.pricing_data"])

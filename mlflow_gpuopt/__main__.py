"""``python -m mlflow_gpuopt …``: the same command group as ``mlflow gpuopt``."""

from mlflow_gpuopt.cli import main

if __name__ == "__main__":
    main()

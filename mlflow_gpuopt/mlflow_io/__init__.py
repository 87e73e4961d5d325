"""The MLflow edge: the only package code (with ``cli/``, ``plugin.py`` and the CLI hook) that
imports ``mlflow``.

Writes: ``run_binding`` (which run tracking writes into; ending it), ``writer`` (the
asynchronous, exactly-once :class:`~.writer.RunWriter`), ``delivery`` (one batch to the
tracking server), ``journal`` (records kept on disk while the server is away),
``recommendation`` (a recommendation and its candidates as runs). Reads: ``runs`` (run ids →
the models' ``Workload`` and ``Observation``), ``measured`` (measured runs for ``compare``).
Every name written or read comes from :mod:`mlflow_gpuopt.contract`.
"""

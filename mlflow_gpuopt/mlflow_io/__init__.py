"""The edge where MLflow runs are read (and written): nothing else imports ``mlflow``'s
tracking client for gpuopt data.

``runs``: run ids → the models' ``Workload`` and ``Observation`` records
(:func:`mlflow_gpuopt.mlflow_io.runs.load_run_inputs`).
"""

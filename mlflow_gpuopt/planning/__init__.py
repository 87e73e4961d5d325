"""The use cases the commands run: read inputs, fit, search, price advice, log, emit.

One module per command, each with a frozen request built from the parsed options and one
call that returns the command's result; the CLI parses, calls and prints (``docs/cli.md``).
Bad input raises an :class:`~mlflow_gpuopt.errors.InputError`.

* :mod:`.inputs`: runs or files → workload, observations, notes, global batch
* :mod:`.target`: a training target (samples, epochs, tokens or steps) in samples
* :mod:`.fitting`: ``fit_runs(...)``, the one fit pipeline (one GPU-name resolution)
* :mod:`.searching`: the search space, the target in samples, the ranked plans
* :mod:`.recommending`: ``plan(request)`` — where a recommendation is made
* :mod:`.advising`, :mod:`.predicting`, :mod:`.ledger`, :mod:`.emitting`, :mod:`.replaying`:
  the others

Nothing is imported here, so that importing one use case does not import them all.
"""

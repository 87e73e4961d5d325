"""What several test files share: hand-made GPUs and offers, a real ``mlflow server``, fake
HTTP servers and proxies, a DevTools browser driver, readers of tracked runs.

Imported as ``support.<module>``: ``tests/`` is on ``sys.path`` because pytest puts the
directory of the root ``tests/conftest.py`` there (the default ``prepend`` import mode).
"""

"""Empty MLflow sqlite stores for tests, each a copy of one store this process migrated.

MLflow creates a sqlite store by running its schema migrations: about 3 s of a shared CI core,
paid by every test, torchrun job and ``mlflow server`` that starts on a fresh file. A copy of
an already migrated store is the same database (schema revision, Default experiment, default
workspace) in milliseconds; MLflow opens it as any existing store (it checks the revision).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import sqlite3
import tempfile
from pathlib import Path

_template: Path | None = None


def _migrated_template() -> Path:
    """This process's migrated, never-written store (made on first use, removed at exit)."""
    global _template
    if _template is None:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        folder = Path(tempfile.mkdtemp(prefix="gpuopt-test-store-"))
        atexit.register(shutil.rmtree, folder, True)
        db = folder / "template.db"
        SqlAlchemyStore(f"sqlite:///{db}", str(folder / "mlruns")).engine.dispose()
        _template = db
    return _template


def sqlite_uri(db: Path, artifact_root: str = "./mlruns") -> str:
    """The URI of the sqlite store at ``db``, created empty if there is no file there yet.

    Its Default experiment keeps artifacts where MLflow would put them creating the store now:
    under ``artifact_root`` (a client's ``./mlruns`` of the current directory; a server with
    ``--artifacts-destination`` passes its ``mlflow-artifacts:/``)."""
    from mlflow.utils.time import get_current_time_millis
    from mlflow.utils.uri import append_to_uri_path, resolve_uri_if_local

    db = Path(db)
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_template(), db)
        location = append_to_uri_path(resolve_uri_if_local(artifact_root), "0")
        now = get_current_time_millis()
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            con.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, "
                        "last_update_time = ? WHERE experiment_id = 0", (location, now, now))
    return f"sqlite:///{db}"

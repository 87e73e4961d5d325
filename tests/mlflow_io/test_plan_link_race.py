"""Jobs of one plan linking to the plan's run at the same moment keep each other's ids.

Real processes (each a job's link, as ``track()``'s plan link makes it) against one real sqlite
MLflow store; a tag has no atomic append, so before this 2 of 4 ids were kept. The window
between reading the run and writing the tag is widened (each read answers 0.3 s late, as from
a busy server) so that the jobs' reads and writes interleave on every run of the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from support.sqlite_store import sqlite_uri

pytestmark = pytest.mark.faults

JOBS = 4

_LINK = textwrap.dedent("""
    import sys, time
    from mlflow import MlflowClient
    from mlflow_gpuopt.launch.plan_check import PlanPrediction
    from mlflow_gpuopt.mlflow_io.plans import link_job

    uri, target, job, go = sys.argv[1:5]
    client = MlflowClient(uri)
    read = client.get_run

    def slow_read(run_id):  # a busy server: the answer comes 0.3 s after the read
        run = read(run_id)
        time.sleep(0.3)
        return run

    client.get_run = slow_read
    plan = PlanPrediction(plan_id=target + ":1", recommendation_run_id=target, rank=1,
                          throughput_samples_per_s=1.0, throughput_low_samples_per_s=None,
                          throughput_high_samples_per_s=None, step_time_s=None,
                          memory_per_gpu_bytes=None, hours=None, hours_low=None,
                          hours_high=None, cost_usd=None)
    client.get_run(target)  # connected and warm before the common start
    while time.time() < float(go):
        time.sleep(0.001)
    link_job(plan, job, client)
""")


def test_concurrent_jobs_of_one_plan_all_stay_linked(tmp_path):
    from mlflow import MlflowClient

    from mlflow_gpuopt import contract

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    exp = client.create_experiment("plan-link-race")
    target = client.create_run(exp).info.run_id
    jobs = [client.create_run(exp).info.run_id for _ in range(JOBS)]
    go = time.time() + 12.0  # all processes imported and connected by then
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _LINK, uri, target, job, str(go)],
                              env=env, stderr=subprocess.PIPE, text=True) for job in jobs]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    tags = client.get_run(target).data.tags
    assert sorted(tags[contract.TAG_JOB_RUN_IDS].split(",")) == sorted(jobs)
    assert sorted(k for k in tags if k.startswith(contract.TAG_JOB_RUN_PREFIX)) == \
        sorted(contract.TAG_JOB_RUN_PREFIX + j for j in jobs)


def test_a_first_list_write_that_loses_the_insert_race_reads_again(tmp_path):
    """Two first writes of the list tag at once: the SQL store inserts it twice and the loser's
    insert fails its unique key (the IntegrityError MLflow raises as MlflowException, seen
    under load in the test above). Here the other job's write lands first, for real, and this
    job's write then fails as MLflow's would; the link reads the list again and keeps both."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from mlflow_gpuopt import contract
    from mlflow_gpuopt.launch.plan_check import PlanPrediction
    from mlflow_gpuopt.mlflow_io.plans import link_job

    client = MlflowClient(sqlite_uri(tmp_path / "mlflow.db"))
    exp = client.create_experiment("plan-link-insert-race")
    target = client.create_run(exp).info.run_id
    mine, other = (client.create_run(exp).info.run_id for _ in range(2))
    real_set_tag, raced = client.set_tag, []

    def set_tag(run_id, key, value, **kwargs):
        if key == contract.TAG_JOB_RUN_IDS and not raced:
            raced.append(value)
            real_set_tag(run_id, f"{contract.TAG_JOB_RUN_PREFIX}{other}", "1")
            real_set_tag(run_id, contract.TAG_JOB_RUN_IDS, other)
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: "
                                  "tags.key, tags.run_uuid")
        return real_set_tag(run_id, key, value, **kwargs)

    client.set_tag = set_tag
    plan = PlanPrediction(plan_id=target + ":1", recommendation_run_id=target, rank=1,
                          throughput_samples_per_s=1.0, throughput_low_samples_per_s=None,
                          throughput_high_samples_per_s=None, step_time_s=None,
                          memory_per_gpu_bytes=None, hours=None, hours_low=None,
                          hours_high=None, cost_usd=None)
    assert link_job(plan, mine, client) == target
    assert raced == [mine]  # the write that lost the race was this job's own list
    tags = client.get_run(target).data.tags
    assert sorted(tags[contract.TAG_JOB_RUN_IDS].split(",")) == sorted([mine, other])

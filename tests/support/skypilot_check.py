"""Check gpuopt's SkyPilot output with SkyPilot itself, offline; prints one JSON object.

Run by tests/cli/test_launch.py with an interpreter that has SkyPilot (the test's own when
``mlflow-gpuopt[skypilot]`` is installed, else ``$GPUOPT_SKYPILOT_PYTHON``):

    python skypilot_check.py task TASK.yaml
        SkyPilot's task and resources JSON schemas accept the YAML; ``sky.Task`` and
        ``sky.Resources`` are built from it; what they hold is printed.
    python skypilot_check.py estimate REPO SITE_PACKAGES SAMPLES CLOUD:ACC:COUNT ...
        ``sky.Resources(cloud=..., accelerators={ACC: COUNT})`` for each spec, passed to
        ``mlflow_gpuopt.launch.skypilot_time_estimator``; the seconds are printed.

Offline: a ``sky.Resources`` with an ``instance_type`` makes SkyPilot download its cloud
catalog (raw.githubusercontent.com) to check the type, so the resources are built without
the instance type here and the type is checked against the schema-validated config.
"""

from __future__ import annotations

import json
import sys


def task(path: str) -> dict:
    import sky
    import yaml
    from sky.utils import common_utils, schemas

    with open(path, encoding="utf-8") as fh:
        config = yaml.safe_load(fh)
    common_utils.validate_schema(config, schemas.get_task_schema(), "Invalid task YAML: ")
    res = config["resources"]
    common_utils.validate_schema(res, schemas.get_resources_schema(), "Invalid resources: ")
    t = sky.Task.from_yaml_config({k: v for k, v in config.items() if k != "resources"})
    built = sky.Resources.from_yaml_config({k: v for k, v in res.items()
                                            if k != "instance_type"})
    (r,) = built if isinstance(built, set) else (built,)
    return {"num_nodes": t.num_nodes, "envs": dict(t.envs), "run": t.run, "setup": t.setup,
            "name": t.name, "workdir": t.workdir, "cloud": str(r.cloud).lower(),
            "region": r.region, "accelerators": dict(r.accelerators or {}),
            "use_spot": r.use_spot, "instance_type": res.get("instance_type")}


def estimate(repo: str, site: str, samples: str, *specs: str) -> dict:
    import sky

    sys.path.insert(0, repo)
    sys.path.append(site)  # numpy/scipy of the project's env, after SkyPilot's own packages
    from mlflow_gpuopt.launch import skypilot_time_estimator
    from mlflow_gpuopt.perfmodel.types import Workload

    wl = Workload(**json.loads(sys.stdin.read()))
    est = skypilot_time_estimator(workload=wl, target=float(samples))
    out = {}
    for spec in specs:
        cloud, acc, count = spec.split(":")
        r = sky.Resources(infra=cloud, accelerators={acc: int(count)})
        out[spec] = est(r)
    return out


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    result = task(*args) if mode == "task" else estimate(*args)
    print(json.dumps(result, default=str))

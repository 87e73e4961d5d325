"""Provider keys and MLflow credentials never land in params, tags, artifacts, logs or journals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support.mlflow_server import MlflowServer

from mlflow_gpuopt.redact import redact, redact_mapping, redact_obj, redact_uri

# Obviously fake values, long enough to be unique in any file.
FAKE = {
    "LAMBDA_API_KEY": "FAKE-lambda-key-0000-not-real-7f3a",
    "GPUOPT_GCP_API_KEY": "FAKE-gcp-key-0000-not-real-91bc",
    "AWS_SECRET_ACCESS_KEY": "FAKE-aws-secret-0000-not-real-22de",
    "AZURE_CLIENT_SECRET": "FAKE-azure-secret-0000-not-real-5e61",
    "MLFLOW_TRACKING_TOKEN": "FAKE-mlflow-token-0000-not-real-a0c4",
    "MLFLOW_TRACKING_PASSWORD": "FAKE-mlflow-password-0000-not-real-b7e2",
}
URI_PASSWORD = "FAKE-uri-password-0000-not-real-c9d8"


def test_redact_masks_env_secrets_and_uri_passwords():
    env = {"LAMBDA_API_KEY": FAKE["LAMBDA_API_KEY"], "HOME": "/home/someone",
           "AZURE_CLIENT_SECRET": FAKE["AZURE_CLIENT_SECRET"]}
    text = (f"GET https://bob:{URI_PASSWORD}@mlflow.example.com/api failed; "
            f"key={FAKE['LAMBDA_API_KEY']} azure={FAKE['AZURE_CLIENT_SECRET']} home=/home/someone")
    out = redact(text, environ=env)
    assert URI_PASSWORD not in out and FAKE["LAMBDA_API_KEY"] not in out
    assert FAKE["AZURE_CLIENT_SECRET"] not in out
    assert "bob:***@mlflow.example.com" in out and "/home/someone" in out
    assert redact_uri(f"http://u:{URI_PASSWORD}@h:5000/x?token=abc&run=1") == \
        "http://u:***@h:5000/x?token=***&run=1"
    assert redact_uri("sqlite:///tmp/mlflow.db") == "sqlite:///tmp/mlflow.db"


def test_working_directory_variables_are_not_secrets():
    """The shell's PWD/OLDPWD hold paths, not passwords: the working directory stays readable
    in errors and params; a password under a PWD word (DB_PWD) is still masked."""
    env = {"PWD": "/work/project-checkout", "OLDPWD": "/home/someone/previous",
           "DB_PWD": "FAKE-db-password-0000-not-real-4411"}
    text = "cannot read /work/project-checkout/w.json (from /home/someone/previous) " + \
        env["DB_PWD"]
    out = redact(text, environ=env)
    assert "/work/project-checkout/w.json" in out and "/home/someone/previous" in out
    assert env["DB_PWD"] not in out


def test_redact_params_and_nested_objects():
    env = {"GPUOPT_GCP_API_KEY": FAKE["GPUOPT_GCP_API_KEY"]}
    params = redact_mapping({"api_key": "abcdef123", "gpuopt.tokens_per_sample": 512,
                             "gpuopt.experts_per_token": 2, "hf_token": "hf_abcdef99",
                             "note": f"used {FAKE['GPUOPT_GCP_API_KEY']}"}, environ=env)
    assert params == {"api_key": "***", "gpuopt.tokens_per_sample": "512",
                      "gpuopt.experts_per_token": "2", "hf_token": "***", "note": "used ***"}
    obj = redact_obj({"a": [{"password": "hunter22"}, f"x{FAKE['GPUOPT_GCP_API_KEY']}"],
                      "n": 3}, environ=env)
    assert obj == {"a": [{"password": "***"}, "x***"], "n": 3}


_TRAINING = textwrap.dedent("""
    import logging, sys, threading, time
    import mlflow, torch
    import mlflow_gpuopt as gpuopt
    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)

    class Refused(logging.Handler):  # set once the writer says MLflow refused a write
        def __init__(self):
            super().__init__()
            self.said = threading.Event()

        def emit(self, record):
            if "cannot write to MLflow" in record.getMessage():
                self.said.set()

    refused = Refused()
    logging.getLogger("mlflow_gpuopt").addHandler(refused)
    uri = sys.argv[1]
    mlflow.set_tracking_uri(uri)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.1) as tracker:
        for _ in range(100):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
    print("run", tracker.run_id, flush=True)
    # the writer's warning paths, with the server gone (killed before anything is logged, so
    # every write fails): errors quote the URI
    open(sys.argv[2], "w").write("ready")
    while open(sys.argv[2]).read() != "killed":
        time.sleep(0.05)
    w = RunWriter(tracker.run_id, uri, flush_interval_s=0.05, request_timeout_s=1.0)
    w.log_params({"gpuopt.api_key": "leaky-param-value-123", "note": "%s"})
    for i in range(50):
        w.log_metrics({"x": float(i)}, step=i)
    w.set_tags({"gpuopt.tracking_uri": uri})
    w.log_dict({"uri": uri, "env": "%s"}, "gpuopt/leak.json")
    assert refused.said.wait(60), "the writer never tried the dead server"
    print(w.close(timeout_s=1.0), flush=True)
""")


@pytest.mark.slow
def test_planted_secrets_never_written_anywhere(tmp_path):
    """Plant keys in the env and a password in the tracking URI; grep everything written."""
    env = {**os.environ, **FAKE, "OMP_NUM_THREADS": "1",
           "GPUOPT_JOURNAL_DIR": str(tmp_path / "journal")}
    server = MlflowServer(tmp_path / "server", env=env)
    try:
        server.start()
        uri = f"http://gpuopt:{URI_PASSWORD}@127.0.0.1:{server.port}"
        script = tmp_path / "train.py"
        leak = "LEAK:" + FAKE["LAMBDA_API_KEY"]
        script.write_text(_TRAINING.replace('"%s"', repr(leak)))
        signal_file = tmp_path / "signal"
        signal_file.write_text("")
        out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, str(script), uri, str(signal_file)],
                                    env=env, stdout=out, stderr=err, cwd=tmp_path)
            try:
                for _ in range(1200):
                    if signal_file.read_text() == "ready" or proc.poll() is not None:
                        break
                    import time
                    time.sleep(0.05)
                server.kill()
                signal_file.write_text("killed")
                assert proc.wait(timeout=60) == 0, err_path.read_text()[-3000:]
            finally:
                if proc.poll() is None:
                    proc.kill()
        stdout = out_path.read_text()
        stderr = err_path.read_text()
        assert "run " in stdout and "replay" in stderr  # the warning path really ran
        journals = list((tmp_path / "journal").glob("*.jsonl"))
        assert journals, "no journal was left: the outage path did not run"
        assert "LEAK:***" in journals[0].read_text()  # the redacted value is there
    finally:
        server.kill()

    planted = [*FAKE.values(), URI_PASSWORD]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "train.py"]
    assert any(p.suffix == ".sqlite" for p in written) and any("art" in p.parts for p in written)
    for path in written:
        data = path.read_bytes()
        for secret in planted:
            assert secret.encode() not in data, f"{secret} found in {path.relative_to(tmp_path)}"

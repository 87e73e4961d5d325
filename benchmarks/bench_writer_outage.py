"""RunWriter under a long, fast job with the tracking server gone: memory stays bounded.

Logs N metric records (default 1,000,000) to a tracking URI where nothing listens, so every
record goes through the bounded queue and the memory buffer into the journal. Prints the
producer's per-call cost (mean, p99, max), records dropped, peak RSS growth and the journal
size. Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_writer_outage.py [N] [steps_per_s]``.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def main(n: int = 1_000_000, steps_per_s: float = 10_000.0) -> None:
    from mlflow_gpuopt.mlflow_io.journal import read_state
    from mlflow_gpuopt.mlflow_io.writer import RunWriter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    journal_dir = tempfile.mkdtemp(prefix="gpuopt-bench-")
    writer = RunWriter("bench0run0id", f"http://127.0.0.1:{port}", journal_dir=journal_dir,
                       flush_interval_s=0.05, request_timeout_s=1.0)
    rss0 = peak = _rss_bytes()
    costs = []
    start = time.perf_counter()
    period = 1.0 / steps_per_s
    for i in range(n):
        while time.perf_counter() < start + i * period:
            pass
        t0 = time.perf_counter()
        writer.log_metrics({"gpuopt/step_time_s": 0.0001, "loss": 1.0 / (i + 1)}, step=i)
        costs.append(time.perf_counter() - t0) if i % 100 == 0 else None
        if i % 50_000 == 0:
            peak = max(peak, _rss_bytes())
    elapsed = time.perf_counter() - start
    report = writer.close(timeout_s=1.0)
    peak = max(peak, _rss_bytes())
    costs.sort()
    state = read_state(report.journal_path)
    print(f"records: {n:,} at {n / elapsed:,.0f}/s (target {steps_per_s:,.0f}/s)")
    print(f"log_metrics cost: mean {sum(costs) / len(costs) * 1e6:.1f} us, "
          f"p99 {costs[int(len(costs) * 0.99)] * 1e6:.1f} us, max {costs[-1] * 1e3:.2f} ms")
    print(f"dropped records: {writer.dropped_records}")
    print(f"peak RSS growth: {(peak - rss0) / 2**20:.1f} MiB")
    print(f"journal: {os.path.getsize(report.journal_path) / 2**20:.1f} MiB, "
          f"{state.pending_metrics:,} metric values pending (expected {2 * n:,})")
    os.remove(report.journal_path)


if __name__ == "__main__":
    main(*(int(a) if i == 0 else float(a) for i, a in enumerate(sys.argv[1:])))

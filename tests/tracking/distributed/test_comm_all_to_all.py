"""The comm meter's all-to-all timing on a real one-process gloo group: what it counts, that
the newest meter wins, and that releasing the last one gives torch its methods back. The
4-process expert-parallel job is ``test_moe_parallel.py``."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from mlflow_gpuopt.tracking.distributed.comm_meter import (
    CommMeter,
    meter_all_to_all,
    release_all_to_all,
)


@pytest.fixture
def one_process_group(monkeypatch, tmp_path):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_all_to_alls_are_counted_into_the_newest_meter_until_released(one_process_group):
    from torch.distributed import all_to_all_single  # imported before the meter goes in

    names = ("all_to_all_single", "alltoall")
    originals = [dist.ProcessGroup.__dict__[n] for n in names]  # pybind's bound methods
    first, second = CommMeter(), CommMeter()
    assert meter_all_to_all(first) and meter_all_to_all(second)
    x, out = torch.arange(6.0), torch.empty(6)
    all_to_all_single(out, x)  # 24 bytes
    work = dist.all_to_all_single(out, x, async_op=True)
    work.wait()
    dist.all_to_all([torch.empty(3, dtype=torch.float64)],
                    [torch.ones(3, dtype=torch.float64)])  # 24 bytes
    dist.all_reduce(torch.ones(4))  # not an all-to-all: not counted
    assert torch.equal(out, x)  # the collectives still do their work
    work.get_future().wait()
    count, time_s, nbytes, _ = second.end_step()
    assert (count, nbytes) == (3, 72) and time_s >= 0
    assert first.end_step()[:3] == (0, 0.0, 0)
    release_all_to_all(second)
    all_to_all_single(out, x)
    assert first.end_step()[0] == 1  # the older meter again
    release_all_to_all(first)
    assert all(dist.ProcessGroup.__dict__[n] is o for n, o in zip(names, originals, strict=True))
    all_to_all_single(out, x)
    assert first.end_step()[0] == 1 and second.end_step()[0] == 3  # nothing after release

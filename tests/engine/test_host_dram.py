"""Host DRAM is one resource: host experts and the link's DMA reads share its bandwidth."""

import pytest
import torch
from support import bf16_kernels

from specterbench.engine.costs import CostModel, HostOp
from specterbench.engine.geometry import Geometry
from specterbench.engine.modeled_clock import ModeledClock
from specterbench.engine.profiles import HardwareProfile, HostProfile

GEO = Geometry("g", hidden=8, expert_intermediate=8, num_experts=4, top_k=2, moe_layers=1, layers=1, heads=1,
               kv_heads=1, head_dim=8, vocab=16)
# a 1 MB/s link, a host with 3 MB/s of DRAM: 2 MB/s left to the host while a copy runs; no latencies
PROFILE = HardwareProfile("test", "test", flops_per_s=1e30, mem_bytes_per_s=1e6, link_bytes_per_s=1e6,
                          link_latency_us=0.0, launch_us=0.0, device_memory_bytes=1, sources=("test",))
HOST = HostProfile("host", "cpu", mem_bytes_per_s=3e6, flops_per_s=1e30, threads=1, launch_us=0.0, sources=("t",),
                   expert_kernels=bf16_kernels(3e6, 1e30))
JOB = HostOp(flops=0.0, weight_bytes=6000.0, act_bytes=0.0)  # 2 ms alone at 3 MB/s


def clock():
    return ModeledClock(PROFILE, GEO, HOST)


def run(c):
    return c.run_on_host(lambda x: x, JOB, 1, torch.zeros(1))


def test_host_job_alone_streams_at_the_full_dram_bandwidth():
    c = clock()
    job = run(c)
    assert c.wait_host([job]) == pytest.approx(0.002)
    assert c.totals.host_shared_s == 0.0


def test_host_job_slows_while_a_copy_reads_host_memory():
    c = clock()
    c.issue("a", 10_000, priority=0)  # on the link for 10 ms: the whole job runs beside it
    job = run(c)
    assert c.wait_host([job]) == pytest.approx(0.003)  # 6000 B at 3 - 1 = 2 MB/s
    assert c.totals.host_shared_s == pytest.approx(0.003)


def test_copy_issued_after_the_job_started_slows_it_for_their_overlap():
    c = clock()
    job = run(c)
    c.compute(0, 1000)  # 1 ms later (the job has streamed 3000 B) a copy starts for 1 ms
    c.issue("a", 1000, priority=0)
    # 1 ms at 3 MB/s (3000 B), 1 ms shared at 2 MB/s (2000 B), the last 1000 B at 3 MB/s
    assert c.wait_host([job]) == pytest.approx(0.002 + 1 / 3 * 1e-3 - 0.001)
    assert c.now() == pytest.approx(0.002 + 1 / 3 * 1e-3)


def test_copy_after_the_job_finished_does_not_touch_it():
    c = clock()
    job = run(c)
    c.compute(0, 3000)  # the job finished at 2 ms
    c.issue("a", 1000, priority=0)
    assert c.wait_host([job]) == 0.0
    assert c.totals.host_busy_s == pytest.approx(0.002)
    assert c.totals.host_shared_s == 0.0


def test_queued_copies_count_as_busy_link_for_the_estimate():
    model = CostModel(PROFILE, GEO, HOST)
    assert model.host_seconds_shared(JOB, 1, 0.0) == pytest.approx(0.002)
    assert model.host_seconds_shared(JOB, 1, 1.0) == pytest.approx(0.003)
    assert model.host_dram_share() == (3e6, 2e6)


def test_the_cores_keep_at_least_half_of_a_host_barely_faster_than_its_link():
    slow = HostProfile("slow", "cpu", mem_bytes_per_s=1.5e6, flops_per_s=1e30, threads=1, launch_us=0.0,
                       sources=("t",), expert_kernels=bf16_kernels(1.5e6, 1e30))
    assert CostModel(PROFILE, GEO, slow).host_dram_share() == (1.5e6, 0.75e6)

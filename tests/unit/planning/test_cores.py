"""Each GPU job's share of the host's cores (planning/cores.py): disjoint between cards,
NUMA-local where nvidia-smi says so, and fewer GPU jobs at once on a host short of cores."""

from __future__ import annotations

from itertools import combinations

from cs336_systems.planning import cores

# `nvidia-smi topo -m` of a 4-GPU host with two NUMA nodes of 32 cores (64 with SMT)
TOPO = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tNV18\tNV18\t0-31,64-95\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\t0-31,64-95\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\t32-63,96-127\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \t32-63,96-127\t1\t\tN/A\n"
    "\nLegend:\n  X    = Self\n"
)


def test_cpulists_read_and_write():
    assert cores.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert cores.parse_cpulist("N/A") == []
    assert cores.format_cpulist([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"


def test_numa_local_shares_are_disjoint_and_fill_the_host():
    local = cores.parse_topology(TOPO)
    assert sorted(local) == [0, 1, 2, 3] and local[2][0] == 32 and len(local[0]) == 64
    pool, usable = [0, 1, 2, 3], list(range(128))
    shares = {g: cores.card_share(g, pool, usable, local) for g in pool}
    assert all(len(s) == 32 for s in shares.values())
    for a, b in combinations(pool, 2):
        assert not set(shares[a]) & set(shares[b]), (a, b)
    assert set(shares[2]) <= set(local[2]) and set(shares[0]) <= set(local[0])
    assert cores.job_share([0, 1], pool, usable, local) == sorted(shares[0] + shares[1])


def test_without_topology_the_usable_cores_are_split_by_place():
    """A container limited to 6 cores of a 3-GPU host: 2 each, disjoint; a pool of 1 of the
    cards (CUDA_VISIBLE_DEVICES) gets them all."""
    usable = [4, 5, 6, 7, 8, 9]
    shares = [cores.card_share(g, [0, 1, 2], usable, {}) for g in (0, 1, 2)]
    assert shares == [[4, 5], [6, 7], [8, 9]]
    assert cores.card_share(2, [2], usable, {}) == usable


def test_a_host_short_of_cores_runs_fewer_gpu_jobs():
    assert cores.gpu_slots(4, 64) == 4
    assert cores.gpu_slots(4, 4) == 2
    assert cores.gpu_slots(4, 1) == 1
    assert cores.gpu_slots(0, 8) == 0


def test_thread_pools_and_ranks_follow_the_share():
    env = cores.thread_env([0, 1, 2, 3])
    assert env["OMP_NUM_THREADS"] == "4" and env["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
    assert env[cores.CPU_SET_ENV] == "0-3"
    assert cores.rank_share(range(8), 1, 2) == [4, 5, 6, 7]
    assert cores.rank_share([0], 1, 2) == [0]  # fewer cores than ranks: they share

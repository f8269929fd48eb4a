"""The step monitor's decision on generated jobs (`monitor_sim.py`): host and device timelines of
data-parallel steps, one fault planted (a slow rank's data, compute or launch; every rank's links, device
or data; a busy host; none), measured where the monitor measures, decided as the monitor decides.

On every seed of the sample: no decision names what the fault was not (no other rank, no other reason, no
whole-job slowdown for one rank's), none comes before the fault does, and a fault that clearly holds the
job back is named within four windows of its start. The long sample: `python tests/monitor_sim.py 2000`.
"""

import pytest

import monitor_sim as sim

# A bounded sample, every kind of fault alike, and the seeds that once went wrong while the decision was made.
SAMPLE = [(seed, sim.FAULTS[seed % len(sim.FAULTS)]) for seed in range(48)]
REGRESSIONS = [(158, None), (199, None), (207, None), (473, None), (537, None), (1044, None), (2810, None)]


@pytest.mark.parametrize("seed, fault", SAMPLE + REGRESSIONS)
def test_decisions_on_generated_jobs(seed, fault):
    scenario = sim.generate(seed, fault)
    truth = sim.truth(scenario)
    decisions = sim.decide(scenario, sim.run(scenario))
    said = [(d["kind"], d["rank"], d["reason"]) for d in decisions]
    assert set(said) <= truth.allowed, (scenario, said)
    if scenario.fault != "load":
        assert all(d["first_step"] > scenario.onset_step for d in decisions), (scenario, said)
    if truth.must_name:
        right = [d["step"] for d in decisions if (d["kind"], d["rank"], d["reason"]) in truth.allowed]
        assert right and right[0] <= (scenario.fault_window + 4) * scenario.window, (scenario, truth, said)


def test_the_simulated_victim_waits_in_its_forward_where_its_loop_synchronises():
    # The mechanism that made the victim of a slow rank look slow itself: a loop that copies its batch from
    # pageable memory waits there for its device, which waits in the all-reduce for the slow rank.
    scenario = sim.generate(3, "data")
    scenario.gpu, scenario.sync, scenario.fault_window, scenario.ranks, scenario.fault_rank = True, "forward", 3, 2, 1
    windows = sim.run(scenario)
    last = windows[-1]
    victim = sorted(row["forward"] for row in last[0])[len(last[0]) // 2]
    slow = sorted(row["forward"] for row in last[1])[len(last[1]) // 2]
    assert victim > slow + scenario.amount / 2  # the host forward holds the wait for the peer ...
    device = [sorted(r["gpu"] for r in rows if r["gpu"] is not None) for rows in last]
    assert (
        abs(device[0][len(device[0]) // 2] - device[1][len(device[1]) // 2]) < scenario.amount / 10
    )  # ... not the device's
    said = {(d["kind"], d["rank"], d["reason"]) for d in sim.decide(scenario, windows)}
    assert said == {("straggler", 1, "data")}


@pytest.mark.parametrize("seed", range(12))
def test_a_rank_slower_by_less_than_a_scheduler_slice_is_not_named(seed):
    # A 2 ms CPU step with almost no noise, one rank's data wait longer by less than Linux's shortest slice
    # from a window on: what a core shared with other work for a while costs a rank (a loaded CI host once
    # had a rank named for +0.1 ms). Planted 2 ms longer, the same rank is named.
    scenario = sim.generate(seed, "data")
    scenario.gpu, scenario.sync, scenario.noise, scenario.spikes = False, "step", 0.005, 0.0
    scenario.data, scenario.compute, scenario.allreduce = 0.05e-3, (0.5e-3, 1e-3, 0.2e-3), 0.3e-3
    for amount, named in ((0.1e-3 + 0.05e-3 * seed, False), (2e-3, True)):
        scenario.amount = amount
        said = {(d["kind"], d["rank"], d["reason"]) for d in sim.decide(scenario, sim.run(scenario))}
        assert said == ({("straggler", scenario.fault_rank, "data")} if named else set()), (amount, said)

"""The seed article's deployment case (pyctl/replay/seed_case.py)."""

from __future__ import annotations

from pyctl.cli.main import main
from pyctl.core import mig
from pyctl.replay import seed_case as sc


def test_exclusive_mode_gives_every_replica_a_whole_gpu() -> None:
    c = sc.Case()
    r = sc.run_exclusive(c, 42)
    gpus = c.gpu_nodes * c.gpus_per_node
    assert r.requested == 100
    assert r.placed == gpus == 40  # one replica per GPU, the rest fail
    assert r.per_node == [8] * 5
    assert sum(r.failed.values()) == 60
    assert r.success_pct == 40.0
    assert r.compute_alloc_pct == 100.0
    # utilisation = the placed replicas' own needs over all GPUs
    assert 0 < r.compute_util_pct < 100
    assert r.compute_util_pct == r.compute_util_busy_pct


def _layouts_valid(run: sc.CaseRun) -> None:
    for node in run.cluster.current_nodes():
        for z in node.zones:
            for g in z.mig:
                names = [f"{i.profile}@{i.start}" for i in g.instances]
                assert mig.validate(sc.GPU_MODEL, names), names


def test_mig_mode_repartitions_and_places_everything() -> None:
    c = sc.Case()
    r = sc.run_mig(c, 42)
    assert r.placed == r.requested == 100
    assert not r.failed
    assert r.repartitions > 0  # the initial 7 x 1g.5gb serves no ResNet/GPT-2 replica
    assert sum(r.per_node) == 100
    # MIG instances are never shared: allocated slices = 1*BERT + 2*ResNet + 7*GPT-2
    assert r.compute_alloc_slices == 50 * 1 + 30 * 2 + 20 * 7


def test_mig_state_stays_valid_and_consistent() -> None:
    c = sc.Case()
    run = sc.CaseRun(c, 43, "mig")
    for pod, k in sc.arrivals(c, 43):
        if not run.place(pod, k):
            assert run.repartition(k, 0) or run.repartition(k, c.move_budget)
            assert run.place(pod, k)
    _layouts_valid(run)
    holders = [
        i.pod
        for node in run.cluster.current_nodes()
        for z in node.zones
        for g in z.mig
        for i in g.instances
        if i.used
    ]
    assert sorted(holders) == sorted(run.kind)
    assert all(p is not None for p in holders)


def test_compaction_moves_replicas_to_free_a_whole_gpu() -> None:
    # One node, 2 GPUs of 7 x 1g.5gb; BERT replicas spread over both GPUs (as another scheduler
    # would leave them): a GPT-2 replica needs a whole GPU, which only moving replicas frees.
    c = sc.Case(gpu_nodes=1, gpus_per_node=2, cpu_nodes=0, move_budget=2)
    bert = c.kinds[0]
    run = sc.CaseRun(c, 42, "mig")
    cl = run.cluster
    for g, s in ((0, 0), (1, 0), (1, 3)):
        pod = sc.SimPod(f"bert-{g}-{s}", sc._shape(bert, "mig"))
        pod.node, pod.assignment = "a100-0", {"mig": (0, g, s)}
        cl.pods[pod.name] = pod
        cl._apply("a100-0", pod.assignment, True)
        run.kind[pod.name] = bert
    gpt = c.kinds[2]
    assert not run.place("gpt-2-0", gpt)
    assert not run.repartition(gpt, 0)  # no free whole GPU without moves
    assert run.repartition(gpt, 2)
    assert (run.repartitions, run.evictions) == (1, 1)
    assert run.place("gpt-2-0", gpt)
    _layouts_valid(run)
    assert len(run.kind) == 4
    assert {cl.pods[p].node for p in run.kind} == {"a100-0"}


def test_table_has_the_article_rows() -> None:
    rows = sc.run(sc.Case(), [42, 43])
    labels = [r.label for r in rows]
    for want in (
        "GPU compute utilisation",
        "GPU memory utilisation",
        "replicas per GPU node",
        "scheduling success rate",
    ):
        assert want in labels
    util = rows[0]
    assert util.article == ("47%", "85%")
    ex, mg = (float(v.rstrip("%")) for v in (util.exclusive, util.mig))
    assert mg > ex


def test_cli_seed_case(capsys: object) -> None:
    assert main(["simulate", "--seed-case", "--seeds", "42"]) == 0

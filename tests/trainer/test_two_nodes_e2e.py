"""``python -m verl_omni.trainer.main_flowgrpo`` with ``trainer.nnodes=2`` on a Ray cluster of two nodes that this
test starts and then breaks: real Ray (``ray start --head`` and ``ray start --address``), vLLM-Omni, FSDP on gloo.

One trainer launch covers both halves (a launch costs minutes on a 2-core machine):

* placement: each node declares 3 logical CPUs and the run's 2 actor ranks and 2 replicas reserve one each
  beside the reward worker's, so no node can hold them all: the trainer's ``placement:`` line must name both
  nodes, and the run must log its first step;
* loss: once step 1 is logged, every process of the second node is killed (as a crashed or preempted host
  leaves it); the run must exit non-zero within :data:`FAIL_WITHIN_S`, its error naming the lost worker and
  the second node.

The driver finds the cluster through ``RAY_ADDRESS`` (``docs/guide/multi_node.md``), not
``ray_kwargs.ray_init.address``.

The session's cluster (``ray_cluster``) is not used: a node of it killed would break the tests that share it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import psutil
import pytest
from trainer_helpers import entry_point_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

# logical CPUs of each node: 2 ranks + 2 replicas + 1 reward worker reserve 5, more than one node has
CPUS_PER_NODE = 3
# a generous bound on how long the run may go on after the node is lost (Ray notices a dead node in seconds)
FAIL_WITHIN_S = 180
# more steps than the run can take in FAIL_WITHIN_S: a run that ignores the loss times out instead of passing
STEPS = 40
# 2 actor ranks and 2 replicas, one of each per node when Ray spreads them so
TWO_NODES = (
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.nnodes=2",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
)
ARGS = (
    *TWO_NODES,
    f"trainer.total_training_steps={STEPS}",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
)
PLACEMENT = re.compile(r"placement: (.*)")
NODE = re.compile(r"node ([0-9a-f]+) \(")
# the node of an actor rank or a replica in the placement line
RANK_OR_REPLICA = re.compile(r"(?:actor rank|replica) \d+ on node ([0-9a-f]+) \(")
# the trainer's error for a worker that died or became unreachable (WorkerSetup.lost_worker_message)
LOST = re.compile(r"the run lost (.*?): its process or its node is gone")
# the console logger's line of a finished step
STEP_1 = re.compile(r"\bstep:1 ")


def node_id_of(node_dir: str) -> str:
    """The Ray node id of the node whose temp dir is ``node_dir`` (its raylet's ``--node_id`` argument)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(node_dir in arg for arg in cmdline) and any(a.startswith("--node_id=") for a in cmdline):
            return next(a for a in cmdline if a.startswith("--node_id=")).split("=", 1)[1]
    raise AssertionError(f"no raylet runs with temp dir {node_dir}")


def kill_node(node_dir: str) -> int:
    """SIGKILL every process of the node (those naming ``node_dir``) and what they started (engine processes
    name no temp dir); returns how many."""
    roots = [p for p in psutil.process_iter(["cmdline"]) if node_dir in " ".join(p.info["cmdline"] or [])]
    victims = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    for proc in victims.values():
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return len(victims)


def test_a_two_node_run_spans_both_nodes_and_fails_loudly_when_one_is_lost(
    new_ray_cluster, tiny_qwen_image_path, prompt_files, tmp_path
):
    with new_ray_cluster(CPUS_PER_NODE, CPUS_PER_NODE) as (address, env, _, (head_dir, second_dir)):
        nodes = {node_id_of(head_dir): "head", node_id_of(second_dir): "second"}
        out = tmp_path / "run"
        proc = subprocess.Popen(
            entry_point_command(out, tiny_qwen_image_path, prompt_files, *ARGS),
            cwd=tmp_path,
            env={**env, "RAY_ADDRESS": address},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            lines, placement = [], None
            for line in proc.stdout:  # until step 1 is logged (or the run ends)
                lines.append(line)
                placement = placement or PLACEMENT.search(line)
                if STEP_1.search(line):
                    break
            log = "".join(lines)
            assert placement and STEP_1.search(log), f"no placement line or no step 1:\n{log[-6000:]}"
            print(placement.group(0))
            placed = {nodes.get(node, node) for node in RANK_OR_REPLICA.findall(placement.group(1))}
            assert placed == {"head", "second"}, f"the ranks and replicas did not use both nodes: {placement.group(0)}"

            assert kill_node(second_dir) > 0
            killed = time.monotonic()
            rest, _ = proc.communicate(timeout=FAIL_WITHIN_S)
            print(f"the run exited {time.monotonic() - killed:.0f} s after the second node was killed")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode != 0, f"the run went on without the second node:\n{rest[-6000:]}"
    lost = LOST.search(rest)
    assert lost, f"the failure does not say which worker was lost:\n{rest[-6000:]}"
    print("the run lost", lost.group(1))
    node = NODE.search(lost.group(1))
    assert node and nodes.get(node.group(1)) == "second", f"not a worker of the second node: {lost.group(0)}"


def test_a_cpu_layout_larger_than_the_cluster_is_refused_naming_the_keys(
    ray_driver, tiny_qwen_image_path, prompt_files, tmp_path
):
    """A placement group that cannot fit waits forever: the trainer counts the run's logical CPUs first (one per
    rank, one per replica, the reward worker's)."""
    from verl_omni.trainer.config.validation import validate_config
    from verl_omni.trainer.diffusion.worker_setup import WorkerSetup
    from verl_omni.utils.config import compose_config

    class Layout(WorkerSetup):
        def __init__(self, *overrides: str):
            self.config = compose_config(
                "flowgrpo_trainer",
                [
                    f"actor_rollout_ref.model.path={tiny_qwen_image_path}",
                    f"data.train_files={prompt_files[0]}",
                    f"data.val_files={prompt_files[1]}",
                    f"trainer.default_local_dir={tmp_path}",
                    *overrides,
                ],
            )
            self.configs = validate_config(self.config)
            self.device, self.colocate = "cpu", self.configs.trainer.colocate_rollout

    Layout(*TWO_NODES)._check_device_layout()  # this module's two-node layout fits the session's cluster
    cpus = int(ray_driver.cluster_resources()["CPU"])
    with pytest.raises(ValueError) as refused:
        # as many replicas as the cluster has CPUs, beside 2 ranks and the reward worker
        Layout(
            *TWO_NODES[:2], "actor_rollout_ref.rollout.nnodes=1", f"actor_rollout_ref.rollout.n_gpus_per_node={cpus}"
        )._check_device_layout()
    message = str(refused.value)
    print(message)
    assert f"reserves {2 + cpus + 1} logical CPUs" in message and f"the Ray cluster has {cpus}:" in message
    assert "trainer.nnodes x trainer.n_gpus_per_node" in message and "ray start --num-cpus" in message

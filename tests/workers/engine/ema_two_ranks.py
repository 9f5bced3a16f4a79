"""Two gloo ranks (``torch.distributed.run``): the EMA of the weights on a toy module sharded by FSDP2 unevenly
(5 rows over 2 ranks, and a 1-row weight whose second shard is empty), against the EMA of the full tensors.

Run by ``test_ema_two_ranks.py``; rank 0 writes ``results.pt`` into the directory given.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

DECAY = 0.5
STEPS = 3


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 5)
        self.b = nn.Linear(5, 1)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.scale


def _full(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor().detach().clone() for name, p in module.named_parameters()}


def main(out_dir: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from verl_omni.workers.engine.fsdp.ema import WeightEMA

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    module = Toy()
    fully_shard(module.a, mesh=mesh)
    fully_shard(module, mesh=mesh)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    ema = WeightEMA(module, DECAY)
    expected = _full(module)
    for step in range(STEPS):
        torch.manual_seed(100 + step + rank)
        module(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update(module)
        full = _full(module)
        expected = {name: t.mul(DECAY).add_(full[name], alpha=1.0 - DECAY) for name, t in expected.items()}

    names = list(module.state_dict())
    gathered = ema.full_tensors(module, names)
    live = _full(module)
    with ema.swapped_in(module):
        exported = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        exported = {name: t.clone() for name, t in exported.items()}
    results = {
        "shard_shapes": {name: tuple(t.shape) for name, t in ema.shards.items()},
        "gathered_is_the_full_ema": all(torch.equal(gathered[n], expected[n]) for n in expected),
        "gathered_buffer": gathered["scale"],
        "names": sorted(gathered),
        "live_back": all(torch.equal(t, live[n]) for n, t in _full(module).items()),
        "ema_differs_from_live": all(not torch.equal(expected[n], live[n]) for n in expected),
    }
    if rank == 0:
        results["exported_is_the_full_ema"] = all(torch.equal(exported[n], expected[n]) for n in expected)
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, results)
    if rank == 0:
        torch.save(per_rank, Path(out_dir) / "results.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

"""The rollout output's way from the pipeline to the trainer, hop by hop, without the engine (seconds).

One request of N samples shaped as the SD3.5 Medium benchmark's (``model_throughput.py --full-size``: 512²,
16-channel latents, 10 steps, W = 2, CFG with the negative prompt, 333 text tokens of width 4096), with real
tensors and a real :class:`RolloutRecorder`, through the code each hop runs in the engine:

1. ``forward_tail``: the pipeline's ``rollout_outputs`` (``DiffusersRolloutMixin``): finiteness read-back,
   per-request split, latents packed, conditioning, the output's placement (pixels, host copies);
2. ``worker_pack``: the worker's output thread: vLLM-Omni's ``pack_diffusion_output_shm`` (on CUDA on a side
   stream after the forward's event, as ``WorkerProc._async_output_loop``), then the result queue's pickle;
3. ``engine``: the executor's unpickle and ``unpack_diffusion_output_shm``, then vLLM-Omni's
   ``DiffusionEngine.postprocess_output`` with SD3's post-process (``get_sd3_image_post_process_func``);
4. ``client_unpack``: ``engine.unpack_request_output`` (N per-sample outputs);
5. ``trainer_hop``: the rollout server's step before Ray (``schemas.own_storage``, where the tree has it),
   then the N outputs pickled and unpickled together, as Ray returns ``generate_batched``'s list from the
   server actor to the agent loop (``trainer_hop_mb``: the pickled size).

The tree on ``PYTHONPATH`` is the one measured: run it once per tree to compare two versions. Median of
``--repeats`` rounds per hop, wall time and this process's CPU time (``process_time``, steadier on a shared
machine); the last stdout line is one JSON object.

    python benchmarks/rollout_transport.py                  # CPU, the full-size shapes
    python benchmarks/rollout_transport.py --device cuda    # the D2H copies and the side stream included
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

logger = logging.getLogger("rollout_transport")

# SD3.5 Medium at 512²: 16 latent channels, VAE factor 8, CLIP's 77 + T5's 256 tokens, joint width 4096
LATENT_CHANNELS, VAE_FACTOR, TEXT_LEN, TEXT_DIM, POOLED_DIM = 16, 8, 77 + 256, 4096, 2048
# the hops, in order; the last one is the trainer's (Ray), the others end at the engine's client
HOPS = ("forward_tail", "worker_pack", "engine", "client_unpack", "trainer_hop")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16, help="samples of the request")
    p.add_argument("--size", type=int, default=512, help="image side in pixels")
    p.add_argument("--steps", type=int, default=10, help="denoising steps")
    p.add_argument("--window", type=int, default=2, help="SDE window W")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
    p.add_argument("--device", default="cpu", help="where the pipeline's tensors live (cpu or cuda)")
    return p.parse_args(argv)


def recorded_request(args, device: torch.device):
    """A recorder that stepped one request of ``args.n`` samples through its schedule (a stand-in velocity)."""
    from verl_omni.pipelines.recorder import RolloutRecorder
    from verl_omni.pipelines.rollout_request import RolloutRequest
    from verl_omni.pipelines.sampling import SamplingSpec
    from verl_omni.pipelines.schedulers.flow_match_sde import FlowMatchSDEDiscreteScheduler, schedule_sigmas

    spec = SamplingSpec(
        num_inference_steps=args.steps,
        height=args.size,
        width=args.size,
        sde_window_size=args.window,
        true_cfg_scale=4.5,
        seeds=tuple(range(args.n)),
    )
    recorder = RolloutRecorder([RolloutRequest.build([1, 2, 3], [4], spec)], device)
    side = args.size // VAE_FACTOR
    latents = torch.cat(
        [torch.randn(1, LATENT_CHANNELS, side, side, generator=g, device=device) for g in recorder.generators]
    )
    scheduler = FlowMatchSDEDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(args.steps)
    recorder.set_schedule(schedule_sigmas(scheduler, device), scheduler.timesteps.to(device))
    for _ in range(args.steps):
        latents = recorder.step(torch.tanh(latents), latents)
    return recorder


def conditioning(args, device: torch.device) -> dict[str, torch.Tensor]:
    """SD3's per-sample conditioning with CFG (bf16, one prompt's rows repeated as ``per_sample`` makes them)."""
    out = {}
    for prefix in ("", "negative_"):
        out[f"{prefix}prompt_embeds"] = (
            torch.randn(1, TEXT_LEN, TEXT_DIM, device=device).bfloat16().repeat(args.n, 1, 1)
        )
        out[f"{prefix}pooled_prompt_embeds"] = torch.randn(1, POOLED_DIM, device=device).bfloat16().repeat(args.n, 1)
    return out


def sd3_engine(model_dir: Path):
    """What ``DiffusionEngine.postprocess_output`` reads of its engine, with SD3's post-process as the engine
    builds it (through ``get_diffusion_post_process_func``, so a verl_omni hook on it is included)."""
    from vllm_omni.diffusion import diffusion_engine

    (model_dir / "vae").mkdir(parents=True, exist_ok=True)
    (model_dir / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [128, 256, 512, 512]}))
    od_config = SimpleNamespace(
        model=str(model_dir), model_class_name="StableDiffusion3Pipeline", output_type="pil", enable_cpu_offload=False
    )
    post_process = diffusion_engine.get_diffusion_post_process_func(od_config)
    return SimpleNamespace(
        od_config=od_config, post_process_func=post_process, _post_process_accepts_sampling_params=False
    )


class HopTimer:
    """Wall and process CPU seconds of each named hop."""

    def __init__(self):
        self.wall, self.cpu = {}, {}

    @contextmanager
    def hop(self, name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name], self.cpu[name] = time.perf_counter() - wall, time.process_time() - cpu


def one_round(args, device, pipeline, engine, request) -> tuple[HopTimer, int]:
    """One request's output through every hop; the hops' times and the trainer hop's pickled bytes."""
    from vllm_omni.diffusion import ipc
    from vllm_omni.diffusion.diffusion_engine import DiffusionEngine

    from verl_omni.workers.rollout.vllm_omni import schemas
    from verl_omni.workers.rollout.vllm_omni.engine import unpack_request_output

    recorder = recorded_request(args, device)
    images = (torch.randn(args.n, 3, args.size, args.size, device=device) * 0.6).bfloat16()
    cond = conditioning(args, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    timer = HopTimer()
    with timer.hop("forward_tail"):
        (output,) = pipeline.rollout_outputs(recorder, images, cond, packed=False)
    with timer.hop("worker_pack"):
        if device.type == "cuda":
            stream = torch.Stream(device=device)
            stream.wait_event(torch.cuda.current_stream().record_event())
            ipc.pack_diffusion_output_shm(output, d2h_stream=stream)
            stream.synchronize()
        else:
            ipc.pack_diffusion_output_shm(output)
        blob = pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)
    with timer.hop("engine"):
        received = ipc.unpack_diffusion_output_shm(pickle.loads(blob))
        (final,) = DiffusionEngine.postprocess_output(engine, request, received)
    with timer.hop("client_unpack"):
        samples = unpack_request_output(final, args.n)
    with timer.hop("trainer_hop"):
        own_storage = getattr(schemas, "own_storage", None)
        if own_storage is not None:
            samples = own_storage(samples)
        hop = pickle.dumps(samples, protocol=5)
        pickle.loads(hop)
    return timer, len(hop)


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    from verl_omni.pipelines.diffusers_rollout import DiffusersRolloutMixin

    # the hook the general plugin installs in the engine's process; the benchmark also runs on older trees, which
    # keep it beside the CPU patches or lack it
    try:
        from verl_omni.utils.vllm_omni_compat import patch_final_pixels_postprocess as hook
    except ImportError:
        from verl_omni.platforms import cpu_patches

        hook = getattr(cpu_patches, "patch_final_pixels_postprocess", None)
    hooked = bool(hook and hook())
    device = torch.device(args.device)
    params = OmniDiffusionSamplingParams(height=args.size, width=args.size, num_outputs_per_prompt=args.n)
    request = OmniDiffusionRequest(prompt={"prompt_token_ids": [1, 2, 3]}, request_id="bench", sampling_params=params)
    rounds, hop_bytes = [], 0
    with tempfile.TemporaryDirectory(prefix="rollout_transport_") as tmp:
        engine = sd3_engine(Path(tmp))
        for r in range(args.repeats + 1):
            timer, hop_bytes = one_round(args, device, DiffusersRolloutMixin(), engine, request)
            if r:  # the first round warms allocators and imports up
                rounds.append(timer)
    result = {"device": args.device, "n": args.n, "size": args.size, "final_pixels_hook": hooked}
    for kind in ("wall", "cpu"):
        hops = {name: round(statistics.median(getattr(t, kind)[name] for t in rounds) * 1000, 2) for name in HOPS}
        result[f"{kind}_ms"] = hops
        result[f"{kind}_pipeline_to_client_ms"] = round(sum(hops[name] for name in HOPS[:-1]), 2)
    result["trainer_hop_mb"] = round(hop_bytes / 2**20, 1)
    for name in HOPS:
        logger.info("%-14s wall %8.2f ms  cpu %8.2f ms", name, result["wall_ms"][name], result["cpu_ms"][name])
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

"""``DiffusersFSDPEngine``: a diffusers transformer with peft LoRA under FSDP2, replaying recorded steps.

It subclasses verl's ``FSDPEngine`` because most of that machinery fits a diffusion transformer
unchanged: the device mesh, ``_build_model_optimizer`` (module → LoRA → FSDP → optimizer → LR
schedule), verl's warmup schedules, ``optimizer_step`` (FSDP2 grad-norm clip, skip on non-finite
norm), deferred gradient sync over accumulation steps, offload, train/eval contexts and
``train_batch``. It overrides what is language-model specific:

* ``_build_module`` / ``_build_lora_module``: the module comes from the architecture's training
  adapter (found from the checkpoint's ``model_index.json`` or ``config.json``), LoRA is injected
  with diffusers' ``add_adapter`` (the model stays a diffusers-style model; no ``PeftModelForCausalLM``);
* ``_build_fsdp_module``: FSDP2 ``fully_shard`` on the adapter's ``fsdp_wrap_blocks`` then the
  root; bf16 compute on an accelerator, fp32 on CPU, unless ``engine.mixed_precision`` says otherwise;
  activation checkpointing's recompute gets each block's inputs cast as its forward did (:mod:`.recompute_cast`),
  and under mixed precision every unit is gathered once, so that one no replayed step runs survives a backward
  without gradient sync (:mod:`.idle_units`);
* ``forward_backward_batch``: micro-batches × replayed steps, one backward per (micro-batch,
  step) so that only one step's activations are alive, each weighted so the accumulated
  gradient is that of the mean loss over all (sample, step) pairs of the mini-batch (over the kept
  samples only when the batch carries a ``sample_mask``, :mod:`~verl_omni.workers.utils.sample_mask`);
  what a step is comes from the replay of the algorithm's rollout record, which steps are trained from the loss;
* checkpoints (LoRA in diffusers' ``load_lora_weights`` format, or the full transformer through
  ``save_pretrained``, + per-rank optimizer, LR schedule and RNG state) and ``reference_policy``
  (LoRA: the adapter disabled, no second weight copy; full fine-tuning: a frozen sharded copy of the
  base transformer, built only when ``needs_reference`` or ``reference_in_update`` is set before :meth:`initialize`);
* full fine-tuning (``model.lora.rank=0``): every transformer parameter trains, sharded by FSDP2 with its
  gradients and optimizer state; the rollout gets the weights in checked buckets (:meth:`weight_bucket_plan`,
  :meth:`weight_bucket`, :mod:`~verl_omni.workers.rollout.weight_buckets`);
* with ``old_policy_adapter`` set before :meth:`initialize` (the algorithm's ``Phases``), a second,
  frozen LoRA adapter holding the old policy as an EMA of the trained one (:mod:`.old_adapter`);
* with ``actor.ulysses_sequence_parallel_size`` = sp > 1 (verl's key, refused for a model whose adapter does not
  declare ``supports_sequence_parallel``): verl's ``(dp, sp)`` mesh; the ranks of a group pool their samples and
  replay them together, each transformer split by the adapter (:mod:`verl_omni.pipelines.sequence_parallel`,
  :mod:`.sequence_group`); FSDP still shards over every rank, so a checkpoint resumes at any degree;
* with ``ema_decay`` > 0 set before :meth:`initialize` (full fine-tuning's ``actor.ema_decay``), an fp32 EMA of the
  trained transformer's local shards on the host, updated after each optimizer step, for validation and export
  (:mod:`.ema`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
from tensordict import TensorDict
from verl.utils.device import get_device_id, get_device_name
from verl.utils.fsdp_utils import MixedPrecisionPolicy, apply_fsdp2
from verl.workers.engine.base import EngineRegistry
from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

from verl_omni.pipelines.model_base import SDE_WINDOW, get_model_adapter
from verl_omni.pipelines.sampling import SamplingSpec
from verl_omni.pipelines.sequence_parallel import context_parallel_mesh
from verl_omni.workers.engine.fsdp import checkpoint, lora_merge, old_adapter
from verl_omni.workers.engine.fsdp.block_checkpointing import blocks_of_classes, checkpoint_share_of_blocks
from verl_omni.workers.engine.fsdp.ema import WeightEMA
from verl_omni.workers.engine.fsdp.idle_units import gather_every_unit_once
from verl_omni.workers.engine.fsdp.recompute_cast import cast_inputs_on_recompute
from verl_omni.workers.engine.fsdp.sequence_group import (
    agree_rng_state,
    check_sequence_parallel,
    gather_group_batch,
    own_rows,
)
from verl_omni.workers.utils.replay import SDEWindowReplay, get_replay
from verl_omni.workers.utils.sample_mask import (
    SAMPLE_MASK_KEY,
    global_kept_count,
    masked_step_loss,
    step_loss_weight,
)

logger = logging.getLogger(__name__)

# where the rollout's SamplingSpec travels: DataProto.meta_info and the TensorDict's non-tensor data
SAMPLING_SPEC_KEY = "sampling_spec"
MICRO_BATCH_KEY = "micro_batch_size_per_gpu"
# which replay the batch needs: the rollout record of the run's algorithm (``sde_window`` when absent)
ROLLOUT_RECORD_KEY = "rollout_record"


def _dtype(name: str, key: str) -> torch.dtype:
    """verl's precision names (fp32, bf16, fp16, ...) to a dtype, naming the config key on a miss."""
    from verl.utils.torch_dtypes import PrecisionType

    try:
        return PrecisionType.to_dtype(name)
    except RuntimeError as error:
        raise ValueError(f"{key}={name!r} is not a precision verl knows (fp32, bf16, fp16)") from error


def release_host_memory() -> None:
    """Hand the host memory freed since loading back to the system (glibc keeps freed heap pages otherwise).

    Loading a checkpoint fills the heap with its CPU tensors; once they are on the device (or in the offload's own
    buffers) the pages stay in this process's resident size. Where the actor's parameters are offloaded beside a
    sleeping rollout whose weights wait in host memory too, those pages are what can run the host out of memory.
    """
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


# graphs dynamo may keep per compiled block forward (model.compile_transformer_blocks)
COMPILE_RECOMPILE_LIMIT = 64


def compile_blocks(module: torch.nn.Module, block_classes, dynamic: bool = False) -> int:
    """``torch.compile`` the ``forward`` of every submodule whose class (or, once FSDP2 has subclassed it, its base)
    is named in ``block_classes``; returns how many. The module's ``__call__`` stays eager, so FSDP's unshard and
    reshard hooks and gradient checkpointing's recompute wrap the compiled forward instead of being traced into it;
    the blocks share one code object, hence one compiled graph per grad mode, LoRA state and shape family.

    ``dynamic`` (``model.compile_dynamic``): every size symbolic from the first compile, so a longer text or
    another micro-batch reuses the graphs; else torch's default, static graphs first and one recompile that
    makes a size symbolic once it changes. Static kernels are faster, and the recompile is paid once.

    Raises:
        ValueError: no submodule matched (the adapter's ``fsdp_wrap_blocks`` do not name this module's blocks).
    """
    blocks = blocks_of_classes(module, block_classes, "model.compile_transformer_blocks")
    # a few graphs per grad mode and LoRA state (on, or off for the reference) and more if a shape specializes; past
    # dynamo's default limit of 8 it would silently run the blocks eager again
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILE_RECOMPILE_LIMIT)
    for block in blocks:
        # None is torch's automatic dynamic; False would compile again for every new text length
        block.forward = torch.compile(block.forward, dynamic=True if dynamic else None)
    return len(blocks)


def compiled_graph_count() -> int | None:
    """The graphs dynamo has compiled in this process so far, or None where torch does not count them: a step
    whose count grew paid a compile and is not the steady state. torch has no public counter; this reads
    ``torch._dynamo.utils.counters`` (torch 2.11 has it), read-only."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["stats"]["unique_graphs"])


@EngineRegistry.register(model_type="diffusion_model", backend="fsdp2", device=["cuda", "cpu"])
class DiffusersFSDPEngine(FSDPEngine):
    """verl training engine for a diffusers transformer (LoRA or full) trained on recorded rollout transitions."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config):
        if engine_config.strategy != "fsdp2":
            raise ValueError(f"engine.strategy={engine_config.strategy!r}: DiffusersFSDPEngine supports 'fsdp2' only")
        adapter = get_model_adapter(model_config.path)
        degree = engine_config.ulysses_sequence_parallel_size
        check_sequence_parallel(adapter, model_config.path, degree)
        # verl's engine asks a language model's packed text (use_remove_padding) of a sequence-parallel run; the
        # replay splits tokens itself, so verl builds its meshes at degree 1 and they are rebuilt at the degree below
        single = dataclasses.replace(engine_config, ulysses_sequence_parallel_size=1)
        super().__init__(model_config, single, optimizer_config, checkpoint_config)
        self.engine_config = engine_config
        # diffusers' (ring, ulysses) mesh of this rank's sequence-parallel group (None: no split)
        self.context_parallel_mesh = None
        if degree > 1:
            self._init_device_mesh()
            self.context_parallel_mesh = context_parallel_mesh(get_device_name(), degree)
        self.adapter = adapter
        self.vae_scale_factor = self.adapter.vae_scale_factor(model_config.path)
        self.scheduler = None
        # a second LoRA adapter holding the old policy (set by the worker from the algorithm's phases)
        self.old_policy_adapter = False
        # optimizer steps taken in this run (a resume restores it): the old policy's EMA decay counts them
        self.optimizer_steps = 0
        # full fine-tuning with a KL term (or with reference_in_update): a frozen sharded copy of the base
        # transformer (set by the worker)
        self.needs_reference = False
        self.reference_module = None
        # the update's replay predicts the reference velocity beside the trained one (the algorithm's Phases)
        self.reference_in_update = False
        # the trained module's own class (FSDP2 subclasses it in place): checkpoints rebuild it to save_pretrained
        self.module_class = None
        # full fine-tuning's EMA of the weights (actor.ema_decay, set by the worker; 0: none)
        self.ema_decay = 0.0
        self.ema: WeightEMA | None = None

    # ---- building -------------------------------------------------------------------------

    def initialize(self):
        """Build the sharded model, optimizer and LR schedule, and the rollout's scheduler."""
        self._build_model_optimizer()
        if (self.needs_reference or self.reference_in_update) and not self._is_lora:
            self.reference_module = self._build_reference_module()
        if self.ema_decay:
            if self._is_lora:
                raise ValueError(
                    "actor.ema_decay > 0 averages the full transformer: it needs full fine-tuning (model.lora.rank=0)"
                )
            self.ema = WeightEMA(self.module, self.ema_decay)
        self.scheduler = self.adapter.build_scheduler(self.model_config.path)
        self.to(device="cpu", model=self._is_offload_param, optimizer=self._is_offload_optimizer, grad=False)
        release_host_memory()

    def _build_module(self):
        dtype = _dtype(self.engine_config.model_dtype or "fp32", "engine.model_dtype")
        module = self.adapter.build_module(self.model_config.path, dtype=dtype)
        self.module_class = type(module)
        self._split_sequence(module)
        fraction = self.model_config.gradient_checkpointing_fraction
        if self.model_config.enable_gradient_checkpointing and fraction < 1:
            count = checkpoint_share_of_blocks(module, self.adapter.fsdp_wrap_blocks, fraction)
            logger.info(
                "gradient checkpointing on %d blocks (model.gradient_checkpointing_fraction=%g)", count, fraction
            )
        elif self.model_config.enable_gradient_checkpointing:
            module.enable_gradient_checkpointing()
        if not self._is_lora:
            module.requires_grad_(True)
        return module

    def _build_lora_module(self, module):
        from peft import LoraConfig

        lora = self.model_config.lora
        targets = list(lora.target_modules or self.adapter.lora_target_modules)
        # the same seed on every rank: every rank must hold the same initial adapter before sharding
        torch.manual_seed(self.engine_config.seed)
        module.requires_grad_(False)
        module.add_adapter(
            LoraConfig(
                r=lora.rank,
                lora_alpha=lora.alpha,
                target_modules=targets,
                exclude_modules=self.adapter.lora_exclude_modules,
                init_lora_weights=lora.init_lora_weights,
                lora_dropout=lora.dropout,
            )
        )
        trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        # the adapter's master weights stay fp32 when the frozen base is bf16 (engine.model_dtype):
        # an optimizer step on bf16 weights would round small updates away
        for param in module.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
        if not trainable or any("lora_" not in n for n in trainable):
            raise RuntimeError(
                f"LoRA on targets {targets} made {len(trainable)} trainable tensors (expected lora_A/lora_B only): "
                "check model.lora.target_modules against the transformer's module names"
            )
        logger.info("LoRA r=%d alpha=%d on %d tensors (%s)", lora.rank, lora.alpha, len(trainable), targets)
        if self.old_policy_adapter:
            # before FSDP wraps the module: the old adapter is sharded like the trained one
            old_adapter.add_old_adapter(module)
        return module

    def _split_sequence(self, module) -> None:
        """With a sequence-parallel degree > 1: the adapter's Ulysses split of ``module`` over this rank's group."""
        if self.context_parallel_mesh is not None:
            self.adapter.enable_sequence_parallel(module, self.context_parallel_mesh)
            logger.info(
                "sequence parallel: each sample's tokens split over %d ranks", self.ulysses_sequence_parallel_size
            )

    def _mixed_precision(self) -> tuple[torch.dtype, torch.dtype]:
        """(param, reduce) dtypes: from ``engine.mixed_precision``, else bf16/fp32 on an accelerator, fp32 on CPU."""
        config = self.engine_config.mixed_precision
        if config is not None:
            return (
                _dtype(config.get("param_dtype", "bf16"), "engine.mixed_precision.param_dtype"),
                _dtype(config.get("reduce_dtype", "fp32"), "engine.mixed_precision.reduce_dtype"),
            )
        compute = torch.float32 if get_device_name() == "cpu" else torch.bfloat16
        return compute, torch.float32

    def _build_reference_module(self):
        """The frozen reference of full fine-tuning: the base transformer again, sharded like the trained one."""
        dtype = _dtype(self.engine_config.model_dtype or "fp32", "engine.model_dtype")
        module = self.adapter.build_module(self.model_config.path, dtype=dtype).requires_grad_(False)
        self._split_sequence(module)
        self._shard(module)
        logger.info("frozen reference transformer built (full fine-tuning)")
        return module.eval()

    def _build_fsdp_module(self, module):
        self._shard(module)
        param_dtype, reduce_dtype = self._mixed_precision()
        if self.model_config.enable_gradient_checkpointing:
            # the recompute must see each block's inputs in the dtype FSDP2 cast them to in the forward
            cast_inputs_on_recompute(module, param_dtype)
        if param_dtype != reduce_dtype:
            # a unit that has not run yet (an expert no replayed step needs) must survive a backward without sync
            gather_every_unit_once(module)
        if self.model_config.compile_transformer_blocks:
            count = compile_blocks(module, self.adapter.fsdp_wrap_blocks, self.model_config.compile_dynamic)
            logger.info(
                "torch.compile on the forward of %d transformer blocks (model.compile_transformer_blocks)", count
            )
        if self.model_config.enable_activation_offload:
            from verl.utils.activation_offload import enable_activation_offloading

            enable_activation_offloading(module, "fsdp2", self.model_config.enable_gradient_checkpointing)
        return module

    def _shard(self, module) -> None:
        """FSDP2 ``fully_shard`` on the adapter's wrap blocks, then the root, with the engine's precision."""
        param_dtype, reduce_dtype = self._mixed_precision()
        self._autocast_dtype, self.scaler = param_dtype, None
        fsdp_kwargs = {
            "mesh": self.device_mesh,
            "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
            "reshard_after_forward": self.engine_config.reshard_after_forward,
        }
        if self.engine_config.offload_policy:
            fsdp_kwargs["offload_policy"] = self._cpu_offload_policy()
        wrap = {
            "wrap_policy": {"transformer_layer_cls_to_wrap": list(self.adapter.fsdp_wrap_blocks)},
            "forward_prefetch": self.engine_config.forward_prefetch,
        }
        apply_fsdp2(module, fsdp_kwargs, wrap)

    def _cpu_offload_policy(self):
        """FSDP2's ``CPUOffloadPolicy`` (``engine.offload_policy``): the sharded parameters, their gradients and the
        optimizer state live in host memory for the whole run, each block's shards are copied to the device for its
        forward and backward, and the optimizer step runs on the host. verl's between-phase offload
        (``param_offload`` / ``optimizer_offload``) is switched off, as in verl's engine: the policy owns placement."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        self._is_offload_param = self._is_offload_optimizer = False
        self._uses_fsdp2_cpu_offload_policy = True
        # pinned host memory speeds the copies to an accelerator; there is none to pin for on CPU
        return CPUOffloadPolicy(pin_memory=get_device_name() != "cpu")

    def _build_optimizer(self, module):
        from verl.workers.config.optimizer import build_optimizer

        return build_optimizer([p for p in module.parameters() if p.requires_grad], self.optimizer_config)

    def _build_lr_scheduler(self, optimizer):
        """verl's schedules, except that constant warmup starts at lr/warmup instead of 0.

        verl's constant warmup gives lr = 0 on the first step, which would make the first
        Flow-GRPO update (one optimizer step per mini-batch) a no-op.
        """
        config = self.optimizer_config
        if config.lr_scheduler_type != "constant":
            return super()._build_lr_scheduler(optimizer)
        warmup = config.lr_warmup_steps
        if warmup is None or warmup <= 0:
            warmup = int(config.lr_warmup_steps_ratio * max(config.total_training_steps, 0))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(1, warmup)))

    # ---- replay ---------------------------------------------------------------------------

    def replay(self, micro_batch: TensorDict, step: int, spec: SamplingSpec, replay=SDEWindowReplay):
        """Recorded step ``step`` of one micro-batch replayed with the policy (``replay.step``; for an SDE
        window: log π_θ, μ_θ, s, see :func:`~verl_omni.workers.utils.replay.replay_step`); with
        ``reference_in_update`` the replay also runs the reference policy (:meth:`reference_policy`)."""
        reference = self.reference_policy if self.reference_in_update else None
        return replay.step(
            self.adapter, self.module, self.scheduler, micro_batch, step, spec, self.vae_scale_factor, reference
        )

    def forward_backward_batch(self, data: TensorDict, loss_function: Callable | None, forward_only=False) -> dict:
        """Replay the recorded steps of ``data`` in micro-batches; backward per (micro-batch, step) when training.

        The record kind (non-tensor ``rollout_record``, default ``sde_window``) picks the replay
        (:data:`~verl_omni.workers.utils.replay.REPLAYS`); the loss picks the replayed steps
        (``loss_function.replay_steps``, default all). ``loss_function(replayed, micro_batch, step) -> (loss,
        metrics)``. The loss of a micro-batch of b samples at one step is weighted b / (B·S) for S replayed
        steps, so the accumulated gradient is that of the mean over the B local samples × S steps (FSDP then
        averages over ranks). When training on a batch with a ``sample_mask`` ``[B]`` the loss sees only the
        kept rows and is weighted so that the gradient is the mean over the mini-batch's kept samples of all
        ranks (:mod:`~verl_omni.workers.utils.sample_mask`); every row is still replayed. With sequence
        parallelism the batch is the group's pooled samples, each loss weighted sp times (a group's ranks hold
        parts of one gradient, which FSDP averages over every rank), and each rank returns its own rows.

        Returns:
            the replay's per-step outputs stacked to ``[B, S, ...]`` (an SDE window: ``log_probs`` ``[B, S]``,
            ``prev_sample_mean`` ``[B, S, N, C]``) and ``"metrics": {name: [values]}``.
        """
        spec = data.get_non_tensor(SAMPLING_SPEC_KEY)
        if not isinstance(spec, SamplingSpec):
            raise KeyError(f"data must carry a SamplingSpec under non-tensor key {SAMPLING_SPEC_KEY!r}")
        own = None
        if self.context_parallel_mesh is not None:
            # the group's ranks replay the samples of all of them, each on its slice of the tokens
            data, own = gather_group_batch(data, self.ulysses_parallel_group)
            agree_rng_state(self.ulysses_parallel_group)
        replay = get_replay(data.get_non_tensor(ROLLOUT_RECORD_KEY, default=SDE_WINDOW))
        replay.check(data, spec, self.adapter)
        replay.prepare(self.adapter, self.scheduler, spec, data)
        steps = list(getattr(loss_function, "replay_steps", range)(replay.num_steps(data, spec)))
        size = data.batch_size[0]
        micro_batches = data.split(self._micro_batch_size(data))
        masked = not forward_only and SAMPLE_MASK_KEY in data.keys()
        kept_global = global_kept_count(data[SAMPLE_MASK_KEY], self.get_data_parallel_group()) if masked else 0
        # FSDP averages gradients over every rank, and a sequence-parallel group's ranks each hold the gradient of
        # their own tokens only, which sum to the group's: the loss counts once per group, not once per rank
        split = self.ulysses_sequence_parallel_size
        outputs, metrics = [], {}
        for i, micro_batch in enumerate(micro_batches):
            if masked:
                keep = micro_batch[SAMPLE_MASK_KEY]
                dp = self.get_data_parallel_size()
                weight = split * step_loss_weight(int(keep.sum()), kept_global, dp, len(steps))
            else:
                keep, weight = None, split * micro_batch.batch_size[0] / (size * len(steps))
            is_last = i == len(micro_batches) - 1
            outputs.append(
                self._replay_micro_batch(
                    micro_batch, spec, replay, steps, loss_function, forward_only, (weight, keep), is_last, metrics
                )
            )
        output = {key: torch.cat([o[key] for o in outputs]).cpu() for key in outputs[0]}
        if own is not None:
            output = own_rows(output, own)
        output["metrics"] = metrics
        return output

    def _replay_micro_batch(
        self, micro_batch, spec, replay, steps, loss_function, forward_only, weighting, is_last, metrics
    ):
        """The replayed ``steps`` of one micro-batch: the replay's outputs stacked ``[b, S, ...]``; backward per step.

        ``weighting``: ``(weight, keep)``, the loss's weight and the kept rows ``[b]`` (None: every row).
        """
        weight, keep = weighting
        micro_batch = micro_batch.to(get_device_id())
        keep = None if keep is None else micro_batch[SAMPLE_MASK_KEY]
        per_step: dict[str, list[torch.Tensor]] = {}
        for step in steps:
            last = is_last and step == steps[-1]
            sync = nullcontext() if forward_only else self._gradient_sync_context(is_last_micro_batch=last)
            with torch.no_grad() if forward_only else nullcontext(), sync:
                out = self.replay(micro_batch, step, spec, replay)
                if loss_function is not None:
                    if keep is None:
                        loss, step_metrics = loss_function(out, micro_batch, step)
                    else:
                        loss, step_metrics = masked_step_loss(loss_function, out, micro_batch, step, keep)
                    if not forward_only:
                        (loss * weight).backward()
                    for key, value in step_metrics.items():
                        metrics.setdefault(key, []).append(value)
            for key, value in replay.outputs(out).items():
                per_step.setdefault(key, []).append(value.detach())
        return {key: torch.stack(values, dim=1) for key, values in per_step.items()}

    def _micro_batch_size(self, data: TensorDict) -> int:
        """Samples per forward: the batch's ``micro_batch_size_per_gpu`` (set by the actor), else the engine's."""
        size = data.get_non_tensor(MICRO_BATCH_KEY, default=None) or self.engine_config.micro_batch_size_per_gpu
        if not size or size < 1:
            raise ValueError(f"set actor.ppo_micro_batch_size_per_gpu (or engine.{MICRO_BATCH_KEY}) >= 1, got {size}")
        return int(size)

    # ---- reference, export, checkpoints ---------------------------------------------------

    @contextmanager
    def reference_policy(self):
        """The reference policy (of the KL term, or Diffusion-DPO's): LoRA switched off, or (full fine-tuning) the
        frozen base copy; yields the module that computes it."""
        if self._is_lora:
            trained = [param for param in self.module.parameters() if param.requires_grad]
            self.module.disable_adapters()
            # peft's disable also freezes the adapter (requires_grad off), and FSDP2 picks each unit's gradient dtypes
            # from the trainable parameters it sees at its first forward: when the reference pass is that first
            # forward (π_old taken from the rollout, no old_log_prob phase), every unit would take none and hand the
            # fp32 adapter bf16 gradients. The disabled adapter is skipped in the forward either way.
            for param in trained:
                param.requires_grad_(True)
            try:
                yield self.module
            finally:
                self.module.enable_adapters()
            return
        if self.reference_module is None:
            raise RuntimeError(
                "full fine-tuning has a reference only when the engine built its frozen copy (needs_reference or "
                "reference_in_update before initialize; the worker sets them from the algorithm's Phases)"
            )
        trained, self.module = self.module, self.reference_module
        try:
            yield self.module
        finally:
            self.module = trained

    def optimizer_step(self):
        """verl's step (FSDP2 grad-norm clip, skip on a non-finite norm), counted in :attr:`optimizer_steps`, then the
        EMA's update when there is one (also after a skipped step: the average follows the weights as they are)."""
        grad_norm = super().optimizer_step()
        self.optimizer_steps += 1
        if self.ema is not None:
            self.ema.update(self.module)
        return grad_norm

    def update_old_adapter(self, decay: float) -> None:
        """The old policy's soft update θ_old ← decay·θ_old + (1 − decay)·θ (each rank its own shards)."""
        if not self.old_policy_adapter:
            raise RuntimeError(
                "update_old_adapter needs the old-policy adapter (old_policy_adapter=True before initialize)"
            )
        old_adapter.ema_update(self.module, decay)

    def lora_state_dict(self, to_host: bool = True) -> dict[str, torch.Tensor]:
        """Full (unsharded) LoRA tensors on CPU (``to_host=False``: on this rank's device), named as diffusers'
        ``get_peft_model_state_dict`` names them.

        A collective: every rank must call it.
        """
        return checkpoint.gather_lora_state_dict(self.module, to_host)

    def get_per_tensor_param(self, to_host: bool = True, **kwargs):
        """Weights for the rollout (verl's contract): ``(iterator of (name, tensor), peft config or None)``; on CPU,
        or with ``to_host=False`` on this rank's device (the CUDA IPC sync, :mod:`~verl_omni.workers.rollout.device_share`).

        LoRA: the LoRA tensors in peft's checkpoint naming, ``base_model.model.<module>.lora_A.weight`` with
        ``<module>`` the rollout's name of the trained module, as vLLM's LoRA loader parses peft checkpoints;
        the adapter's ``rollout_lora`` renames them and fuses the sub-layer adapters of fused layers the rollout
        does not route itself (the same form the checkpoint's PEFT layout has), and the peft config.
        Full fine-tuning: every full tensor (one gather at a time, lazily; a collective, every rank must walk
        it) under the diffusers names the rollout's ``load_weights`` maps, and None.
        """
        if not self._is_lora:
            names = list(self.module.state_dict())
            gather = checkpoint.gather_full_tensors
            return ((name, gather(self.module, [name], to_host)[name]) for name in names), None
        tensors = self.lora_state_dict(to_host)
        config, rollout_tensors = self.adapter.rollout_lora(
            tensors, self.module.peft_config[checkpoint.ADAPTER_NAME].to_dict()
        )
        return iter(rollout_tensors.items()), config

    def weight_bucket_plan(self, bucket_bytes: int) -> list[list[str]]:
        """The names of the weights the rollout computes with, in buckets of at most ``bucket_bytes`` (every rank
        computes the same plan from the global shapes; :func:`~verl_omni.workers.rollout.weight_buckets.plan_buckets`):
        full fine-tuning, the whole transformer; a LoRA (``model.lora.merge``), the adapted linears' merged
        weights (:mod:`.lora_merge`)."""
        from verl_omni.workers.rollout.weight_buckets import plan_buckets

        if self._is_lora:
            return plan_buckets(lora_merge.merged_sizes(self.module), bucket_bytes)
        sizes = ((name, t.numel() * t.element_size()) for name, t in self.module.state_dict().items())
        return plan_buckets(sizes, bucket_bytes)

    def weight_bucket(
        self, plan: list[list[str]], index: int, ema: bool = False, to_host: bool = True
    ) -> dict[str, torch.Tensor]:
        """The full tensors of bucket ``index`` of ``plan``, on CPU (``to_host=False``: the live weights on this
        rank's device; ``ema``: the EMA's, on CPU, :mod:`.ema`; a LoRA: the merged weights, :mod:`.lora_merge`).
        A collective: every rank gathers its shards."""
        if self._is_lora and not ema:
            return lora_merge.merged_weights(self.module, plan[index], to_host)
        if not ema:
            return checkpoint.gather_full_tensors(self.module, plan[index], to_host)
        if self.ema is None:
            raise RuntimeError("the EMA weights were asked for, but actor.ema_decay is 0 (no EMA is kept)")
        return self.ema.full_tensors(self.module, plan[index])

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None, **kwargs):
        """LoRA as diffusers safetensors, or the full transformer with ``save_pretrained`` (rank 0), + this rank's
        optimizer / LR schedule / RNG state (:mod:`.checkpoint`).

        ``max_ckpt_to_keep`` must be None: pruning is the trainer's (``trainer.max_actor_ckpt_to_keep``).
        """
        if hdfs_path is not None:
            raise NotImplementedError("hdfs_path is not supported by DiffusersFSDPEngine checkpoints")
        if max_ckpt_to_keep is not None:
            # the engine sees one checkpoint directory; the run directory's trainer prunes them all
            raise NotImplementedError(
                "DiffusersFSDPEngine does not prune checkpoints; trainer.max_actor_ckpt_to_keep is applied by "
                "verl_omni.trainer.diffusion.run_dir after each complete save"
            )
        checkpoint.save(self, local_path, global_step)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False, **kwargs):
        """Restore what :meth:`save_checkpoint` wrote; the world size must be the same."""
        checkpoint.load(self, local_path)

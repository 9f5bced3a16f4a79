"""What verl's ``verl.plugins`` entry point imports, in the driver and in every Ray worker.

It imports the modules whose import registers something that verl's own code looks up in any process (the CPU
platform, the rollout backend) and does nothing else; algorithms and scorers register themselves on their first
lookup (:data:`verl_omni.algorithms.ALGORITHMS`, ``verl_omni.utils.reward_score``), in whichever process asks.
verl logs plugin import errors at DEBUG only, so ``tests/sanity/test_plugin.py`` asserts that every registration
below really happened.
"""

import importlib

REGISTERING_MODULES = (
    "verl_omni.platforms.verl_cpu",
    "verl_omni.workers.rollout.vllm_omni",
)
# Not here: ``verl_omni.workers.engine.fsdp.diffusers_impl`` registers ``DiffusersFSDPEngine`` when the
# actor worker imports it. Importing it costs peft, diffusers and verl's engines (seconds), which
# every process that imports verl (rollout, reward and agent-loop workers) would otherwise pay;
# verl imports its own engines lazily for the same reason. Nor ``verl_omni.reward_loop`` (the ``diffusion`` reward
# manager): only the reward workers and the driver look it up, and both import that package themselves (the
# workers' class lives there); in the plugin it cost every other worker verl's reward loop and transformers.

for _module in REGISTERING_MODULES:
    importlib.import_module(_module)

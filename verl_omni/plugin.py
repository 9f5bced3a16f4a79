"""What verl's ``verl.plugins`` entry point imports, in the driver and in every Ray worker.

It imports the modules whose import registers something with verl (the CPU platform, the reward manager and
scorers, the rollout backend) and does nothing else; algorithms register themselves on their first lookup
(:data:`verl_omni.algorithms.ALGORITHMS`), in whichever process asks. verl logs plugin import errors at DEBUG only,
so ``tests/sanity/test_plugin.py`` asserts that every registration below really happened.
"""

import importlib

REGISTERING_MODULES = (
    "verl_omni.platforms.verl_cpu",
    "verl_omni.reward_loop",
    "verl_omni.workers.rollout.vllm_omni",
)
# Not here: ``verl_omni.workers.engine.fsdp.diffusers_impl`` registers ``DiffusersFSDPEngine`` when the
# actor worker imports it. Importing it costs peft, diffusers and verl's engines (seconds), which
# every process that imports verl (rollout, reward and agent-loop workers) would otherwise pay;
# verl imports its own engines lazily for the same reason.

for _module in REGISTERING_MODULES:
    importlib.import_module(_module)

"""What verl's ``verl.plugins`` entry point imports, in the driver and in every Ray worker.

It imports the modules whose import registers something (advantage estimators, losses, engines,
rollout backends, scorers) and does nothing else. verl logs plugin import errors at DEBUG only,
so ``tests/sanity/test_plugin.py`` asserts that every registration below really happened.
"""

import importlib

REGISTERING_MODULES = (
    "verl_omni.platforms.verl_cpu",
    "verl_omni.trainer.flowgrpo.core_algos",
)

for _module in REGISTERING_MODULES:
    importlib.import_module(_module)

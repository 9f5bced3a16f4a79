"""verl_omni: online RL (Flow-GRPO and friends) for diffusion and unified image models on verl.

Importing the package has no side effects; registrations happen in :mod:`verl_omni.plugin`,
which verl's plugin entry point loads in every process (driver and Ray workers alike).
"""

__version__ = "0.1.0"

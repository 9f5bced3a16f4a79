"""``RolloutWeightSync``'s choice of what and how, made once from the config; the pushes run against real servers
in ``vllm_omni/test_server_ray.py`` and in the trainer runs."""

import pytest

from verl_omni.workers.config.model import DiffusionLoraConfig
from verl_omni.workers.config.rollout import HOST
from verl_omni.workers.rollout.weight_sync import FULL, LORA, MERGED_LORA, RolloutWeightSync, payload_for


@pytest.mark.parametrize(
    ("lora", "payload"),
    [
        (DiffusionLoraConfig(rank=0), FULL),
        (DiffusionLoraConfig(rank=8), LORA),
        (DiffusionLoraConfig(rank=8, merge=True), MERGED_LORA),
    ],
)
def test_the_payload_follows_model_lora(lora, payload):
    assert payload_for(lora) == payload


def test_an_unknown_transport_or_payload_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"weight transport must be one of \['collective', 'host', 'ipc'\]"):
        RolloutWeightSync(None, [], transport="nccl", payload=LORA)
    with pytest.raises(ValueError, match=r"payload must be one of \('lora', 'merged_lora', 'full'\)"):
        RolloutWeightSync(None, [], transport=HOST, payload="adapter")


def test_the_ema_of_an_adapter_is_refused_naming_the_key():
    sync = RolloutWeightSync(None, [], transport=HOST, payload=LORA)
    with pytest.raises(ValueError, match=r"model.lora.rank=0"), sync.ema_weights(step=1):
        pass
    sync.close()

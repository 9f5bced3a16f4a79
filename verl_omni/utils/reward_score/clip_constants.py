"""OpenAI CLIP's image normalization, used by the HPSv2 and ImageReward preprocessing."""

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

"""The tiny random CLIP: deterministic per seed and loadable the way the CLIP scorers load it."""

import torch
from transformers import CLIPModel, CLIPProcessor

from verl_omni.utils.tiny_models import available_builders, build_tiny_model, directory_digest


def test_clip_builder_is_registered_and_deterministic_per_seed(tiny_clip_dir, tmp_path):
    assert "clip" in available_builders()
    assert directory_digest(build_tiny_model("clip", tmp_path / "same", seed=0)) == directory_digest(tiny_clip_dir)
    assert directory_digest(build_tiny_model("clip", tmp_path / "other", seed=1)) != directory_digest(tiny_clip_dir)
    assert (tiny_clip_dir / "aesthetic_head.safetensors").is_file()


def test_tiny_clip_tokenizes_text_and_tells_prompts_apart(tiny_clip_dir):
    processor = CLIPProcessor.from_pretrained(tiny_clip_dir)
    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    ids = processor.tokenizer("a sign that says hello").input_ids
    assert ids[0] == processor.tokenizer.bos_token_id and ids[-1] == processor.tokenizer.eos_token_id
    assert processor.tokenizer.unk_token_id not in ids[1:-1]
    inputs = processor(text=["a red cat", "a blue car"], return_tensors="pt", padding=True)
    with torch.no_grad():
        text = model.get_text_features(**inputs).pooler_output
    assert not torch.allclose(text[0], text[1])  # pooled at each prompt's own end token

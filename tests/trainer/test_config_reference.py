"""The generated config reference page (``docs/reference/config.md``) matches the dataclasses and the YAML tree."""

from verl_omni.trainer.config.reference import COMMAND, PAGE, parse_args_section, render, yaml_comments


def test_config_reference_page_is_in_sync_with_the_dataclasses_and_yaml():
    assert PAGE.read_text() == render(), f"stale: run {COMMAND}"


def test_args_section_keeps_continuation_lines_and_stops_at_the_next_section():
    doc = "Summary.\n\nArgs:\n    rank (int): LoRA rank;\n        0 is full fine-tuning.\n    alpha (int): scale.\n\nReturns:\n    x"
    assert parse_args_section(doc) == {"rank": ("int", "LoRA rank; 0 is full fine-tuning."), "alpha": ("int", "scale.")}


def test_yaml_comments_belong_to_the_key_right_below_them(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("# file header\n\n# the actor\nactor:\n\n  # samples per step\n  size: 4\n\n  plain: 1\n")
    assert yaml_comments(path) == {"actor": "the actor", "actor.size": "samples per step"}

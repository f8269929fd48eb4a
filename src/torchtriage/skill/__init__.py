"""The agent skill: a SKILL.md that routes a training failure's symptom to the torchtriage command to run.

An agent follows prose with nothing to check it, so the prose is made from the tool rather than written
beside it. `branches.py` holds the editorial part (symptom -> commands, what the verdict's words mean);
`inventory.py` reads what exists (each verb's argparse parser, the rules, the public helpers, the verdict's
keys, the exit codes); `generate.py` checks the first against the second and renders the text, adding per
category the rule ids, the environment variables and helpers the rules' actions name. A command, option,
helper or key the tool lacks stops the generation (SkillError), and `tests/test_skill.py` reads the text back
against the real parsers and the knowledge base. Generating never imports torch.
"""

from torchtriage.skill.generate import skill_text

__all__ = ["skill_text"]

"""Small distributed training jobs with injected failures, launched by ``torchtriage demo``."""

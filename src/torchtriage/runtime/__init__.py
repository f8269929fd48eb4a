"""Helpers that run inside training processes. They import torch lazily and never raise into training."""

"""Renderers: the same Verdict for a person (text) or a program (JSON)."""

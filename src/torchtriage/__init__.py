"""torchtriage: diagnose failures of PyTorch distributed training and route each to the exact fix.

Offline analysis never imports torch; importing this package stays cheap.
"""

__version__ = "0.1.0"

"""xaudit compute side: model adapters, the masking game, attribution methods, the criterion audit.

Importing this package is cheap; heavy dependencies (torch, onnxruntime) load in submodules.
"""

from workers.threads import set_wait_policy

# Before any torch import of this package: libgomp reads its wait policy once, when torch loads.
set_wait_policy()

"""xaudit compute side: model adapters, the masking game, attribution methods, the criterion audit.

Importing this package is cheap; heavy dependencies (torch, onnxruntime) load in submodules.
"""

from workers.precision import forbid_tf32
from workers.threads import set_wait_policy

# Before any torch import of this package: libgomp reads its wait policy once, when torch loads;
# cuBLAS and cuDNN read TF32's override when they start.
set_wait_policy()
forbid_tf32()

# transitional re-export: removed at the namespace rename
from xaudit.contract.onnx_external import *  # noqa: F403
from xaudit.contract.onnx_external import __all__  # noqa: F401

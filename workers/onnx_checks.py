# transitional re-export: removed at the namespace rename
from xaudit.contract.onnx_checks import *  # noqa: F403
from xaudit.contract.onnx_checks import __all__  # noqa: F401

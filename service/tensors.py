# transitional re-export: removed at the namespace rename
from xaudit.contract.tensors import *  # noqa: F403
from xaudit.contract.tensors import __all__  # noqa: F401

# transitional re-export: removed at the namespace rename
from xaudit.contract.errors import *  # noqa: F403
from xaudit.contract.errors import __all__  # noqa: F401

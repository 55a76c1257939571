# transitional re-export: removed at the namespace rename
from xaudit.contract.spec import *  # noqa: F403
from xaudit.contract.spec import __all__  # noqa: F401

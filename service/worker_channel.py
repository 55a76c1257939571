# transitional re-export: removed at the namespace rename
from xaudit.contract.channel import *  # noqa: F403
from xaudit.contract.channel import __all__  # noqa: F401

"""The contract every role of xaudit shares; it imports nothing else of the project.

* :mod:`xaudit.contract.errors`: the one error tree (gRPC code, reason, CLI exit status per class).
* :mod:`xaudit.contract.names`: methods, criteria, verdicts, job kinds, queues.
* :mod:`xaudit.contract.spec`: the typed job spec, parsed and validated once (numpy only).
* :mod:`xaudit.contract.tensors`: numpy <-> the ``Tensor`` message (numpy and the generated code).
* :mod:`xaudit.contract.dsse`: the DSSE / in-toto format of signed reports.

Importing this package loads only the standard library, so ``xaudit --help`` stays fast.
"""

from xaudit.contract.errors import InvalidInput, VerificationError, XauditError
from xaudit.contract.names import ALL_METHODS, CRITERIA, FOURTEEN_METHODS, VERDICTS

__all__ = [
    "ALL_METHODS",
    "CRITERIA",
    "FOURTEEN_METHODS",
    "VERDICTS",
    "InvalidInput",
    "VerificationError",
    "XauditError",
]

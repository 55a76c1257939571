"""Methods are judged independently: one that cannot run on a model is not applicable, the rest run.

A gradient or rule method needs a torch graph of the model; when that graph cannot be built (an
operator without a converter, a conversion failure) or the method breaks on it, the method is
``not_applicable`` with the reason, never a failed audit. Errors in the job itself (bad input,
bad parameter, cancellation, time limits) still end the job.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from xaudit.contract.errors import InvalidModel, NotApplicable, XauditError

__all__ = ["judged_alone"]

logger = logging.getLogger(__name__)

# Raised by Celery's time limits; they must end the job, not one method.
_JOB_LEVEL = {"SoftTimeLimitExceeded", "TimeLimitExceeded", "Terminated", "WorkerLostError"}


@contextmanager
def judged_alone(method: str) -> Iterator[None]:
    """Turn model-specific failures inside ``method`` into :class:`NotApplicable` naming the cause."""
    try:
        yield
    except NotApplicable:
        raise
    except InvalidModel as exc:  # the torch graph cannot be built: names the operator and node
        raise NotApplicable(method, str(exc)) from None
    except XauditError:
        raise
    except Exception as exc:
        if type(exc).__name__ in _JOB_LEVEL:
            raise
        logger.info("%s failed on this model", method, exc_info=True)
        first = str(exc).splitlines()[0][:200] if str(exc) else "no message"
        raise NotApplicable(
            method, f"it failed on this model's graph ({type(exc).__name__}: {first})"
        ) from None

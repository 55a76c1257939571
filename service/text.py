"""Text that crosses the service's boundary: checked on the way in, clipped on the way out.

Every string field of every client request is checked once (NUL and other control characters,
absurd lengths) by the request guard before any handler runs, so no text the store would refuse
(PostgreSQL has no NUL in text) or choke on reaches it. Text a worker reports (progress messages,
errors, possibly shaped by a hostile model) is cleaned rather than refused: a failure must always
be recordable. Echoed text (an unknown id in an error message) is clipped.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from xaudit.contract.errors import InvalidInput

__all__ = ["MAX_TEXT", "check_message_text", "check_text", "clean", "shown"]

# Longest string accepted in any request field (a spec string, a name, an id); fields with a
# tighter rule (idempotency keys, tensor names) check it where they are parsed.
MAX_TEXT = 4096
MAX_NESTING = 8  # message nesting in a request (the deepest real one is 3)
_CONTROL = {chr(c) for c in range(32)} - {"\t", "\n", "\r"}


def shown(text: str, limit: int = 80) -> str:
    """``text`` for an error message: clipped, with control characters escaped."""
    clipped = text if len(text) <= limit else text[:limit] + "..."
    return (
        clipped.encode("unicode_escape").decode("ascii") if any(c in _CONTROL for c in clipped) else clipped
    )


def clean(text: str, limit: int) -> str:
    """Worker-reported text as the store keeps it: control characters and lone surrogates replaced."""
    text = text[:limit]
    if any(c in _CONTROL for c in text):
        text = "".join("\ufffd" if c in _CONTROL else c for c in text)
    return text.encode("utf-8", "replace").decode("utf-8")


def check_text(value: str, where: str, limit: int = MAX_TEXT) -> None:
    """InvalidInput when ``value`` is longer than ``limit`` or holds a control character."""
    if len(value) > limit:
        raise InvalidInput(f"{where} is {len(value)} characters long; the limit is {limit}")
    bad = next((c for c in value if c in _CONTROL), None)
    if bad is not None:
        raise InvalidInput(f"{where} contains the control character {bad!r}: {shown(value, 40)!r}")


def _check_value(field: FieldDescriptor, value: Any, where: str, depth: int) -> None:
    if field.type == FieldDescriptor.TYPE_STRING:
        check_text(value, where)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        check_message_text(value, where, depth + 1)


def check_message_text(message: Message, where: str = "request", depth: int = 0) -> None:
    """Raise InvalidInput for a string field anywhere in ``message`` that holds a control character
    (NUL included) or more than :data:`MAX_TEXT` characters. Protobuf has already refused text that
    is not UTF-8 (the request does not parse: the decode guard's INVALID_ARGUMENT)."""
    if depth > MAX_NESTING:
        raise InvalidInput(f"{where}: messages nested deeper than {MAX_NESTING}")
    for field, value in message.ListFields():
        name = f"{where}.{field.name}" if where != "request" else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                _check_value(key_field, key, f"{name} key", depth)
                _check_value(value_field, item, f"{name}[{shown(str(key), 40)}]", depth)
        elif field.is_repeated:
            for i, item in enumerate(value):
                _check_value(field, item, f"{name}[{i}]", depth)
        else:
            _check_value(field, value, name, depth)

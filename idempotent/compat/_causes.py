"""What the drop-ins' error mappings share: which idempotent error decides the native error
a failure is shown as (:func:`idempotent.compat._kafka_errors.kafka_error_for`,
:func:`idempotent.compat.pulsar._errors._exception_for`)."""

from __future__ import annotations

from idempotent.core.outcomes import DeliveryStatus

from ..errors import DeliveryFailed


def unwrap(error: BaseException) -> tuple[BaseException, DeliveryStatus | None]:
    """``(cause, status)`` of an idempotent error: a :class:`~idempotent.errors.DeliveryFailed`
    is mapped through its cause (itself when it has none) and carries its message's status;
    any other error stands for itself and is about no one message (status None)."""
    if isinstance(error, DeliveryFailed):
        return (error if error.__cause__ is None else error.__cause__), error.status
    return error, None

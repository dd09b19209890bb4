"""The exception tree: recovery classes, codes, and pickling (Spark crosses processes)."""

from __future__ import annotations

import pickle

import attrs
import pytest

import idempotent.adapters.kafka.backend
import idempotent.adapters.pulsar.backend  # noqa: F401
import idempotent.errors as errors
from idempotent import DeliveryStatus


def all_errors() -> list[type[errors.ProducerError]]:
    out = []
    todo: list[type[errors.ProducerError]] = [errors.ProducerError]
    while todo:
        cls = todo.pop()
        # attrs' slotted classes replace the class they decorate; the replaced originals can
        # linger in __subclasses__() until collected, so keep only the module's own objects
        if getattr(errors, cls.__name__, None) is cls and cls not in out:
            out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


@pytest.mark.parametrize("cls", all_errors(), ids=lambda c: c.__name__)
def test_every_error_pickles_with_its_fields(cls: type[errors.ProducerError]) -> None:
    error = cls(f"{cls.__name__} happened")
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls and attrs.astuple(clone) == attrs.astuple(error) and str(clone) == str(error)
    assert clone.recovery is error.recovery
    assert errors.ProducerError.for_code(cls.code) is cls
    assert cls.__name__ in errors.__doc__  # drawn in the tree


def test_one_tree_in_one_module() -> None:
    """Adapters translate into the tree; they never grow it elsewhere."""
    todo: list[type[errors.ProducerError]] = [errors.ProducerError]
    while todo:
        cls = todo.pop()
        assert cls.__module__ == "idempotent.errors", f"{cls.__module__}.{cls.__qualname__} is outside the tree"
        todo.extend(cls.__subclasses__())


def test_fields_survive_pickling() -> None:
    fenced = pickle.loads(pickle.dumps(errors.ProducerFencedError("fenced", 42, 3)))
    assert (fenced.producer_id, fenced.producer_epoch) == (42, 3)
    failed = pickle.loads(
        pickle.dumps(errors.DeliveryFailed("x", DeliveryStatus.POSSIBLY_PERSISTED, errors.Recovery.BUMP_EPOCH))
    )
    assert failed.status is DeliveryStatus.POSSIBLY_PERSISTED and failed.recovery is errors.Recovery.BUMP_EPOCH


def test_recovery_classes() -> None:
    assert errors.TransportError("x").retriable
    assert errors.PartitionRecoveringError("x").retriable
    assert errors.UnknownProducerError("x").recovery is errors.Recovery.RESET_PRODUCER
    assert errors.SequenceDesyncError("x").recovery is errors.Recovery.BUMP_EPOCH
    assert errors.ProducerFencedError("x").recovery is errors.Recovery.FATAL
    assert len({c.code for c in all_errors()}) == len(all_errors())

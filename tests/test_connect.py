"""connect(): which handle serves which URL, and the options it passes on."""

from __future__ import annotations

import inspect
import uuid

import pytest

import idempotent
from idempotent.adapters import SCHEMES
from idempotent.broker.direct import DirectBroker
from idempotent.connection import ConnectOptions, ProducerConnectOptions
from idempotent.net.client import ClusterBroker, RemoteBroker


def _keyword_options(cls: type) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_the_typed_options_are_those_of_the_handles() -> None:
    """ConnectOptions lists every option of every backend and client connect() opens, and
    nothing else, so that it cannot drift from them."""
    handles: list[type] = [RemoteBroker, ClusterBroker]
    for module_name, class_name, _ in set(SCHEMES.values()):
        handles.append(getattr(__import__(module_name, fromlist=[class_name]), class_name))
    expected = set().union(*(_keyword_options(cls) for cls in handles))
    assert set(ConnectOptions.__annotations__) == expected
    assert set(ProducerConnectOptions.__annotations__) - expected == _keyword_options(DirectBroker)


def test_an_option_of_another_scheme_is_refused() -> None:
    with pytest.raises(TypeError):
        idempotent.connect(f"memory://{uuid.uuid4().hex}", token="t")

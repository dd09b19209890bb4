"""The broker shells: :class:`~idempotent.broker.broker.Broker` (the checker in front of a
backend, in this process) with its partitions, producer records, topics, settings, leases and
background loops; :class:`~idempotent.broker.direct.DirectBroker` (a producer's own broker over
a ``ProducerLog``); observers and Prometheus metrics."""

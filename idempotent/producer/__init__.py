"""The producer: :class:`~idempotent.producer.producer.Producer` (records buffered per partition,
a sender thread running the core's sequencer), its delivery futures and the asyncio producer."""

"""The consumer side: :class:`~idempotent.consumer.reader.Reader` (reading stored records and their
producer identity), state committed with the read position, and a duplicate filter."""

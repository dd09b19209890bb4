"""Drop-in producer modules for code written against confluent-kafka or pulsar-client.

Change one import line and keep the rest of the code::

    from idempotent.compat import confluent_kafka   # instead of: import confluent_kafka
    from idempotent.compat import pulsar            # instead of: import pulsar

Every record then goes through this project's broker and its sequence checker, so retries
never store a record twice. The rest of each module (consumers, admin clients, schemas, ...)
is passed through from the installed native package. What each option does here, and the few
that are refused, is listed in ``docs/migration.md``.
"""

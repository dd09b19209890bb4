"""Apache Pulsar: the log backend, a producer's own log (``ProducerLog``), the admin client and
the state topic."""

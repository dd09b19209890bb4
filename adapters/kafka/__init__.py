"""Apache Kafka: the log backend, a producer's own log (``ProducerLog``), and the write path of a
group as one Kafka transaction."""

"""The network: the broker server (``idem://``, ``idems://``) with its operations, authentication,
TLS and fair queue, and the clients that talk to it (one link, one broker, a cluster)."""

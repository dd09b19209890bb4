"""Machinery the shells share that is not a decision: the light future of the produce path,
the collector pause of bulk writes, and where the native clients' log lines go."""

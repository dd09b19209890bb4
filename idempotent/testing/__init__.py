"""Test helpers: conformance suite, fault injection and real broker services."""

"""Builds the optional compiled Kafka write path (``idempotent._kafka_write``).

Everything else is in pyproject.toml. The extension is optional: without a C compiler (or
Python's headers) the install goes on and the Kafka writers use their pure-Python path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "idempotent._kafka_write",
            sources=["idempotent/_kafka_write.c"],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
            libraries=["dl"],
            optional=True,
        )
    ]
)

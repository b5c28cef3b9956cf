"""The one part of the build that pyproject.toml cannot declare yet (setuptools calls its ext-modules table
experimental): the relay's per-chunk loop in C (src/modelrunner/_relay.c, seen from
server/native_relay.py). Optional: without a C compiler and Python's headers the install goes on and the
front relays in Python; tests/unit/test_native_relay.py then fails, so the test command cannot pass
without it."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "modelrunner._relay",
            sources=["src/modelrunner/_relay.c"],
            extra_compile_args=["-Wextra"],
            optional=True,
        )
    ]
)

"""modelrunner: a local AI model runner, wire-compatible with Docker Model Runner."""

__version__ = "0.1.0"

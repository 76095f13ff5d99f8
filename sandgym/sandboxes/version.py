"""The sandboxes package's version (what `sandgym.version` labels a sandbox with); the package
re-exports it as `sandboxes.__version__`."""

__version__ = "0.1.0"

"""The package's version, in a module of its own: the blob framing writes it into every
blob (and the model cache into its keys) without importing the package above it."""

__version__ = "0.1.0"

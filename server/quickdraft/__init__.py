"""quickdraft: local code completion over LSP, made fast by speculative decoding."""

__version__ = "0.1.0"

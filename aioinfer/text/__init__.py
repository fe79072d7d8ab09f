"""Text in and out of models: the tokenizer of a model folder (:mod:`.tokenizer`)."""

from aioinfer.text.tokenizer import Encoding, TextInput, Tokenizer

__all__ = ["Encoding", "TextInput", "Tokenizer"]

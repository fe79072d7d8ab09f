"""Text in and out of models: the tokenizer of a model folder (:mod:`.tokenizer`), chat
templates (:mod:`.chat_template`), incremental detokenizing (:mod:`.detokenize`), and text
generation over a decoder (:mod:`.generator`)."""

from aioinfer.text.chat_template import ChatTemplate
from aioinfer.text.detokenize import IncrementalDetokenizer, StopStrings
from aioinfer.text.generator import GenerationDefaults, TextChunk, TextGenerator, generate_text
from aioinfer.text.tokenizer import Encoding, TextInput, Tokenizer

__all__ = [
    "ChatTemplate",
    "Encoding",
    "GenerationDefaults",
    "IncrementalDetokenizer",
    "StopStrings",
    "TextChunk",
    "TextGenerator",
    "TextInput",
    "Tokenizer",
    "generate_text",
]

"""Tests on a local Ray cluster: aioinfer.ray."""

"""Text pipelines: embeddings and reranking from model folders, batched by tokens."""

from aioinfer.pipelines.batching import BatchStatistics, TokenBatching
from aioinfer.pipelines.embedder import TextEmbedder
from aioinfer.pipelines.reranker import RerankResult, TextReranker

__all__ = ["BatchStatistics", "RerankResult", "TextEmbedder", "TextReranker", "TokenBatching"]

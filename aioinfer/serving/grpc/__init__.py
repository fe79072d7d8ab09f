"""The gRPC transport: KServe v2 gRPC (``inference.GRPCInferenceService``) and Triton's
extensions over the model service, on ``grpcio``'s asyncio server.

- ``server.py``: the servicer (:class:`GrpcAdapter`), :class:`GrpcServer`, and
  :data:`GRPC_STATUS`, the table from each :class:`~aioinfer.errors.ErrorKind` to a
  gRPC status code;
- ``tensors.py``: tensors to and from Triton's protobuf messages;
- ``generation.py``: generation as a stream of responses, or one;
- ``extensions.py``: Triton's extensions (statistics, configuration, repository, shared
  memory) as protobuf messages;
- ``auth.py``: the API key as call metadata.
"""

from aioinfer.serving.grpc.server import GRPC_STATUS, GrpcAdapter, GrpcServer

__all__ = ["GRPC_STATUS", "GrpcAdapter", "GrpcServer"]

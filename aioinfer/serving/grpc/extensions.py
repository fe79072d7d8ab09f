"""Triton's extension RPCs over gRPC: the service's answers as protobuf messages.

Each function takes the service and the RPC's request message and returns its response
message; the work is the service's (the methods REST calls too, see
:mod:`aioinfer.serving.service`), so that both transports answer alike, with the same
refusals and messages. The model configuration and the statistics are the service's
JSON objects parsed into Triton's messages (``model_config_pb2.ModelConfig``,
``ModelStatistics``) strictly: a key that Triton's ``.proto`` does not have is a fault
here, not a field silently dropped. Tensors that name a shared-memory region are
decoded with the others (:mod:`aioinfer.serving.grpc.tensors`).

CUDA shared memory is answered as REST answers it: no region, registration refused
(aioinfer computes on the host), unregistration a no-op.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from aioinfer.errors import ModelControlError
from aioinfer.serving.control import check_no_model_files
from aioinfer.serving.service import InferenceService


async def model_config(service: InferenceService, request: Any) -> Any:
    """``ModelConfig``: the model's configuration as Triton's ``ModelConfig`` message.

    Raises:
        ServiceError: NOT_FOUND, an unknown model or version.
    """
    config = service.model_config(service.find(request.name, request.version or None))
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    return service_pb2.ModelConfigResponse(config=message)


async def model_statistics(service: InferenceService, request: Any) -> Any:
    """``ModelStatistics``: of every model (no name), of every version of one model (no
    version), or of one version.

    Raises:
        ServiceError: NOT_FOUND, an unknown model or version.
    """
    name = request.name or None
    statistics = service.statistics(name, (request.version or None) if name else None)
    return json_format.ParseDict(statistics, service_pb2.ModelStatisticsResponse())


async def repository_index(service: InferenceService, request: Any) -> Any:
    """``RepositoryIndex``: the models of the repository and their state (with
    ``ready``, the versions ready now only). The server has one repository, whatever
    ``repository_name`` says."""
    entries = service.repository_index(request.ready)
    return json_format.ParseDict({"models": entries}, service_pb2.RepositoryIndexResponse())


async def load_model(service: InferenceService, request: Any) -> Any:
    """``RepositoryModelLoad``: load or reload a model, with the config override that
    tritonclient sends as the string parameter ``config``.

    Raises:
        ModelControlError: UNAVAILABLE outside ``explicit`` mode; INVALID_ARGUMENT for
            model files in the request, a ``config`` that is not a string, or a load
            that failed (see :meth:`InferenceService.load_model`).
    """
    name = request.model_name
    parameters = request.parameters
    check_no_model_files(name, parameters)
    config = None
    if "config" in parameters:
        choice = parameters["config"].WhichOneof("parameter_choice")
        if choice != "string_param":
            raise ModelControlError(
                f"failed to load {name!r}: the 'config' parameter must be a string_param "
                f"holding JSON, got {choice or 'no value'}"
            )
        config = parameters["config"].string_param
    await service.load_model(name, config)
    return service_pb2.RepositoryModelLoadResponse()


async def unload_model(service: InferenceService, request: Any) -> Any:
    """``RepositoryModelUnload`` (``unload_dependents`` changes nothing: no model of
    aioinfer depends on another).

    Raises:
        ModelControlError: UNAVAILABLE outside ``explicit`` mode; INVALID_ARGUMENT for
            a model that is not in the repository.
    """
    await service.unload_model(request.model_name)
    return service_pb2.RepositoryModelUnloadResponse()


async def system_shared_memory_status(service: InferenceService, request: Any) -> Any:
    """``SystemSharedMemoryStatus``: every registered region (no name), or one.

    Raises:
        SharedMemoryError: no region of that name.
    """
    regions = service.system_shared_memory_status(request.name or None)
    response = service_pb2.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region["name"]].CopyFrom(
            service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region)
        )
    return response


async def system_shared_memory_register(service: InferenceService, request: Any) -> Any:
    """``SystemSharedMemoryRegister``: ``byte_size`` bytes from ``offset`` of the POSIX
    shared-memory object ``key`` as region ``name``.

    Raises:
        SharedMemoryError: as :meth:`InferenceService.register_system_shared_memory`.
    """
    service.register_system_shared_memory(
        request.name, request.key, request.offset, request.byte_size
    )
    return service_pb2.SystemSharedMemoryRegisterResponse()


async def system_shared_memory_unregister(service: InferenceService, request: Any) -> Any:
    """``SystemSharedMemoryUnregister``: one region, or every region (no name)."""
    service.unregister_system_shared_memory(request.name or None)
    return service_pb2.SystemSharedMemoryUnregisterResponse()


async def cuda_shared_memory_status(service: InferenceService, request: Any) -> Any:
    """``CudaSharedMemoryStatus``: no region.

    Raises:
        SharedMemoryError: for a region name (there is none).
    """
    service.cuda_shared_memory_status(request.name or None)
    return service_pb2.CudaSharedMemoryStatusResponse()


async def cuda_shared_memory_register(service: InferenceService, request: Any) -> Any:
    """``CudaSharedMemoryRegister``: refused.

    Raises:
        SharedMemoryError: always (INVALID_ARGUMENT, "not supported").
    """
    service.register_cuda_shared_memory(request.name)
    return service_pb2.CudaSharedMemoryRegisterResponse()


async def cuda_shared_memory_unregister(service: InferenceService, request: Any) -> Any:
    """``CudaSharedMemoryUnregister``: nothing to do."""
    service.unregister_cuda_shared_memory(request.name or None)
    return service_pb2.CudaSharedMemoryUnregisterResponse()

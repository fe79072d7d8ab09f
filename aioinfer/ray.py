"""aioinfer on Ray Serve: a model repository as a Ray Serve application.

Past one machine, aioinfer does not grow a cluster of its own: Ray Serve has replicas,
autoscaling, an HTTP proxy on every node and multi-node clusters. :func:`build_app`
turns a repository (the layout and ``config.json`` of ``aioinfer serve``) into an
application of two kinds of deployments:

- one **model deployment** per model, whose replicas each run an
  :class:`~aioinfer.serving.service.InferenceService` over that model alone: the
  compiled model with its request pool, its BATCH batching, its sequences and their
  state, its admission limits. Policy stays in the service, as for every transport.
- one **ingress** deployment running the REST adapter of ``aioinfer serve`` (the same
  Starlette app, so the same protocol, status codes and messages) over a service whose
  models are stand-ins: an inference is decoded at the ingress and forwarded, whole,
  to a replica of its model through a ``DeploymentHandle``.

A sequence keeps its state in one replica, so its requests must all reach that one:
:class:`SequenceRouter` (a Ray Serve request router) sends a request naming a
sequence to the replica that rendezvous hashing of the sequence id picks among the
current replicas, and remembers the choice while the replica lives, so that adding
replicas does not move open sequences. Other requests go to the less loaded of two
random replicas, as Ray's default router does.

A model that generates does so in each replica, in that replica's generation
scheduler; the ingress streams a generation from one replica, token by token (see
:mod:`aioinfer.ray_generation`), for the REST, gRPC and OpenAI routes alike.

A replica that dies answers its in-flight requests with UNAVAILABLE (HTTP 503, to
retry); Ray starts a new one meanwhile. A client that goes away cancels the forwarded
call, and Ray cancels it on the replica.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import ray
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import (
    LocalityMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

from aioinfer.errors import (
    RayDeploymentError,
    RayPlacementError,
    RepositoryError,
    ServiceError,
    ServingConfigError,
)
from aioinfer.generation import schedulers_of
from aioinfer.model import Port
from aioinfer.ray_generation import (
    REPLICA_GONE,
    GenerationDescription,
    RemoteGeneration,
    ReplicaGeneration,
    replica_gone,
)
from aioinfer.serving.messages import InferenceRequest, InferenceResponse, datatype
from aioinfer.serving.models import DEFAULT_MAX_SEQUENCES, SequenceFlags, ServedModel
from aioinfer.serving.repository import ModelConfig, ModelRepository
from aioinfer.serving.rest import create_app
from aioinfer.serving.server import SWITCH_INTERVAL
from aioinfer.serving.service import InferCall, InferenceService

_logger = logging.getLogger(__name__)

APP_NAME = "aioinfer"
"""The name of the Ray Serve application that :func:`run` deploys."""

DEPLOYMENT_OPTIONS = frozenset(
    {
        "num_replicas",
        "autoscaling_config",
        "max_ongoing_requests",
        "max_queued_requests",
        "ray_actor_options",
        "max_replicas_per_node",
        "graceful_shutdown_wait_loop_s",
        "graceful_shutdown_timeout_s",
        "health_check_period_s",
        "health_check_timeout_s",
        "logging_config",
        "max_constructor_retry_count",
    }
)
"""The Ray Serve deployment options a model's ``config.json`` may set under ``"ray"``."""

REPLICA_CPUS = 0.1
"""The CPUs a model replica reserves unless its config says otherwise: a share for Ray's
placement, not a limit on what it computes with. Ten replicas fit a CPU, so two models
of two replicas each fit a 2-core laptop with room to spare."""

MODEL_DEFAULTS: Mapping[str, Any] = {
    "num_replicas": 1,
    "max_ongoing_requests": 64,
    "ray_actor_options": {"num_cpus": REPLICA_CPUS},
    "logging_config": {"enable_access_log": False},
    "max_constructor_retry_count": 3,
}
"""A model deployment's options unless its config or :func:`build_app` say otherwise.
A replica reserves :data:`REPLICA_CPUS`, not Ray's whole CPU: with one CPU each, the
replicas of a small repository would not fit a small machine, and the reservation does
not limit a replica's threads anyway. Ray's own default of 5 ongoing requests per replica
would starve the BATCH device of rows; past 64 the replica's own admission
(``max_concurrency``, ``max_queue``) decides. No access log, as ``aioinfer serve`` (a
line per request costs more than a batched inference). A replica that cannot load its
model is retried 3 times, not Ray's 20: a model that does not compile will not compile on
the fourth try either."""

INGRESS_DEFAULTS: Mapping[str, Any] = {
    "num_replicas": 1,
    "max_ongoing_requests": 1024,
    "ray_actor_options": {"num_cpus": 0},
    "logging_config": {"enable_access_log": False},
}
"""The ingress's options: it decodes and forwards (no compute to reserve a CPU for), and
holds every request in flight while its replica computes."""


@dataclass(frozen=True)
class ModelDescription:
    """What a model replica tells the ingress of its model: its config, the ports of
    each version, and the generation of each version that generates."""

    config: ModelConfig
    versions: dict[str, tuple[list[Port], list[Port]]]
    """Version -> (inputs, outputs)."""
    generations: dict[str, GenerationDescription]
    """Version -> its generation, for the versions that generate."""


class ModelReplica(ReplicaGeneration):
    """A replica of one model's deployment: an inference service over that model alone
    (the versions its version policy serves), loaded in the constructor and drained when
    Ray stops the replica. A model that generates has its generation scheduler here;
    the ingress streams generations with :meth:`generate` and :meth:`generate_text`.

    Args:
        source: the repository directory (the same path on every node).
        model: the model's name in it.
        max_request_bytes, max_sequences, drain_timeout, memory_budget: as for
            :class:`~aioinfer.serving.service.InferenceService` (each replica has its
            own memory budget: its model is refused if it alone does not fit).
    """

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits it
        self,
        source: str,
        model: str,
        max_request_bytes: int = 64 * 2**20,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        drain_timeout: float = 30.0,
        memory_budget: int | str | None = None,
    ) -> None:
        repository = ModelRepository(source)
        repository.models = {model: repository.models[model]}
        self.name = model
        self.service = InferenceService(
            repository,
            max_request_bytes=max_request_bytes,
            max_sequences=max_sequences,
            drain_timeout=drain_timeout,
            memory_budget=memory_budget,
        )
        # The replica's process is the model's alone: the settings of ``aioinfer serve``.
        sys.setswitchinterval(SWITCH_INTERVAL)
        self._stop = asyncio.Event()
        loaded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lifespan = asyncio.ensure_future(self._run(loaded))
        await loaded
        gc.collect()
        gc.freeze()

    async def _run(self, loaded: asyncio.Future[None]) -> None:
        # The service's lifespan (a task group) must end in the task it began in.
        try:
            async with self.service.lifespan():
                if self.name not in self.service.models:  # over its budget: say why
                    await self.service.manager.acquire(self.name)
                loaded.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not loaded.done():
                loaded.set_exception(exc)
            raise

    async def __del__(self) -> None:
        """Ray stops the replica: drain the in-flight inferences, close the model."""
        self._stop.set()
        await self._lifespan

    def describe(self) -> ModelDescription:
        """The model's config, the ports of each version, its generations."""
        versions = self.service.models[self.name]
        return ModelDescription(
            versions[max(versions, key=int)].config,
            {v: (list(m.inputs), list(m.outputs)) for v, m in versions.items()},
            self.describe_generations(),
        )

    async def infer(
        self, request: InferenceRequest, version: str | None, sequence_key: str | None = None
    ) -> InferenceResponse | ServiceError:
        """Run ``request`` on the model at ``version`` (None: the latest). A refusal or
        failure comes back as the :class:`ServiceError` (a value: Ray would wrap a raised
        one with its traceback). ``sequence_key`` is :class:`SequenceRouter`'s."""
        try:
            return await self.service.infer(self.name, version, request)
        except ServiceError as exc:
            return exc

    def status(self) -> dict[str, Any]:
        """The replica's process id, its open sequences, its infer requests so far and
        in flight, its generations with a place in the running batch (the
        ``aioinfer:num_requests_running`` gauge of ``aioinfer serve``) and the tokens
        they generated so far."""
        models = self.service.models.get(self.name, {}).values()  # idle: unloaded
        figures = [metrics for _, metrics in self.service.metrics.figures()]
        counts = [s.counts() for model in models for s in schedulers_of(model.compiled)]
        return {
            "pid": os.getpid(),
            "sequences": sum(len(model.sequences) for model in models),
            "requests": sum(metrics.requests for metrics in figures),
            "in_flight": sum(metrics.in_flight for metrics in figures),
            "running_generations": sum(c.running for c in counts),
            "generated_tokens": sum(c.generated_tokens for c in counts),
        }


class SequenceRouter(LocalityMixin, RequestRouter):
    """Routes the calls of a model deployment: a call that names a sequence
    (``sequence_key``) to the replica holding it, any other to the less loaded of two
    random replicas, preferring the caller's node as Ray's default router does.

    A sequence's replica is the one of highest ``hash(key, replica id)`` among the
    replicas at its first request (rendezvous hashing: every ingress replica picks the
    same one, and a replica that dies moves only its own sequences), remembered until
    that replica is gone. A sequence whose replica died reaches another, which does not
    know it and answers that it is not active. A call waits (Ray backs off and asks
    again) while its replica has no room.
    """

    MAX_REMEMBERED = 100_000
    """Sequences whose replica is remembered (the least recently used are forgotten)."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._chosen: OrderedDict[str, str] = OrderedDict()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = None if pending_request is None else pending_request.kwargs.get("sequence_key")
        if key is None or pending_request is None:
            local = self.apply_locality_routing(pending_request)
            candidates = [r for r in candidate_replicas if r.replica_id in local]
            return [random.sample(candidates, min(2, len(candidates)))]
        # One replica only, every time: back off between tries (Ray's loop spins
        # without a pause unless told to).
        pending_request.routing_context.should_backoff = True
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        chosen = self._chosen.get(key)
        if chosen is None or chosen not in by_id:
            chosen = max(by_id, key=functools.partial(_weight, key))
        self._chosen[key] = chosen
        self._chosen.move_to_end(key)
        if len(self._chosen) > self.MAX_REMEMBERED:
            self._chosen.popitem(last=False)
        return [[by_id[chosen]]]


def _weight(key: str, replica: str) -> bytes:
    # Not hash(): it differs between processes, and every ingress must agree.
    return hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()


class RemoteModel(ServedModel):
    """A model version as the ingress knows it: its ports and config; its inferences go
    to the replicas of its deployment (:class:`RemoteCall`), which admit them."""

    def __init__(
        self,
        name: str,
        version: str,
        ports: tuple[list[Port], list[Port]],
        config: ModelConfig,
        handle: DeploymentHandle,
    ) -> None:
        # Not ServedModel's constructor: there is no compiled model here.
        self.name = name
        self.version = version
        self.config = config
        self.handle = handle.options(method_name="infer")
        """The handle that calls the replicas' :meth:`ModelReplica.infer` (made once:
        ``handle.infer`` would make a new one per request)."""
        self._ports = ports
        self.output_names = [port.name for port in ports[1]]
        self.input_datatypes = {port.name: datatype(port.dtype) for port in ports[0]}

    @property
    def inputs(self) -> list[Any]:
        return self._ports[0]

    @property
    def outputs(self) -> list[Any]:
        return self._ports[1]

    def ready(self) -> bool:
        return True

    def batch_sizes(self) -> dict[int, int]:
        return {}  # batches are the replicas'

    def check_admission(self) -> None:
        pass  # the replica admits

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[float]:
        yield 0.0  # the replica holds one for the generation


class RemoteCall(InferCall):
    """An infer request at the ingress: counted there, run on a replica."""

    __slots__ = ()

    async def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Forward ``request`` to a replica of its model (the one holding its sequence).

        Raises:
            ServiceError: the replica's; UNAVAILABLE when the replica went away (its
                process died: retry) or Ray could not queue the call.
        """
        model = self.model
        assert isinstance(model, RemoteModel)
        sequence = SequenceFlags.from_parameters(request.parameters)
        key = None if sequence is None else f"{model.version}\0{sequence.id!r}"
        try:
            answer = await model.handle.remote(request, model.version, sequence_key=key)
        except REPLICA_GONE as exc:
            raise replica_gone(model, exc) from exc
        if isinstance(answer, ServiceError):
            raise answer
        self.waited = answer.queued_seconds
        return answer


class RayIngressService(InferenceService):
    """The ingress's service: the models' ports come from their replicas, and
    inferences are forwarded to them (``handles``: model name -> its deployment): a
    call is a :class:`RemoteCall`, admitted by the replica (:class:`RemoteModel` admits
    everything). A model that generates has a
    :class:`~aioinfer.ray_generation.RemoteGeneration` in :attr:`generations`, whose
    tokens and text come from a replica."""

    call_type = RemoteCall

    def __init__(
        self,
        repository: ModelRepository,
        *,
        handles: Mapping[str, DeploymentHandle],
        **options: Any,
    ) -> None:
        super().__init__(repository, **options)
        self.handles = dict(handles)

    async def load(self) -> None:
        """Ask one replica of each model for its description."""
        for name, handle in self.handles.items():
            if name not in self.models:
                description: ModelDescription = await handle.describe.remote()
                versions: dict[str, ServedModel] = {
                    version: RemoteModel(name, version, ports, description.config, handle)
                    for version, ports in description.versions.items()
                }
                self.models[name] = versions
                for version, generation in description.generations.items():
                    model = versions[version]
                    self.generations[model] = RemoteGeneration(model, generation, handle)
        self.started = True

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Describe the models; at the end, drain (the replicas close the models)."""
        self.closing = False
        await self.load()
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await self.drain()
            self.models.clear()
            self.generations.clear()
            self.started = False


@serve.ingress()
class Ingress:
    """The ingress deployment: the REST app of ``aioinfer serve`` over a
    :class:`RayIngressService` (``handles``: model name -> its deployment)."""

    def __init__(
        self,
        source: str,
        handles: Mapping[str, DeploymentHandle],
        max_request_bytes: int = 64 * 2**20,
        api_key: str | None = None,
        public_metrics: bool = False,
    ) -> None:
        repository = ModelRepository(source)
        repository.models = {name: repository.models[name] for name in handles}
        self._app = create_app(
            repository,
            max_request_bytes=max_request_bytes,
            api_key=api_key,
            public_metrics=public_metrics,
            service_type=functools.partial(RayIngressService, handles=handles),
        )

    def __serve_build_asgi_app__(self) -> Any:
        return self._app


def deployment_options(
    name: str,
    config: ModelConfig,
    override: Mapping[str, Any] | None = None,
    num_replicas: int | None = None,
) -> dict[str, Any]:
    """The Ray Serve options of model ``name``'s deployment: :data:`MODEL_DEFAULTS`,
    then its config's ``"ray"``, then ``override``, then ``num_replicas`` (which
    replaces autoscaling). ``ray_actor_options`` merge key by key: a config that sets
    ``num_gpus`` keeps the default ``num_cpus``.

    Raises:
        RepositoryError: the config sets an option not in :data:`DEPLOYMENT_OPTIONS`, or
            ``ray_actor_options`` that are not a mapping.
        ServingConfigError: so does ``override``.
    """
    actor_options = dict(MODEL_DEFAULTS["ray_actor_options"])
    for where, values, error in (
        (f"model {name!r}: config.json 'ray'", config.ray, RepositoryError),
        (f"model {name!r}: the options given", override or {}, ServingConfigError),
    ):
        unknown = sorted(set(values) - DEPLOYMENT_OPTIONS)
        if unknown:
            known = ", ".join(sorted(DEPLOYMENT_OPTIONS))
            raise error(f"{where}: unknown Ray Serve option(s) {unknown}; known: {known}")
        given = values.get("ray_actor_options", {})
        if not isinstance(given, Mapping):
            raise error(f"{where}: 'ray_actor_options' must be a mapping, got {given!r}")
        actor_options.update(given)
    options = {**MODEL_DEFAULTS, **config.ray, **(override or {})}
    options["ray_actor_options"] = actor_options
    if "autoscaling_config" in options and "num_replicas" not in {**config.ray, **(override or {})}:
        del options["num_replicas"]  # Ray refuses both
    if num_replicas is not None:
        options["num_replicas"] = num_replicas
        options.pop("autoscaling_config", None)
    return options


def _plan(
    source: str | Path,
    num_replicas: int | None,
    options: Mapping[str, Mapping[str, Any]] | None,
    ingress_options: Mapping[str, Any] | None,
) -> tuple[ModelRepository, dict[str, dict[str, Any]], dict[str, Any]]:
    """The repository, each model's deployment options (by model name) and the
    ingress's: what :func:`build_app` deploys (its errors)."""
    repository = ModelRepository(Path(source).resolve())
    if repository.path.is_file():
        raise RepositoryError(
            f"{str(repository.path)!r}: Ray Serve needs a repository directory "
            "(<repo>/<model>/<version>/model.onnx), not a single file"
        )
    unknown = sorted(set(options or {}) - set(repository.models))
    if unknown:
        raise ServingConfigError(f"options given for unknown model(s) {unknown}")
    if num_replicas is not None and num_replicas < 1:
        raise ServingConfigError(f"num_replicas must be at least 1, got {num_replicas}")
    models = {
        name: deployment_options(name, entry.config, (options or {}).get(name), num_replicas)
        for name, entry in repository.models.items()
    }
    return repository, models, {**INGRESS_DEFAULTS, **(ingress_options or {})}


def build_app(
    source: str | Path,
    *,
    num_replicas: int | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    ingress_options: Mapping[str, Any] | None = None,
    max_request_bytes: int = 64 * 2**20,
    max_sequences: int = DEFAULT_MAX_SEQUENCES,
    drain_timeout: float = 30.0,
    api_key: str | None = None,
    public_metrics: bool = False,
    memory_budget: int | str | None = None,
) -> serve.Application:
    """The Ray Serve application serving the repository ``source`` over the Open
    Inference Protocol (REST), as ``aioinfer serve`` does: ``serve.run(build_app(...))``.

    One deployment per model (named ``model:<name>``), its options from
    :func:`deployment_options` (``options``: model name -> options overriding its
    config's; ``num_replicas`` for every model), and an ingress deployment
    (``ingress_options`` over :data:`INGRESS_DEFAULTS`). The repository must be at the
    same path on every node that runs a replica. ``max_request_bytes``,
    ``max_sequences``, ``drain_timeout``, ``api_key`` and ``public_metrics`` are those
    of :func:`~aioinfer.serving.create_app`; ``memory_budget`` is each model replica's
    own (a replica serves one model: one that alone passes it is refused).

    Raises:
        RepositoryError: the repository or a config file is invalid.
        ServingConfigError: ``options`` names a model not in the repository or an
            unknown option; ``num_replicas`` below 1.
    """
    repository, model_options, ingress = _plan(source, num_replicas, options, ingress_options)
    path = str(repository.path)
    # By import path: Ray imports the router in each process that calls the deployment.
    router = {"request_router_class": f"{__name__}.{SequenceRouter.__name__}"}
    models = {}
    for name, deployment_kwargs in model_options.items():
        deployment = serve.deployment(
            name=f"model:{name}", request_router_config=router, **deployment_kwargs
        )(ModelReplica)
        models[name] = deployment.bind(
            path, name, max_request_bytes, max_sequences, drain_timeout, memory_budget
        )
    return serve.deployment(name="ingress", **ingress)(Ingress).bind(
        path, models, max_request_bytes, api_key, public_metrics
    )


@dataclass(frozen=True)
class ReplicaDemand:
    """What a deployment asks of the cluster: its replicas at the start and the
    resources each reserves (Ray's names: ``CPU``, ``GPU``, ``memory`` in bytes, custom
    resources)."""

    deployment: str
    """Who asks, for a message: ``model 'mlp'``, ``the ingress``."""
    replicas: int
    resources: Mapping[str, float]

    @classmethod
    def of(cls, deployment: str, options: Mapping[str, Any]) -> ReplicaDemand:
        """The demand of a deployment with these Ray Serve ``options``."""
        actor = options.get("ray_actor_options") or {}
        cpus = actor.get("num_cpus")
        resources = {
            "CPU": 1.0 if cpus is None else cpus,  # Ray Serve's default for a replica
            "GPU": actor.get("num_gpus") or 0,
            "memory": actor.get("memory") or 0,
            **(actor.get("resources") or {}),
        }
        replicas = options.get("num_replicas", "auto")
        if replicas == "auto":  # autoscaling: the replicas it starts with
            autoscaling = options.get("autoscaling_config") or {}
            if not isinstance(autoscaling, Mapping):  # an AutoscalingConfig
                autoscaling = {
                    key: getattr(autoscaling, key) for key in ("initial_replicas", "min_replicas")
                }
            replicas = autoscaling.get("initial_replicas")
            if replicas is None:
                replicas = autoscaling.get("min_replicas", 1)
        return cls(deployment, int(replicas), {k: float(v) for k, v in resources.items() if v})


_SLACK = 1e-6
"""Ray counts resources in ten-thousandths: a sum of fractions may round past a whole."""


def placement_problems(
    demands: Sequence[ReplicaDemand], nodes: Sequence[Mapping[str, float]]
) -> list[str]:
    """Why the replicas of ``demands`` cannot all be placed on a cluster of ``nodes``
    (each node's total resources), one sentence each; empty if they fit. A replica that
    asks for more of a resource than any one node has can never start; otherwise the
    replicas together must not ask for more than the cluster has."""
    problems = []
    too_large = set()
    for demand in demands:
        for resource, amount in demand.resources.items():
            largest = max((node.get(resource, 0.0) for node in nodes), default=0.0)
            if amount > largest + _SLACK:
                too_large.add(resource)
                problems.append(
                    f"{demand.deployment} asks for {_amount(resource, amount)} per replica, "
                    f"more than any node of the cluster has (the largest has "
                    f"{_amount(resource, largest)})"
                )
    for resource in sorted({r for d in demands for r in d.resources} - too_large):
        asking = [d for d in demands if d.resources.get(resource) and d.replicas]
        asked = sum(d.replicas * d.resources[resource] for d in asking)
        has = sum(node.get(resource, 0.0) for node in nodes)
        if asked > has + _SLACK:
            each = ", ".join(
                f"{d.deployment}: {d.replicas} x {_amount(resource, d.resources[resource])}"
                for d in asking
            )
            problems.append(
                f"the replicas ask for {_amount(resource, asked)} in all ({each}), and the "
                f"cluster has {_amount(resource, has)}"
            )
    return problems


def _amount(resource: str, amount: float) -> str:
    if resource == "memory":
        return f"{amount / 2**30:.3g} GiB of memory"
    if resource in ("CPU", "GPU"):
        return f"{amount:g} {resource}{'' if amount == 1 else 's'}"
    return f"{amount:g} of resource {resource!r}"


PROXY_READY_VARIABLE = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
PROXY_READY_SECONDS = 60
"""How long the local Ray instance of :func:`run` gives Ray Serve's HTTP proxy to start
(Ray's default, 5 s, is too short for a loaded machine; an explicit setting wins)."""

POLL_SECONDS = 0.25
"""How often :func:`run` asks Ray Serve how the application is, and looks for a signal."""


class _StopSignals:
    """SIGTERM and SIGINT set :attr:`event` (counted in :attr:`received`) instead of
    raising wherever the main thread happens to be: :func:`run`'s loops poll it, so a
    signal stops the deployment, the serving or the shutdown's waits alike."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.received += 1
        self.event.set()

    def install(self) -> None:
        """Handle the signals here (again after ``ray.init``, which sets its own)."""
        for signum in self.SIGNALS:
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def restore(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def run(
    source: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    num_replicas: int | None = None,
    **options: Any,
) -> None:
    """Serve the repository ``source`` on Ray Serve until SIGINT/SIGTERM: ``aioinfer
    serve REPO --ray``.

    Joins the Ray cluster of ``$RAY_ADDRESS`` if set (``auto``: the one ``ray start``
    began on this machine), else starts a local Ray instance. Ray Serve's HTTP proxy
    listens on ``host``:``port``, unless Serve already runs on the cluster (its proxy
    then keeps its own). ``options`` go to :func:`build_app`.

    On the local instance, replicas that ask for more than the machine has are refused
    before anything is deployed; on a cluster that is joined (which an autoscaler may
    grow), they are reported and waited for. The application is announced once all
    its deployments run. SIGTERM or SIGINT, whenever it comes, stops it: the
    application is deleted (its replicas drain their in-flight inferences, a second
    signal cuts that short), and a local Ray instance is shut down with every process
    it started.

    Raises:
        The errors of :func:`build_app`.
        RayPlacementError: the local instance lacks what the replicas ask for.
        RayDeploymentError: a replica could not load its model (after Ray's retries).
    """
    repository, model_options, ingress = _plan(
        source, num_replicas, options.get("options"), options.get("ingress_options")
    )
    demands = [ReplicaDemand.of(f"model {name!r}", o) for name, o in model_options.items()]
    demands.append(ReplicaDemand.of("the ingress", ingress))
    app = build_app(source, num_replicas=num_replicas, **options)
    address = os.environ.get("RAY_ADDRESS") or None
    stop = _StopSignals()
    stop.install()  # a signal during ray.init stops run once Ray has started
    running = False
    try:
        if address is None:
            # Ray Serve kills an HTTP proxy not ready within 5 s, which a loaded machine
            # can take to start its process; the local instance inherits this environment.
            os.environ.setdefault(PROXY_READY_VARIABLE, str(PROXY_READY_SECONDS))
            ray.init(address="local", include_dashboard=False)
        else:
            ray.init(address=address)
        stop.install()  # ray.init set its own SIGTERM handler (it raises SystemExit)
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        problems = placement_problems(demands, nodes)
        if problems and address is None:
            raise RayPlacementError(
                f"the replicas of {str(repository.path)!r} do not fit the local Ray instance: "
                + "; ".join(problems)
                + ". Ask for less in the models' config.json ('ray': 'ray_actor_options'), "
                "or serve on a larger cluster ($RAY_ADDRESS)"
            )
        for problem in problems:
            _logger.warning("waiting for the cluster to grow: %s", problem)
        if stop.event.is_set():
            return
        serve.start(http_options={"host": host, "port": port})
        serve.run_many(
            [serve.RunTarget(app, name=APP_NAME, route_prefix="/")],
            wait_for_ingress_deployment_creation=False,
            wait_for_applications_running=False,
        )
        running = _wait_until_running(stop)
        if running:
            _logger.warning("aioinfer serving on Ray Serve at http://%s:%d", host, port)
            stop.event.wait()
    finally:
        try:
            if ray.is_initialized():
                _shutdown(
                    stop,
                    local=address is None,
                    drain=running,
                    wait=options.get("drain_timeout", 30.0) + DELETE_MARGIN_SECONDS,
                )
        finally:
            stop.restore()


DELETE_MARGIN_SECONDS = 10.0
"""How much longer than the replicas' drain :func:`run` waits for Ray Serve to delete the
application (Ray's own steps: stopping the replicas, the routes)."""


def _wait_until_running(stop: _StopSignals) -> bool:
    """Wait until the application runs (True) or a signal comes (False).

    Raises:
        RayDeploymentError: a deployment failed.
    """
    while not stop.event.wait(POLL_SECONDS):
        application = serve.status().applications.get(APP_NAME)
        if application is None:
            continue  # not yet known to the controller
        if application.status == "RUNNING":
            return True
        if application.status == "DEPLOY_FAILED":
            raise RayDeploymentError(_deployment_failure(application))
    return False


def _shutdown(stop: _StopSignals, *, local: bool, drain: bool, wait: float) -> None:
    """Delete the application and, if ``local``, shut the Ray instance down.

    The application is deleted, waiting up to ``wait`` seconds (a second signal ends the
    wait), when it has inferences to drain (``drain``) or lives on a cluster that stays.
    A local instance that was still deploying is shut down at once: its processes go
    with it, the replicas being deployed included.
    """
    if drain or not local:
        try:
            serve.delete(APP_NAME, _blocking=False)
            received = stop.received
            deadline = time.monotonic() + wait
            while APP_NAME in serve.status().applications:
                if time.monotonic() > deadline or stop.received > received:
                    _logger.warning("stopped waiting for Ray Serve to delete the application")
                    break
                stop.event.wait(POLL_SECONDS)
        except ray.exceptions.RayError as exc:  # Serve's controller is gone
            _logger.warning("could not delete the Ray Serve application: %s", exc)
    ray.shutdown()


def _deployment_failure(application: Any) -> str:
    """What failed in the application's deployments: each unhealthy one and the last
    line of its message (the exception that stopped its replicas)."""
    failures = []
    for name, deployment in application.deployments.items():
        lines = [line.strip() for line in deployment.message.splitlines() if line.strip()]
        if deployment.status in ("DEPLOY_FAILED", "UNHEALTHY") and lines:
            failures.append(f"deployment {name!r}: {lines[-1]}")
    return "; ".join(failures) or application.message

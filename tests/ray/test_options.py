"""Deployment options from ``config.json`` and arguments (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from aioinfer.errors import RepositoryError, ServingConfigError
from aioinfer.ray import (
    INGRESS_DEFAULTS,
    MODEL_DEFAULTS,
    ReplicaDemand,
    build_app,
    deployment_options,
    placement_problems,
)
from aioinfer.serving.repository import ModelConfig
from tests.helpers import mlp_model
from tests.serving.conftest import write_config, write_model

AUTOSCALING = {"min_replicas": 1, "max_replicas": 4}


def test_defaults_then_config_then_arguments():
    config = ModelConfig(ray={"num_replicas": 3, "max_ongoing_requests": 8})
    options = deployment_options("m", config)
    assert options == {**MODEL_DEFAULTS, "num_replicas": 3, "max_ongoing_requests": 8}
    options = deployment_options("m", config, {"max_ongoing_requests": 16}, num_replicas=2)
    assert (options["num_replicas"], options["max_ongoing_requests"]) == (2, 16)


def test_autoscaling_replaces_the_default_replica_count_and_num_replicas_replaces_it():
    config = ModelConfig(ray={"autoscaling_config": AUTOSCALING})
    options = deployment_options("m", config)
    assert options["autoscaling_config"] == AUTOSCALING and "num_replicas" not in options
    options = deployment_options("m", config, num_replicas=2)
    assert options["num_replicas"] == 2 and "autoscaling_config" not in options


def test_unknown_options_are_refused_naming_where(tmp_path):
    with pytest.raises(RepositoryError, match=r"model 'm': config.json 'ray'.*\['replicas'\]"):
        deployment_options("m", ModelConfig(ray={"replicas": 2}))
    with pytest.raises(ServingConfigError, match=r"the options given.*\['cpus'\]"):
        deployment_options("m", ModelConfig(), {"cpus": 1})
    write_model(tmp_path, "mlp", 1, mlp_model())
    write_config(tmp_path, "mlp", {"ray": {"num_replicas": 2, "gpus": 1}})
    with pytest.raises(RepositoryError, match=r"\['gpus'\]; known: autoscaling_config"):
        build_app(tmp_path)


def test_build_app_refuses_what_it_cannot_deploy(tmp_path):
    write_model(tmp_path, "mlp", 1, mlp_model())
    with pytest.raises(ServingConfigError, match=r"unknown model\(s\) \['nope'\]"):
        build_app(tmp_path, options={"nope": {}})
    with pytest.raises(ServingConfigError, match="num_replicas must be at least 1, got 0"):
        build_app(tmp_path, num_replicas=0)
    with pytest.raises(RepositoryError, match="not a single file"):
        build_app(tmp_path / "mlp" / "1" / "model.onnx")
    write_config(tmp_path, "mlp", {"ray": "two"})
    with pytest.raises(RepositoryError, match="'ray' must be dict, got 'two'"):
        build_app(tmp_path)


def test_a_replica_reserves_a_tenth_of_a_cpu_unless_its_config_says_otherwise():
    assert deployment_options("m", ModelConfig())["ray_actor_options"] == {"num_cpus": 0.1}
    config = ModelConfig(ray={"ray_actor_options": {"num_gpus": 1}})
    actor = deployment_options("m", config, {"ray_actor_options": {"memory": 2**30}})
    assert actor["ray_actor_options"] == {"num_cpus": 0.1, "num_gpus": 1, "memory": 2**30}
    with pytest.raises(RepositoryError, match="'ray_actor_options' must be a mapping, got 2"):
        deployment_options("m", ModelConfig(ray={"ray_actor_options": 2}))


def test_two_models_of_two_replicas_fit_two_cpus_by_default():
    demands = [
        ReplicaDemand.of(f"model {name!r}", deployment_options(name, ModelConfig(), None, 2))
        for name in ("a", "b")
    ]
    demands.append(ReplicaDemand.of("the ingress", INGRESS_DEFAULTS))
    assert [d.resources for d in demands] == [{"CPU": 0.1}, {"CPU": 0.1}, {}]
    assert placement_problems(demands, [{"CPU": 2.0, "memory": 2.0**33}]) == []


def test_placement_problems_name_the_model_what_it_asks_and_what_the_cluster_has():
    big = ReplicaDemand.of("model 'big'", {"num_replicas": 1, "ray_actor_options": {"num_cpus": 8}})
    gpu = ReplicaDemand.of("model 'gpu'", {"ray_actor_options": {"num_cpus": 0, "num_gpus": 1}})
    assert placement_problems([big, gpu], [{"CPU": 2.0}, {"CPU": 4.0}]) == [
        "model 'big' asks for 8 CPUs per replica, more than any node of the cluster has "
        "(the largest has 4 CPUs)",
        "model 'gpu' asks for 1 GPU per replica, more than any node of the cluster has "
        "(the largest has 0 GPUs)",
    ]
    # Each fits a node, all of them do not fit the cluster.
    one = ReplicaDemand.of("model 'a'", {"num_replicas": 2, "ray_actor_options": {}})
    autoscaled = {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 3}}
    three = ReplicaDemand.of("model 'b'", {**autoscaled, "ray_actor_options": {"num_cpus": 0.5}})
    assert (one.replicas, one.resources, three.replicas) == (2, {"CPU": 1.0}, 3)
    assert placement_problems([one, three], [{"CPU": 2.0}]) == [
        "the replicas ask for 3.5 CPUs in all (model 'a': 2 x 1 CPU, model 'b': 3 x 0.5 "
        "CPUs), and the cluster has 2 CPUs"
    ]

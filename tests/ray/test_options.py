"""Deployment options from ``config.json`` and arguments (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from aioinfer.errors import RepositoryError, ServingConfigError
from aioinfer.ray import MODEL_DEFAULTS, build_app, deployment_options
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

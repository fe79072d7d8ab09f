"""An example aioinfer device, ``TWOSTAGE``: host-side staging and compute, pipelined.

Install it (``pip install -e examples/custom_device``) and
``aioinfer.Core().compile_model(model, "TWOSTAGE")`` finds it through the
``aioinfer.plugins`` entry point.
"""

from aioinfer_twostage.plugin import TwoStageCompiledModel, TwoStagePlugin
from aioinfer_twostage.request import TwoStageInferRequest

__all__ = ["TwoStageCompiledModel", "TwoStageInferRequest", "TwoStagePlugin"]

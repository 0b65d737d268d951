"""Performance model: hardware and model catalogs, step-time roofline, calibration to profiles."""

from tokenomy.perf.coefficients import Coefficients, load_coefficients, shipped_coefficients
from tokenomy.perf.hardware import GPUSpec, get_gpu, gpu_names, load_gpu_catalog
from tokenomy.perf.hf_config import load_hf_config
from tokenomy.perf.model import PerfModel
from tokenomy.perf.model_spec import ModelSpec
from tokenomy.perf.models import get_model, model_names

__all__ = [
    "Coefficients",
    "GPUSpec",
    "ModelSpec",
    "PerfModel",
    "get_gpu",
    "get_model",
    "gpu_names",
    "load_coefficients",
    "load_gpu_catalog",
    "load_hf_config",
    "model_names",
    "shipped_coefficients",
]

"""Recommend the cheapest offer × GPU count × parallelism that meets a deadline (pure).

Imports only ``perfmodel`` types and the catalog schema: no MLflow, torch, HTTP or files.

    rec = recommend(predictor, workload, catalog.offers, catalog.gpus, Target(2e9, 24.0),
                    hardware_for=lambda spec, offer: hardware_for_gpu(
                        spec, gpus_per_node=offer.gpu_count, offer=offer))
"""

from mlflow_gpuopt.recommend.offers import NoOffersError, allowed_precisions, filter_offers
from mlflow_gpuopt.recommend.ranking import pareto_front
from mlflow_gpuopt.recommend.search import LARGE_MODEL_PARAMS, recommend
from mlflow_gpuopt.recommend.serialize import CANDIDATE_KEYS, recommendation_dict
from mlflow_gpuopt.recommend.types import (
    Candidate,
    Costing,
    Recommendation,
    ScalingPoint,
    SearchSpace,
    Target,
)

Plan = Candidate  # the name the documented contract uses for one ranked option

__all__ = [
    "CANDIDATE_KEYS", "Candidate", "Costing", "LARGE_MODEL_PARAMS", "NoOffersError", "Plan",
    "Recommendation", "ScalingPoint", "SearchSpace", "Target", "allowed_precisions",
    "filter_offers", "pareto_front", "recommend", "recommendation_dict",
]

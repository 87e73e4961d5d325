"""Charts (PNG, drawn with Pillow) and the self-contained HTML report of a recommendation."""

from mlflow_gpuopt.report.charts import pareto_png, scaling_png
from mlflow_gpuopt.report.html import render_html

__all__ = ["pareto_png", "render_html", "scaling_png"]

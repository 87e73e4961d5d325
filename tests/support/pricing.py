"""What the pricing tests share: the recorded provider answers and fake API keys."""

from __future__ import annotations

from pathlib import Path

#: Recorded answers of the providers' price APIs (tests/fixtures/pricing/).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pricing"
#: Fake keys: a test asserts they never reach output, logs or URLs.
FAKE_GCP_KEY = "FAKE-gcp-key-0000-not-real"
FAKE_LAMBDA_KEY = "FAKE_lambda_secret_0000_not_real"
#: The environment a user may set that would point a refresh elsewhere or age the prices.
USER_OVERRIDES = ("GPUOPT_AWS_PRICING_URL", "GPUOPT_GCP_BILLING_URL", "GPUOPT_LAMBDA_API_URL",
                  "GPUOPT_AZURE_PRICES_URL", "GPUOPT_PRICING_MAX_AGE_DAYS")

"""hypothesis profiles: "ci" (derandomized, bounded: minutes on 2 cores), "dev" (default), "thorough".
Select one with HYPOTHESIS_PROFILE=name; tests/conftest.py loads them."""
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def register() -> None:
    settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=True, **_COMMON)
    settings.register_profile("dev", max_examples=40, **_COMMON)
    settings.register_profile("thorough", max_examples=1000, **_COMMON)

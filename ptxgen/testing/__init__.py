"""Test support shared by ptxgen's own tests and by kernel tests downstream: hypothesis strategies and
profiles. Needs hypothesis (the `test` extra)."""

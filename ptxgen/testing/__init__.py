"""Test support shared by ptxgen's own tests and by kernel tests downstream: hypothesis strategies and
profiles (hypothesis: the `test` extra), and NumPy-only random blocks (blocks.py)."""

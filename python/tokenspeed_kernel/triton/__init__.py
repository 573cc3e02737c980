"""Triton fallbacks (run on the CPU under TRITON_INTERPRET=1 in CI)."""

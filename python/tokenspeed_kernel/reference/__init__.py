"""Plain-PyTorch references: the executable spec every backend is tested against."""

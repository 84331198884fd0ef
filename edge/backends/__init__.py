"""Backends: weight stores that run `dual_plane_linear` for the decoder (torch reference now; cpu, triton and
tensorrt behind the same interface)."""

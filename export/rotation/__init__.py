"""Rotations of the export: the plan of which rotations a model gets (`plan`), the transforms (`ops`: Hadamard
factors, fused and online rotations) and the learned rotation (`learned`)."""

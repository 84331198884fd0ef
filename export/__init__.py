"""Host-side export: model sources, rotations, GPTQ, nesting, checkpoint writer and the export command."""

"""The decoder step's custom ONNX ops: their schemas (`schemas`) and their onnxruntime kernels (`ort_ops`), both
with the semantics of plugins.reference."""

"""The decoder step as an ONNX graph: the export (`graph`), its shared functions (`functions`) and the embedding
rows gathered from the nested planes' int32 words (`rows`)."""

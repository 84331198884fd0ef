"""The TensorRT 10.3 plugins (`plugins`: the dual-plane GEMV and the nested-KV attention as Python IPluginV3 classes
over the Triton kernels), a stand-in of TensorRT 10.3's Python plugin API for machines without TensorRT
(`standin`), and the harness that plays 10.3's call order on the plugins over it (`conformance`)."""

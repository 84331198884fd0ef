"""Copies of the KV planes in TensorRT's verbose build log (export.trt.log): the layer kinds TensorRT names when it
inserts a copy or reformat, matched only where a plane tensor or an attention node's plane input / output is
involved. Lines quoted verbatim are TensorRT's own, as posted in NVIDIA/TensorRT issue #4397 (10.10, verbose "Engine
Layer Information") and dusty-nv/jetson-inference issue #1630 (the optimizer's "Generating copy"); the plane lines
are those formats with the step graph's tensor and node names."""

from export.trt.log import capturing_logger, plane_copies
from plugins.trt import standin as trt_standin

RECORDED = [   # TensorRT's own lines: copies, but of no KV plane
    "Layer(Reformat): Reformatting CopyNode for Output Tensor 0 to {ForeignNode[/encoder/Unsqueeze_3 + "
    "/encoder/Unsqueeze_4.../match_model/Squeeze]}, Tactic: 0x0000000000000000, Reformatted Output Tensor 0 to "
    "{ForeignNode[/encoder/Unsqueeze_3 + /encoder/Unsqueeze_4.../match_model/Squeeze]} (Half[1]) -> score (Float[1])",
    "Generating copy for inception_5b/1x1 + inception_5b/relu_1x1 || inception_5b/3x3_reduce + "
    "inception_5b/relu_3x3_reduce || inception_5b/5x5_reduce + inception_5b/relu_5x5_reduce to inception_5b/output "
    "because input is not movable.",
]
ATTENTION = "NestedKvAttention_7"
PLANES = [
    f"Layer(Reformat): Reformatting CopyNode for Input Tensor 3 to {ATTENTION}, Tactic: 0x0000000000000000, "
    f"kv_base.0 (Int32[2,3,2048,8]) -> Reformatted Input Tensor 3 to {ATTENTION} (Int32[2,3,2048,8])",
    "Generating copy for kv_scale.1 to kv_scale_out.1 because input is not movable.",
    f"Reformatting CopyNode for Output Tensor 2 to {ATTENTION}",
    "Name: copy_kv_refine.12, LayerType: Copy, Inputs: [ { Name: kv_refine.12, Dimensions: [2,3,2048,8] } ]",
]
NOT_COPIES = [
    f"Layer(PluginV3): {ATTENTION}, Tactic: 0x0000000000000000, q (Float[9,5,64]), kv_base.0 (Int32[2,3,2048,8]) "
    "-> out (Float[9,5,64]), kv_base_out.0 (Int32[2,3,2048,8])",                       # the plugin itself
    f"Reformatting CopyNode for Input Tensor 0 to {ATTENTION}",                          # its queries, not a plane
    "Layer(Reformat): Reformatting CopyNode for Input Tensor 0 to /lm_head, kv_base_x.1 (Int32[4]) -> y (Int32[4])",
]


def test_plane_copies_are_found_and_nothing_else():
    got = plane_copies(RECORDED + PLANES + NOT_COPIES, [ATTENTION])
    assert got == PLANES


def test_the_capturing_logger_keeps_copy_lines_and_echoes_warnings(capsys):
    logger = capturing_logger(trt_standin)
    sev = trt_standin.ILogger.Severity
    for line in ["Tactic: 0x0000000000000003 Time: 0.00512", PLANES[1], RECORDED[0]]:
        logger.log(sev.VERBOSE, line)
    logger.log(sev.WARNING, "Plugin fields could not be serialized")
    assert logger.seen == 4 and logger.lines == [PLANES[1], RECORDED[0]]
    assert capsys.readouterr().err == "[TensorRT] Plugin fields could not be serialized\n"
    assert plane_copies(logger.lines) == [PLANES[1]]

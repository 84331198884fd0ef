"""Shape-only presets of the papers' models (no weights needed): their HF `config.json` figures as a
ModelConfig, for memory planning of models this machine cannot hold."""

from edge.model.arch import ModelConfig


def _llama(arch, hidden, inter, layers, heads, kv, vocab, max_pos, theta, bias=False, family="llama",
           tied=False) -> ModelConfig:
    return ModelConfig(architecture=arch, family=family, hidden_size=hidden, intermediate_size=inter,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=hidden // heads,
                       vocab_size=vocab, rms_norm_eps=1e-5, rope_theta=theta, tie_word_embeddings=tied,
                       attention_bias=bias, max_position_embeddings=max_pos)


MODEL_PRESETS = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (the embedded default model; docs/model-and-data.md)
    "smollm2-135m": _llama("LlamaForCausalLM", 576, 1536, 30, 9, 3, 49152, 8192, 1e5, tied=True),
    # HuggingFaceTB/SmolLM2-360M-Instruct, config.json (huggingface.co/HuggingFaceTB/SmolLM2-360M-Instruct): hidden 960,
    # intermediate 2560, 32 layers, 15 heads, 5 KV heads (head_dim 64), vocab 49152, tied, rope_theta 1e5; the
    # default model's tokenizer, so `bitnest bench --shape` feeds it real prompts
    "smollm2-360m": _llama("LlamaForCausalLM", 960, 2560, 32, 15, 5, 49152, 8192, 1e5, tied=True),
    # HuggingFaceTB/SmolLM2-1.7B-Instruct, config.json (huggingface.co/HuggingFaceTB/SmolLM2-1.7B-Instruct): hidden
    # 2048, intermediate 8192, 24 layers, 32 heads, 32 KV heads (head_dim 64), vocab 49152, tied, rope_theta 130000; the
    # same tokenizer
    "smollm2-1.7b": _llama("LlamaForCausalLM", 2048, 8192, 24, 32, 32, 49152, 8192, 130000.0, tied=True),
    # togethercomputer/LLaMA-2-7B-32K (linear RoPE scaling x8 over Llama-2-7B's 4096 positions)
    "llama-2-7b-32k": _llama("LlamaForCausalLM", 4096, 11008, 32, 32, 32, 32000, 32768, 10000.0),
    # meta-llama/Meta-Llama-3-8B
    "llama-3-8b": _llama("LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0),
    # meta-llama/Llama-3.2-3B (tied embeddings): the papers' model for the 8 GB Orin
    "llama-3.2-3b": _llama("LlamaForCausalLM", 3072, 8192, 28, 24, 8, 128256, 131072, 500000.0, tied=True),
    # Qwen2.5-Coder-0.5B-Instruct as the packaged Q4_K_M GGUF holds it (edge.model.packaged; GGUF metadata): hidden 896,
    # intermediate 4864, 24 layers, 14 heads, 2 KV heads (head_dim 64), vocab 151936, q/k/v biases, rope_theta 1e6; the
    # GGUF stores output.weight apart from token_embd (Q8_0 and Q5_0), so it loads untied
    "qwen2.5-coder-0.5b": _llama("Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 151936, 32768, 1e6, bias=True,
                                 family="qwen2"),
    # Qwen/Qwen2.5-7B (q/k/v biases)
    "qwen2.5-7b": _llama("Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 152064, 131072, 1e6, bias=True, family="qwen2"),
    # Qwen2.5-{0.5B,1.5B,3B}-Instruct, config.json (huggingface.co/Qwen): q/k/v biases, vocab 151936, rope_theta 1e6,
    # 32768 positions; head_dim 64 / 128 / 128. config.json ties the head, but the GGUFs users run store output.weight
    # apart (the packaged Coder-0.5B's, and issue 34's 1.5B), so an export from them is untied, as here.
    "qwen2.5-0.5b": _llama("Qwen2ForCausalLM", 896, 4864, 24, 14, 2, 151936, 32768, 1e6, bias=True, family="qwen2"),
    "qwen2.5-1.5b": _llama("Qwen2ForCausalLM", 1536, 8960, 28, 12, 2, 151936, 32768, 1e6, bias=True, family="qwen2"),
    "qwen2.5-3b": _llama("Qwen2ForCausalLM", 2048, 11008, 36, 16, 2, 151936, 32768, 1e6, bias=True, family="qwen2"),
    # meta-llama/Llama-3.2-1B, config.json: hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads (head_dim
    # 64), vocab 128256, tied, rope_theta 5e5
    "llama-3.2-1b": _llama("LlamaForCausalLM", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, tied=True),
}
# The shapes `bitnest bench --shape` times (issue 34: the models Orin users run, and SmolLM2's for the default model's
# tokenizer).
BENCH_SHAPES = ("smollm2-360m", "smollm2-1.7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
                "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b")

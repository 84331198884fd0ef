"""BitNest Edge device runtime: checkpoint reader, decoder, nested KV cache, backends and decoding policies."""

"""BitNest op contracts: plane packing, nesting rules, KV quantization and pure-torch references."""

"""The research and measurement tools on the host, each driven by its command (export/commands/): export variants
and their quality (`quality`), the streamed export's memory at real shapes (`export_memory`), mutated inputs at every
reader and killed exports (`fuzz_inputs`), and every GPU check in one run (`device_check`, with its `device_gptq` and
`device_plugins` sections). They sit beside the analysis code they drive (edge/analysis/) on export's top floor,
where the exporter and the commands are in reach (the fuzzer calls every command; the GPTQ section runs the export
in a child process)."""

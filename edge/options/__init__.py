"""The command line's shared vocabulary (the commands themselves live in export/commands/, one module each): argument
groups and their typed settings (`groups`: gates, adaptive speculation, the draft head, the meter, checkpoint or
--model), the options that make an LLM and the LLM they load (`llm_args`), prompts files (`prompts`), and the one-line
error runner every command's main goes through (`run`). Above the runtime: no runtime room imports it."""

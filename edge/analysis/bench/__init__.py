"""The benchmark (`bitnest bench`): each runner in its own process under a memory plan (`run`, `process`, `memory`,
`runners`), the peers it is measured against in the same run (`peers`, `llamacpp`, `synthetic_gguf`), pass times
and recorded-round replays at real models' shapes (`passes`, `replay`, `shape`) and the machine it ran on
(`machine`)."""

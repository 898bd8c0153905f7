"""The q8_1 mat-vec and MoE expert kernels (libstrata_mmvq): `policy` (rows
per warp and expert mode, a pure function) over `tables` (the measured
rows-per-warp tables), `wrapper` (load, host entry points), `parity`
(`strata-ref parity mmvq|experts`), `bench` (`strata-ref bench
mmvq|experts`)."""

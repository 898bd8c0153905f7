"""The prompt-path GEMM (libstrata_gemm, cuBLAS): `policy` (the route, a
pure function), `wrapper` (load, device and host entry points), `parity`
(`strata-ref parity gemm`), `bench` (dequant vs GEMM time per route,
`python -m strata_ref.native.gemm.bench`)."""

"""The dequant kernels (libstrata_dequant): `policy` (which kernel serves a
call, a pure function), `wrapper` (device and host entry points),
`parity` (`strata-ref parity dequant`), `bench` (bandwidth against the
device copy, `python -m strata_ref.native.dequant.bench`)."""

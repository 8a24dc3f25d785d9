"""`mooncake` for programs written against Mooncake Transfer Engine, served by connex_c: put
this directory (python/shim) on PYTHONPATH. Only `mooncake.engine` is provided."""

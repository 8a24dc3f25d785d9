"""mooncake.engine served by connex_c (connex_c/mooncake.py)."""
from connex_c.mooncake import *  # noqa: F401,F403
from connex_c.mooncake import __all__  # noqa: F401

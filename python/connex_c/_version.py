"""The one version of connex-c: the C library, its pkg-config file and this package (the
top-level CMakeLists.txt reads it from here)."""

__version__ = "0.1.0"

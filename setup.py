"""The optional C accelerator of the single-search path; everything else is in pyproject.toml.

Optional: where it cannot be built (no C compiler), the install goes on and normrank uses its Python
path, which gives the same results (normrank/_fastpath.c says why it exists)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "normrank._fastpath",
            ["normrank/_fastpath.c", "normrank/_scan_topk.c"],
            depends=["normrank/_scan_topk.h"],
            # no fused multiply-add: the C arithmetic must round as NumPy's does
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        )
    ]
)

"""basebn's custom ops, without autograd, and the one C++/CUDA library they run on.

bn_ops/ (the BN ops: kernel or pure-MegEngine fallback), conv_ops.py, pool_ops.py and matmul_ops.py (the oneDNN
conv, max-pool and matmul ops); kernel_library.py builds and loads the library from csrc/ as kernel_build.py says;
kernel_selfcheck.py checks every op against pure MegEngine, kernel_autocheck.py is its cached form in training.
The autodiff Functions and nn modules built on these ops are in :mod:`basebn.layers`; where this package sits in
the layering: docs/layout.md.
"""

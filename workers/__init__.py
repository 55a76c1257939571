"""xaudit compute side: model adapters, the masking game, attribution methods, the criterion audit.

Importing this package is cheap; heavy dependencies (torch, onnxruntime) load in submodules.
"""

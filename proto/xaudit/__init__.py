"""xaudit: audit which attribution methods allocate a model's effects correctly.

``xaudit.v1``: the generated protobuf/gRPC code of the API (from ``proto/xaudit/v1/*.proto``).
``xaudit.contract``: what every role shares (errors, names, the job spec, the tensor codec, DSSE
constants); it imports nothing else of the project. See docs/architecture.md.
"""

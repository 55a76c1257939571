"""Generated protobuf/gRPC code (python -m clients.gen_proto); do not edit."""
